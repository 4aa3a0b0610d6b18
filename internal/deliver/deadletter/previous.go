package deadletter

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// Lookup is one look-up of the version chain (docs/ordering.md, "The
// version chain: the sender's half"): which version of a stream did a
// subscription deliver before one of the stream's events, when the
// sender does not know it (the stream's first event since a partition
// was taken).
type Lookup struct {
	// Stream is the JetStream stream searched (with AllowDirect): the
	// events stream.
	Stream string
	// Subscription is the subscription's name, Filters its filters on
	// Stream.
	Subscription string
	Filters      []string
	// Key is the source stream's stream key on Stream (wire.StreamKey of
	// its subjects there), which also names its skipped versions
	// (wire.SkippedKey).
	Key string
	// From is the first sequence of Stream the subscription's events are
	// read from (0: the first); Before is the sequence of the event whose
	// predecessor is looked up.
	From, Before uint64
}

// Predecessor returns the version l.Subscription delivered of the stream
// before the event at l.Before (NoPrevious: none): the stream's last
// event in [l.From, l.Before) that one of l.Filters selects, as the
// stream's leader has it (lastVersionBefore) — every such event was
// settled before this one, delivered or dead-lettered — stepped over the
// versions skipped holds as dead-lettered and not delivered since
// (ReadSkipped, Skipped.Previous; nil skipped: none are read). Errors:
// the look-up's and the skipped record's; the caller retries (its
// stream waits).
func Predecessor(ctx context.Context, js jetstream.JetStream, skipped jetstream.KeyValue, l Lookup) (int64, error) {
	var subjects []string
	for _, f := range l.Filters {
		if s, ok := wire.IntersectFilters(f, l.Key+".*"); ok {
			subjects = append(subjects, s)
		}
	}
	v, found, err := lastVersionBefore(ctx, js, l.Stream, subjects, l.From, l.Before)
	if err != nil || !found {
		return NoPrevious, err
	}
	if skipped == nil {
		return v, nil
	}
	sk, err := ReadSkipped(ctx, skipped, l.Subscription, l.Key)
	if err != nil {
		return 0, err
	}
	return sk.Previous(v), nil
}

// lastVersionBefore returns the stream version (ce-streamversion) of the
// last message of JetStream stream name whose subject matches one of
// subjects, among sequences from (0: the first) to before-1, as the
// stream's leader has it (jsapi.LastBefore: a direct get's candidate
// confirmed by the leader, since a follower may lack the newest
// messages), and found false when there is none.
func lastVersionBefore(ctx context.Context, js jetstream.JetStream, name string, subjects []string, from, before uint64) (int64, bool, error) {
	seq, hdr, err := jsapi.LastBefore(ctx, js, name, subjects, from, before)
	if err != nil {
		return 0, false, fmt.Errorf("deadletter: look up a predecessor in %q: %w", name, err)
	}
	if seq == 0 {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(hdr.Get(wire.HeaderStreamVersion), 10, 64)
	if err != nil {
		// A predecessor without a stream version (published by another
		// program) has no place in the chain: none is named. An error
		// here would hold the stream for ever; a gate that answers gap
		// to none leads to order-stuck, a state the operator sees.
		return 0, false, nil
	}
	return v, true, nil
}
