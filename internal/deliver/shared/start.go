package shared

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/jsapi"
)

// startTimeout bounds the look-ups of one subscription's start.
const startTimeout = 10 * time.Second

// after returns the events stream sequence subscription s starts after
// (fanout.Partition.Join's after), resolved once per subscription and
// kept (docs/design/next-engine.md, section 3, "Replay, dead letters,
// start positions"): all → 0; a sequence n → n−1; a time → the
// sequence before the first event stored at or after it; new → the
// events stream's last sequence when the subscription was created
// (created, from the subscriptions bucket's document), or, without a
// creation time, when the consumer provisioned or the replica started
// (ResolveNew: a subscription given before Start, as a subscriptions
// file's are) or when it was put (one put while the replica runs: the
// tail read then, never an earlier look's). r.subs.mu is held.
func (r *Replica) after(s subscription.Subscription) (uint64, error) {
	if a, ok := r.subs.after[s.Name]; ok {
		return a, nil
	}
	var a uint64
	switch st := s.Start; st.Policy {
	case subscription.StartAll:
	case subscription.StartSequence:
		a = st.Sequence - 1
	default:
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		at := st.Time
		if st.Policy != subscription.StartTime {
			at = r.subs.created[s.Name]
			if at.IsZero() {
				// Put now: its start is the tail as read now, not as an
				// earlier look saw it (up to tailFresh ago: the events
				// stored since would be its too).
				r.subs.tail = nil
			}
		}
		var err error
		if a, err = r.seqBefore(ctx, at); err != nil {
			return 0, fmt.Errorf("shared: subscription %q: start %s: %w", s.Name, st, err)
		}
	}
	r.subs.after[s.Name] = a
	return a, nil
}

// ResolveNew resolves the start of every subscription given so far whose
// start is new and which has no creation time (one of a subscriptions
// file, or given to New) to after last, the events stream's last
// sequence as the caller read it: the consumer's Provision does, so that
// what is stored between Provision and Start is delivered, as the
// durables engine's durable consumers made at Provision deliver it. A
// start resolved already is kept; Start resolves those left, after the
// last sequence it reads.
func (r *Replica) ResolveNew(last uint64) { r.startNew(last) }

// startNew is ResolveNew.
func (r *Replica) startNew(last uint64) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	for name, s := range r.subs.given {
		_, resolved := r.subs.after[name]
		_, created := r.subs.created[name]
		if p := s.WithDefaults().Start.Policy; (p == subscription.StartNew || p == "") && !resolved && !created {
			r.subs.after[name] = last
		}
	}
}

// tailFresh is how long seqBefore trusts a look at the events stream's
// tail: a replica starting thousands of subscriptions resolves their
// starts from one look instead of one stream info and search each.
const tailFresh = time.Second

// tail is the events stream's state and its last message's time, as
// seqBefore last looked (r.subs.mu is held around it).
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

// seqBefore returns the sequence of the events stream's last message
// stored before t (its last sequence for a zero t, or a t not before the
// last message's time, the tail read after t): by binary search on the stored times, which
// follow the sequence, each message read from the stream's leader (a
// direct get a lagging follower answers could make the search start past
// the newest messages). The tail is read again when older than
// tailFresh, or read before t (what was stored between would be missed).
// r.subs.mu is held.
func (r *Replica) seqBefore(ctx context.Context, t time.Time) (uint64, error) {
	tl := r.subs.tail
	if tl == nil || r.cfg.Clock.Since(tl.at) > tailFresh || !t.Before(tl.at) {
		s, err := r.js.Stream(ctx, r.cfg.Stream)
		if err != nil {
			return 0, fmt.Errorf("events stream %s: %w", r.cfg.Stream, err)
		}
		tl = &tail{at: r.cfg.Clock.Now(), state: s.CachedInfo().State, probes: map[uint64]probe{}}
		if tl.state.Msgs > 0 {
			m, ok, err := jsapi.LeaderGet(ctx, r.js, r.cfg.Stream, jsapi.GetRequest{Seq: tl.state.LastSeq})
			if err != nil {
				return 0, fmt.Errorf("read events stream %s: %w", r.cfg.Stream, err)
			}
			if ok {
				tl.last = m.Time
			}
		}
		r.subs.tail = tl
	}
	st := tl.state
	if t.IsZero() || st.Msgs == 0 || t.After(tl.last) {
		return st.LastSeq, nil
	}
	return seqAtTime(ctx, r.js, r.cfg.Stream, st, t, tl.probes)
}

// seqAtTime is seqBefore's search over the stream of state st, reading
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
				return 0, fmt.Errorf("read events stream %s: %w", stream, err)
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

// join starts subscription s on fan from its start (fanout's Join:
// idempotent, a subscription the partition's record or cursors hold is
// left as it is). r.subs.mu is held.
func (r *Replica) join(fan fanJoiner, p int, s subscription.Subscription) error {
	a, err := r.after(s)
	if err != nil {
		return err
	}
	if err := fan.Join(s.Name, a); err != nil {
		return fmt.Errorf("shared: partition %d: %w", p, err)
	}
	return nil
}

// fanJoiner is fanout.Partition's Join.
type fanJoiner interface {
	Join(sub string, after uint64) error
}
