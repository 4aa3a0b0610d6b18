package migrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// copySeqs translates sequences of the partitioned copy into the events
// stream's. The copy sources the events stream in order, and each of its
// messages names the sequence it came from in its Nats-Stream-Source
// header (wire.SourceSequence), as the old engine read it; what it reads is kept for the next question.
type copySeqs struct {
	s           jetstream.Stream
	name        string
	first, last uint64 // the copy's first and last sequences when read
	// sourced is the events stream sequence the copy's last message came
	// from (copySourced): every message of the copy came
	// from it or before.
	sourced uint64
	msgs    map[uint64]*jetstream.RawStreamMsg // by copy sequence; nil: none there
	next    map[uint64]*jetstream.RawStreamMsg // the first message at or after a sequence; nil: none
}

func newCopySeqs(s jetstream.Stream, sourced uint64) *copySeqs {
	st := s.CachedInfo().State
	return &copySeqs{s: s, name: s.CachedInfo().Config.Name, first: st.FirstSeq, last: st.LastSeq, sourced: sourced,
		msgs: map[uint64]*jetstream.RawStreamMsg{}, next: map[uint64]*jetstream.RawStreamMsg{}}
}

// msg returns the copy's message at seq, nil when it holds none there
// (never stored, removed, aged out).
func (c *copySeqs) msg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	if seq == 0 || seq < c.first || seq > c.last {
		return nil, nil
	}
	if m, ok := c.msgs[seq]; ok {
		return m, nil
	}
	m, err := c.s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		m, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read JetStream stream %q at %d: %w", c.name, seq, err)
	}
	c.msgs[seq] = m
	return m, nil
}

// after returns the copy's first message at or after seq, nil when none.
func (c *copySeqs) after(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	seq = max(seq, c.first, 1)
	if seq > c.last {
		return nil, nil
	}
	if m, ok := c.next[seq]; ok {
		return m, nil
	}
	m, err := c.s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		m, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read JetStream stream %q from %d: %w", c.name, seq, err)
	}
	c.next[seq] = m
	return m, nil
}

// origin is the events stream sequence a copy message came from.
func (c *copySeqs) origin(m *jetstream.RawStreamMsg) (uint64, error) {
	seq := wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo))
	if seq == 0 {
		return 0, fmt.Errorf("migrate: JetStream stream %q at %d: no %s header naming the events stream sequence it came from (%q)",
			c.name, m.Sequence, wire.HeaderSourceInfo, m.Header.Get(wire.HeaderSourceInfo))
	}
	return seq, nil
}

// floor translates a floor of the copy: it returns the events stream
// sequence F such that the copy's messages at or below seq are those
// sourced from F or before. That is the origin of the copy's message at
// seq when it holds one, else the origin of its first message after seq
// less one (the events between came from no message of the copy: not
// copied, or aged out), else every message sourced (seq at or past the
// copy's last).
func (c *copySeqs) floor(ctx context.Context, seq uint64) (uint64, error) {
	m, err := c.msg(ctx, seq)
	if err != nil {
		return 0, err
	}
	if m != nil {
		return c.origin(m)
	}
	if m, err = c.after(ctx, seq+1); err != nil || m == nil {
		return c.sourced, err
	}
	o, err := c.origin(m)
	return o - 1, err
}

// from translates a from-sequence of the copy (every event before it
// settled, those from it on not): the events stream sequence after the
// translated floor below it.
func (c *copySeqs) from(ctx context.Context, seq uint64) (uint64, error) {
	if seq == 0 {
		return 1, nil
	}
	f, err := c.floor(ctx, seq-1)
	return f + 1, err
}
