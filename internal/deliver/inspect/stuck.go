package inspect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// The states of StuckStream.State: a record's aside states
// (fanout.AsideParked, AsideStuck, AsideReading), with a parked stream
// whose head's dead letter says the order gate refused it (for longer
// than the consumer's OrderStuckAfter) shown as order-stuck.
const (
	StateParked     = fanout.AsideParked
	StateOrderStuck = "order-stuck"
	StateStuck      = fanout.AsideStuck
	StateReadAgain  = fanout.AsideReading
)

// StuckStream is one stream of one subscription that a partition's
// record sets aside (position.Aside): its events from From on are not
// delivered to the subscription until it goes on. One row of `consumer
// status`'s stuck streams.
type StuckStream struct {
	Subscription string `json:"subscription"`
	Partition    int    `json:"partition"`
	// State is StateParked, StateOrderStuck, StateStuck or
	// StateReadAgain.
	State string `json:"state"`
	// Stream is the source stream's name (from its head's ce-subject;
	// empty when the head is not on the events stream any more);
	// StreamKey its subject on the events stream without the event name.
	Stream    string `json:"stream,omitempty"`
	StreamKey string `json:"stream_key"`
	// From is the events stream sequence of its head: the first event
	// set aside.
	From uint64 `json:"from"`
	// HeadEventID and HeadVersion name the head (empty when not known:
	// the head left the events stream).
	HeadEventID string `json:"head_event_id,omitempty"`
	HeadVersion string `json:"head_version,omitempty"`
	// Since is when the head was dead-lettered (parked, order-stuck);
	// zero when not known (stuck, read again).
	Since time.Time `json:"since,omitzero"`
	// Attempts is how many attempts at the head failed so far (stuck;
	// the record's retry entry), 0 when it has none.
	Attempts uint64 `json:"attempts,omitempty"`
	// Why says why it is set aside: the head's dead letter's reason
	// (parked, order-stuck), its failed attempts (stuck), or the read
	// again.
	Why string `json:"why"`
	// Next is the one command out of the state, or what ends it.
	Next string `json:"next"`
}

// stuckOf returns the streams the records of parts set aside, by
// subscription, partition and stream key, each with its head read from
// events (nil: none) and, when parked, described by its head's dead
// letter in the dead-letter stream dlqStream ("": its default).
func stuckOf(ctx context.Context, js jetstream.JetStream, events jetstream.Stream, dlqStream string, parts []position.Stored) ([]StuckStream, error) {
	out := []StuckStream{}
	var letters []deadletter.Stored
	listed := false
	for _, p := range parts {
		for _, a := range p.Record.Asides {
			s := StuckStream{Subscription: a.Sub, Partition: p.Partition, State: a.State, StreamKey: a.Stream, From: a.From}
			if err := readHead(ctx, events, &s); err != nil {
				return nil, err
			}
			if a.State == StateParked || a.State == StateOrderStuck {
				if !listed {
					var err error
					letters, err = deadletter.New(js, deadletter.Config{Stream: dlqStream}).List(ctx, "")
					if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
						return nil, fmt.Errorf("inspect: %w", err)
					}
					listed = true
				}
				i := slices.IndexFunc(letters, func(dl deadletter.Stored) bool {
					return dl.Subscription == a.Sub && dl.StreamSeq == a.From && wire.StreamKey(dl.Subject) == a.Stream
				})
				if i >= 0 {
					dl := letters[i]
					s.Since, s.Why = dl.DeadLetteredAt, dl.Reason
					s.HeadEventID = cmp.Or(s.HeadEventID, dl.EventID)
					if strings.HasPrefix(dl.Reason, "order-stuck") {
						s.State = StateOrderStuck
					}
				}
			}
			for _, r := range p.Record.Retries {
				if r.Sub == a.Sub && r.Seq == a.From {
					s.Attempts = r.Attempts
				}
			}
			explain(&s)
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b StuckStream) int {
		return cmp.Or(strings.Compare(a.Subscription, b.Subscription), cmp.Compare(a.Partition, b.Partition), strings.Compare(a.StreamKey, b.StreamKey))
	})
	return out, nil
}

// readHead fills s's head (event id, version, stream name) from its
// message at s.From on the events stream; a message not there (removed
// by the stream's limits) leaves them empty.
func readHead(ctx context.Context, events jetstream.Stream, s *StuckStream) error {
	if events == nil || s.From == 0 {
		return nil
	}
	m, err := events.GetMsg(ctx, s.From)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect: read the head of stream %s (sequence %d): %w", s.StreamKey, s.From, err)
	}
	if wire.StreamKey(m.Subject) != s.StreamKey {
		return nil // not the stream's: the events stream was made again
	}
	s.HeadEventID, s.HeadVersion = m.Header.Get(wire.HeaderID), m.Header.Get(wire.HeaderStreamVersion)
	if name, err := wire.DecodeHeaderValue(m.Header.Get(wire.HeaderSubject)); err == nil {
		s.Stream = name
	}
	return nil
}

// explain sets s's Why (when no dead letter said it) and Next from its
// state. A pure function.
func explain(s *StuckStream) {
	head := cmp.Or(s.HeadEventID, "at sequence "+strconv.FormatUint(s.From, 10))
	switch s.State {
	case StateParked, StateOrderStuck:
		s.Why = cmp.Or(s.Why, "parked: its head's dead letter is not in the dead-letter stream any more")
		s.Next = "consumer dlq list -s " + s.Subscription + " names the head's seq N (event " + head +
			"); then consumer dlq replay --seq N once the receiver can take it, or consumer dlq skip --seq N to go on without it"
	case StateStuck:
		s.Why = "its head is retried in place"
		if s.Attempts > 0 {
			s.Why = fmt.Sprintf("%d attempts at its head failed; retried in place", s.Attempts)
		}
		s.Next = "none needed while the head is retried: it goes on once the receiver takes it; after the last attempt, or past --order-stuck-after of gap answers, it is dead-lettered (consumer trace " + head + ")"
	case StateReadAgain:
		s.Why = "read again from its head (a replay, skip or unpark applied)"
		s.Next = "none: the partition's owner reads the stream again and it goes on by itself"
	default:
		s.Why = cmp.Or(s.Why, "set aside ("+s.State+")")
		s.Next = "consumer trace " + head
	}
}
