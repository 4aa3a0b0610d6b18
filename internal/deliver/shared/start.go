package shared

import (
	"context"
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
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
				// earlier look saw it (up to seqtime.Fresh ago: the
				// events stored since would be its too).
				r.seqs.Forget()
			}
		}
		var err error
		if a, err = r.seqs.Before(ctx, at); err != nil {
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
