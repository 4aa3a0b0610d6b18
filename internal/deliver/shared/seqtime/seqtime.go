// Package seqtime finds the events stream's sequence at a time: the
// last message stored before it, by binary search on the stored times
// (which follow the sequence), each message read from the stream's
// leader. A subscription's start by time, or "new" with a creation time,
// and a replay window's start are resolved by it
// (docs/design/next-engine.md, section 3, "Replay, dead letters, start
// positions"). A Finder keeps its look at the stream's tail, and the
// messages its searches read, for Fresh, so that thousands of
// subscriptions created together resolve from one look.
package seqtime

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/jsapi"
)

// Finder finds sequences of one events stream by time. Safe for
// concurrent use (one search at a time). Make one with New.
type Finder struct {
	js     jetstream.JetStream
	stream string
	clock  clockwork.Clock

	mu   sync.Mutex
	tail *tail
}

// New returns the Finder of the JetStream stream named stream on js;
// the archetype's clock (nil: base.Default) ages its look at the tail.
func New(arch *base.Archetype, js jetstream.JetStream, stream string) *Finder {
	return &Finder{js: js, stream: stream, clock: base.Default(arch).Clock}
}

// Forget drops the look at the tail: the next Before reads it again (a
// subscription put now starts after the tail as it is now, not as an
// earlier look saw it).
func (f *Finder) Forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tail = nil
}

// Fresh is how long a Finder trusts a look at the events stream's
// tail: a replica starting thousands of subscriptions resolves their
// starts from one look instead of one stream info and search each.
const Fresh = time.Second

// tail is the events stream's state and its last message's time, as
// Before last looked.
type tail struct {
	at    time.Time // when it was read (the replica's clock)
	state jetstream.StreamState
	last  time.Time // the last message's stored time; zero: none
	// probes are the messages seqAtTime read while the tail is fresh, by
	// the sequence asked for: thousands of subscriptions created close
	// together search through the same ones (each read was a leader's
	// round trip, 14 a subscription over 10,000 events).
	probes map[uint64]probe
}

// probe is the answer to a read of the first message at or after a
// sequence: its sequence and stored time, or none (found false).
type probe struct {
	seq   uint64
	at    time.Time
	found bool
}

// Before returns the sequence of the events stream's last message
// stored before t (its last sequence for a zero t, or a t not before the
// last message's time, the tail read after t): by binary search on the stored times, which
// follow the sequence, each message read from the stream's leader (a
// direct get a lagging follower answers could make the search start past
// the newest messages). The tail is read again when older than Fresh,
// or read before t (what was stored between would be missed). Errors:
// the stream's.
func (f *Finder) Before(ctx context.Context, t time.Time) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tl := f.tail
	if tl == nil || f.clock.Since(tl.at) > Fresh || !t.Before(tl.at) {
		s, err := f.js.Stream(ctx, f.stream)
		if err != nil {
			return 0, fmt.Errorf("seqtime: events stream %s: %w", f.stream, err)
		}
		tl = &tail{at: f.clock.Now(), state: s.CachedInfo().State, probes: map[uint64]probe{}}
		if tl.state.Msgs > 0 {
			m, ok, err := jsapi.LeaderGet(ctx, f.js, f.stream, jsapi.GetRequest{Seq: tl.state.LastSeq})
			if err != nil {
				return 0, fmt.Errorf("seqtime: read events stream %s: %w", f.stream, err)
			}
			if ok {
				tl.last = m.Time
			}
		}
		f.tail = tl
	}
	st := tl.state
	if t.IsZero() || st.Msgs == 0 || t.After(tl.last) {
		return st.LastSeq, nil
	}
	return seqAtTime(ctx, f.js, f.stream, st, t, tl.probes)
}

// seqAtTime is Before's search over the stream of state st, reading
// each message once into probes.
func seqAtTime(ctx context.Context, js jetstream.JetStream, stream string, st jetstream.StreamState, t time.Time, probes map[uint64]probe) (uint64, error) {
	found := st.LastSeq + 1 // the first message at or after t
	lo, hi := st.FirstSeq, st.LastSeq
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, ok := probes[mid]
		if !ok {
			msg, got, err := jsapi.LeaderGet(ctx, js, stream, jsapi.GetRequest{Seq: mid, NextFor: ">"})
			if err != nil {
				return 0, fmt.Errorf("seqtime: read events stream %s: %w", stream, err)
			}
			m = probe{seq: msg.Seq, at: msg.Time, found: got}
			probes[mid] = m
		}
		switch {
		case !m.found:
			hi = mid - 1
		case !m.at.Before(t):
			found = m.seq
			if mid == 0 {
				return found - 1, nil
			}
			hi = mid - 1
		default:
			lo = m.seq + 1
		}
	}
	return found - 1, nil
}
