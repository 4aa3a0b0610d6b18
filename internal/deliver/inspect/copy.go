package inspect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// CopyLag is how far the partitioned copy of an events stream (the stream
// the durables engine's ordered subscriptions read, wire.OrderedStream)
// lags the events stream it sources.
//
// Only internal/deliver/ordercopy reads it now (consumer status no
// longer shows the copy): this file goes with that directory.
type CopyLag struct {
	// Stream is the copy's name, "<events>_ORDERED".
	Stream string
	// Events is the events stream it sources.
	Events string
	// Sourced is the events stream's sequence the copy's last message came
	// from (its Nats-Stream-Source header); 0 when the copy never held a
	// message. When every message left the copy (aged out, or purged), it
	// is the last one stored in the events stream before the copy stored
	// its last message.
	Sourced uint64
	// Messages is how many messages of the events stream are not in the
	// copy yet: those after Sourced. 0 when caught up.
	Messages uint64
	// Age is the age of the oldest of them (now minus its time in the
	// events stream); 0 when caught up.
	Age time.Duration
}

// ErrNotACopy is wrapped by ReadCopyLag when the stream named as the
// events stream's copy sources other streams.
var ErrNotACopy = errors.New("not the partitioned copy of the events stream")

// ReadCopyLag reads how far events' partitioned copy lags it at now: four
// JetStream requests (both streams' info, the copy's last message and the
// events stream's first message not sourced yet), two more when every
// message left the copy (see CopyLag.Sourced). It wraps
// jetstream.ErrStreamNotFound when either stream does not exist, and
// ErrNotACopy when the copy sources another stream than events.
func ReadCopyLag(ctx context.Context, js jetstream.JetStream, events string, now time.Time) (CopyLag, error) {
	lag := CopyLag{Stream: wire.OrderedStream(events), Events: events}
	cp, err := js.Stream(ctx, lag.Stream)
	if err != nil {
		return lag, fmt.Errorf("inspect: JetStream stream %q: %w", lag.Stream, err)
	}
	// A copy whose source was removed is one whose lag only grows.
	if src := cp.CachedInfo().Config.Sources; len(src) > 0 && (len(src) != 1 || src[0].Name != events) {
		return lag, fmt.Errorf("inspect: JetStream stream %q: %w %q", lag.Stream, ErrNotACopy, events)
	}
	// The copy is read before the events stream, so that a copy keeping
	// up never reads as ahead.
	var emptied bool // the copy held messages, and holds none of them now
	if last := cp.CachedInfo().State.LastSeq; last > 0 {
		m, err := cp.GetMsg(ctx, last)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			emptied = true
		case err != nil:
			return lag, fmt.Errorf("inspect: read JetStream stream %q at %d: %w", lag.Stream, last, err)
		default:
			lag.Sourced = wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo))
		}
	}
	ev, err := js.Stream(ctx, events)
	if err != nil {
		return lag, fmt.Errorf("inspect: JetStream stream %q: %w", events, err)
	}
	st := ev.CachedInfo().State
	if emptied && st.Msgs > 0 {
		if lag.Sourced, err = sourcedBefore(ctx, js, events, st.LastSeq, cp.CachedInfo().State.LastTime); err != nil {
			return lag, err
		}
	}
	from := max(lag.Sourced+1, st.FirstSeq) // the first message not in the copy
	if st.Msgs == 0 || st.LastSeq < from {
		return lag, nil
	}
	lag.Messages = st.LastSeq - from + 1
	m, err := ev.GetMsg(ctx, from, jetstream.WithGetMsgSubject(">"))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Removed meanwhile: the copy caught up with it, or it aged out.
	case err != nil:
		return lag, fmt.Errorf("inspect: read JetStream stream %q from %d: %w", events, from, err)
	default:
		lag.Age = max(now.Sub(m.Time), 0)
	}
	return lag, nil
}

// sourcedBefore is the events stream's sequence a copy whose last
// message is gone (every message aged out of it, or it was purged) has
// sourced up to, for events ending at lastSeq: the sequence before the
// first message stored after the copy stored its last one (at copied). A
// message is sourced after it is stored, so none stored later is in the
// copy; those stored before are counted as sourced (true unless the copy
// lagged when its last message was stored). Without the copy's last
// message there is no source header to read, and counting the whole
// events stream would report a copy that is caught up as behind by all
// of it. It asks JetStream how many messages an ephemeral consumer
// starting just after copied has pending (created and deleted here).
func sourcedBefore(ctx context.Context, js jetstream.JetStream, events string, lastSeq uint64, copied time.Time) (uint64, error) {
	if copied.IsZero() {
		return 0, nil
	}
	after := copied.Add(time.Nanosecond)
	c, err := js.CreateConsumer(ctx, events, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &after, AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, InactiveThreshold: time.Minute, Description: "jsbridge: the copy lag of an emptied copy",
	})
	if err != nil {
		return 0, fmt.Errorf("inspect: count JetStream stream %q's messages after %s: %w", events, copied.Format(time.RFC3339Nano), err)
	}
	info := c.CachedInfo()
	_ = js.DeleteConsumer(ctx, events, info.Name) // else gone after InactiveThreshold
	if info.NumPending >= lastSeq {
		return 0, nil
	}
	return lastSeq - info.NumPending, nil
}
