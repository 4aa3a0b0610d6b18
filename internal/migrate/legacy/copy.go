package legacy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// ErrNotACopy is wrapped by CopySourced when the stream named as the
// events stream's copy sources other streams.
var ErrNotACopy = errors.New("not the partitioned copy of the events stream")

// CopySourced is the events stream's sequence the copy cp of events
// sourced up to: the origin of its last message (its Nats-Stream-Source
// header); 0 when it never held one. When every message left the copy
// (aged out, or purged), it is the last one stored in the events stream
// before the copy stored its last message: an ephemeral consumer
// starting just after that time counts the rest (created and deleted
// here). It wraps ErrNotACopy when cp sources other streams than events.
func CopySourced(ctx context.Context, js jetstream.JetStream, cp jetstream.Stream, events string) (uint64, error) {
	info := cp.CachedInfo()
	if src := info.Config.Sources; len(src) > 0 && (len(src) != 1 || src[0].Name != events) {
		return 0, fmt.Errorf("migrate: JetStream stream %q: %w %q", info.Config.Name, ErrNotACopy, events)
	}
	last := info.State.LastSeq
	if last == 0 {
		return 0, nil
	}
	m, err := cp.GetMsg(ctx, last)
	if err == nil {
		return wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo)), nil
	}
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("migrate: read JetStream stream %q at %d: %w", info.Config.Name, last, err)
	}
	ev, err := js.Stream(ctx, events)
	if err != nil {
		return 0, fmt.Errorf("migrate: events stream %q: %w", events, err)
	}
	st := ev.CachedInfo().State
	if st.Msgs == 0 || info.State.LastTime.IsZero() {
		return 0, nil
	}
	after := info.State.LastTime.Add(time.Nanosecond)
	c, err := js.CreateConsumer(ctx, events, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &after, AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, InactiveThreshold: time.Minute, Description: "jsbridge migrate: what an emptied copy sourced",
	})
	if err != nil {
		return 0, fmt.Errorf("migrate: count JetStream stream %q's messages after %s: %w", events, after.Format(time.RFC3339Nano), err)
	}
	pending := c.CachedInfo().NumPending
	_ = js.DeleteConsumer(ctx, events, c.CachedInfo().Name) // else gone after InactiveThreshold
	if pending >= st.LastSeq {
		return 0, nil
	}
	return st.LastSeq - pending, nil
}

// CopySeqs translates sequences of the partitioned copy into the events
// stream's. The copy sources the events stream in order, and each of its
// messages names the sequence it came from in its Nats-Stream-Source
// header (wire.SourceSequence), as the old engine read it; what it reads
// is kept for the next question. Not safe for concurrent use.
type CopySeqs struct {
	// Stream is the copy, Name its name; First and Last its first and
	// last sequences when read.
	Stream      jetstream.Stream
	Name        string
	First, Last uint64
	// sourced is the events stream sequence the copy's last message came
	// from (CopySourced): every message of the copy came from it or
	// before.
	sourced uint64
	msgs    map[uint64]*jetstream.RawStreamMsg // by copy sequence; nil: none there
	next    map[uint64]*jetstream.RawStreamMsg // the first message at or after a sequence; nil: none
}

// NewCopySeqs translates the sequences of the copy s, which sourced the
// events stream up to sourced (CopySourced).
func NewCopySeqs(s jetstream.Stream, sourced uint64) *CopySeqs {
	st := s.CachedInfo().State
	return &CopySeqs{Stream: s, Name: s.CachedInfo().Config.Name, First: st.FirstSeq, Last: st.LastSeq, sourced: sourced,
		msgs: map[uint64]*jetstream.RawStreamMsg{}, next: map[uint64]*jetstream.RawStreamMsg{}}
}

// Msg returns the copy's message at seq, nil when it holds none there
// (never stored, removed, aged out).
func (c *CopySeqs) Msg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	if seq == 0 || seq < c.First || seq > c.Last {
		return nil, nil
	}
	if m, ok := c.msgs[seq]; ok {
		return m, nil
	}
	m, err := c.Stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		m, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read JetStream stream %q at %d: %w", c.Name, seq, err)
	}
	c.msgs[seq] = m
	return m, nil
}

// after returns the copy's first message at or after seq, nil when none.
func (c *CopySeqs) after(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	seq = max(seq, c.First, 1)
	if seq > c.Last {
		return nil, nil
	}
	if m, ok := c.next[seq]; ok {
		return m, nil
	}
	m, err := c.Stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		m, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read JetStream stream %q from %d: %w", c.Name, seq, err)
	}
	c.next[seq] = m
	return m, nil
}

// Origin is the events stream sequence a copy message came from.
func (c *CopySeqs) Origin(m *jetstream.RawStreamMsg) (uint64, error) {
	seq := wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo))
	if seq == 0 {
		return 0, fmt.Errorf("migrate: JetStream stream %q at %d: no %s header naming the events stream sequence it came from (%q)",
			c.Name, m.Sequence, wire.HeaderSourceInfo, m.Header.Get(wire.HeaderSourceInfo))
	}
	return seq, nil
}

// Floor translates a floor of the copy: it returns the events stream
// sequence F such that the copy's messages at or below seq are those
// sourced from F or before. That is the origin of the copy's message at
// seq when it holds one, else the origin of its first message after seq
// less one (the events between came from no message of the copy: not
// copied, or aged out), else every message sourced (seq at or past the
// copy's last).
func (c *CopySeqs) Floor(ctx context.Context, seq uint64) (uint64, error) {
	m, err := c.Msg(ctx, seq)
	if err != nil {
		return 0, err
	}
	if m != nil {
		return c.Origin(m)
	}
	if m, err = c.after(ctx, seq+1); err != nil || m == nil {
		return c.sourced, err
	}
	o, err := c.Origin(m)
	return o - 1, err
}

// From translates a from-sequence of the copy (every event before it
// settled, those from it on not): the events stream sequence after the
// translated floor below it.
func (c *CopySeqs) From(ctx context.Context, seq uint64) (uint64, error) {
	if seq == 0 {
		return 1, nil
	}
	f, err := c.Floor(ctx, seq-1)
	return f + 1, err
}
