package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

// senderSet is the replica's attempt.Sender of each subscription, by
// name: replaced by Put, dropped by Remove while the claims' senders
// read it.
type senderSet struct {
	mu sync.RWMutex
	m  map[string]*attempt.Sender
}

func (ss *senderSet) get(name string) *attempt.Sender {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	return ss.m[name]
}

func (ss *senderSet) set(name string, snd *attempt.Sender) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if snd == nil {
		delete(ss.m, name)
		return
	}
	ss.m[name] = snd
}

// subs is the replica's subscription set as Put, Pause and Remove leave
// it, and the fan-outs of the partitions it serves, which every edit
// reaches. mu serialises the edits with a new fan-out's start (serve,
// startFan), so that a partition gained during an edit sees it.
type subs struct {
	// What a sender is made of (set once by New).
	open       *http.Client
	guarded    *http.Client // made on first use by subscription.Client
	breakers   *breaker.Set
	deliveries *prometheus.CounterVec

	mu     sync.Mutex
	given  map[string]subscription.Subscription // as Put, by name
	paused map[string]bool
	fans   map[*fanout.Partition]int // the fan-outs running, with their partition
}

// Put makes subscription sub delivered by this replica, while it runs
// or before Start: a new one joins every partition the replica serves
// live, from the next event each dispatches (start positions are not
// applied yet: they wait for fanout's Join); one whose secrets or scheme
// alone changed signs its next attempt with the new ones, in place; any
// other change replaces its Member (filters, ordering, limits) and its
// attempt.Sender, the attempts running finishing with the former one. A
// paused subscription Put is resumed: its cursors read from where it was
// paused and rejoin. Errors: an invalid sub
// (subscription.ErrInvalidSubscription), a filter the member index
// refuses; what ran is kept.
func (r *Replica) Put(sub subscription.Subscription) error { return r.put(sub, false) }

// PutPaused is Put of a subscription that stays paused (Pause): it is
// known to the replica, its filters and its position kept, but nothing
// is sent to it until Put. A subscription found paused in the
// subscriptions bucket is put so.
func (r *Replica) PutPaused(sub subscription.Subscription) error { return r.put(sub, true) }

func (r *Replica) put(sub subscription.Subscription, paused bool) error {
	if err := sub.Validate(); err != nil {
		return fmt.Errorf("shared: %w", err)
	}
	s := sub.WithDefaults()
	signer, err := webhook.NewSigner(s.Scheme, s.Secrets...)
	if err != nil {
		return fmt.Errorf("shared: subscription %q: %w", s.Name, err)
	}
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	old, had := r.subs.given[s.Name]
	if snd := r.senders.get(s.Name); had && snd != nil && onlySigningChanged(old, sub) {
		snd.SetSigner(signer)
		r.subs.given[s.Name] = sub
		r.log.Info("shared: subscription's signing secrets changed: the next attempt signs with them", slog.String("subscription", s.Name))
		return r.pauseOrResume(s.Name, paused)
	}
	client, err := subscription.Client(r.subs.open, &r.subs.guarded, s)
	if err != nil {
		return fmt.Errorf("shared: %w", err)
	}
	snd, err := attempt.New(attempt.Config{Subscription: s, Signer: signer, Client: client, UserAgent: r.cfg.UserAgent},
		attempt.Deps{Breaker: r.subs.breakers.Breaker(s.URL), Clock: r.cfg.Clock, Logger: r.log,
			Metrics: attempt.Metrics{Deliveries: r.subs.deliveries}})
	if err != nil {
		return fmt.Errorf("shared: %w", err)
	}
	// The sender first: a partition dispatching to the new member finds
	// its sender.
	prev := r.senders.get(s.Name)
	r.senders.set(s.Name, snd)
	if err := r.members.Put(fanout.MemberOf(s)); err != nil {
		r.senders.set(s.Name, prev)
		return fmt.Errorf("shared: subscription %q: %w", s.Name, err)
	}
	r.subs.given[s.Name] = sub
	if had {
		r.log.Info("shared: subscription changed", slog.String("subscription", s.Name))
	} else {
		r.log.Info("shared: subscription added: it joins live", slog.String("subscription", s.Name), slog.String("start", s.Start.String()))
	}
	return r.pauseOrResume(s.Name, paused)
}

// pauseOrResume pauses subscription name (pause) or resumes it when it
// was paused; r.subs.mu is held.
func (r *Replica) pauseOrResume(name string, pause bool) error {
	if pause {
		r.pause(name)
		return nil
	}
	if !r.subs.paused[name] {
		return nil
	}
	delete(r.subs.paused, name)
	var errs []error
	for fan := range r.subs.fans {
		errs = append(errs, fan.SetState(name, ""))
	}
	r.log.Info("shared: subscription resumed", slog.String("subscription", name))
	return errors.Join(errs...)
}

// onlySigningChanged reports whether a and b differ in Secrets or Scheme
// alone (as the old engine's Fleet.Put tells them).
func onlySigningChanged(a, b subscription.Subscription) bool {
	a.Secrets, b.Secrets = nil, nil
	a.Scheme, b.Scheme = "", ""
	return subscription.Equal(a, b)
}

// Pause stops delivering subscription name on every partition the
// replica serves, and on those it gains later, keeping its position:
// each partition gives it a cursor in fanout.StatePaused (written once,
// then never again; its attempts running finish). Put resumes it. A name
// the replica does not have is ignored.
func (r *Replica) Pause(name string) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	r.pause(name)
}

// pause is Pause with r.subs.mu held.
func (r *Replica) pause(name string) {
	if _, ok := r.subs.given[name]; !ok || r.subs.paused[name] {
		return
	}
	r.subs.paused[name] = true
	for fan, p := range r.subs.fans {
		if err := fan.SetState(name, fanout.StatePaused); err != nil {
			r.log.Warn("shared: pause", slog.String("subscription", name), slog.Int("partition", p), slog.Any("error", err))
		}
	}
	r.log.Info("shared: subscription paused", slog.String("subscription", name))
}

// Remove stops delivering subscription name and forgets it: every
// partition the replica serves drops it (fanout.Partition.Forget: its
// record entries go, it stops holding the floor) and its cursor keys of
// those partitions are deleted from the positions bucket (the other
// replicas delete theirs as they apply the same change). A removed
// subscription put again starts as a new one. Errors: the cursor keys'
// deletions (the subscription is removed all the same).
func (r *Replica) Remove(ctx context.Context, name string) error {
	r.subs.mu.Lock()
	_, ok := r.subs.given[name]
	delete(r.subs.given, name)
	delete(r.subs.paused, name)
	var parts []int
	if ok {
		r.members.Remove(name)
		for fan, p := range r.subs.fans {
			fan.Forget(name)
			parts = append(parts, p)
		}
		r.senders.set(name, nil)
	}
	r.subs.mu.Unlock()
	if !ok {
		return nil
	}
	r.log.Info("shared: subscription removed", slog.String("subscription", name))
	var errs []error
	for _, p := range parts {
		r.cursors.Drop(name, p)
		if r.poskv == nil {
			continue
		}
		err := r.poskv.Delete(ctx, position.CursorKey(name, p))
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			errs = append(errs, fmt.Errorf("shared: delete %s's cursor on partition %d: %w", name, p, err))
		}
	}
	return errors.Join(errs...)
}

// Names returns the subscriptions the replica has (paused ones too),
// sorted.
func (r *Replica) Names() []string {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	return slices.Sorted(maps.Keys(r.subs.given))
}

// startFan registers fan, the fan-out of partition p just made, with
// the edits, and gives it the subscription set's states: a paused
// subscription a paused cursor, and a cursor left paused by a former
// owner of a subscription resumed since back to reading.
func (r *Replica) startFan(p int, fan *fanout.Partition) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	r.subs.fans[fan] = p
	for name := range r.subs.paused {
		if err := fan.SetState(name, fanout.StatePaused); err != nil {
			r.log.Warn("shared: pause", slog.String("subscription", name), slog.Int("partition", p), slog.Any("error", err))
		}
	}
	for name, state := range fan.Behind() {
		if state != fanout.StatePaused || r.subs.paused[name] {
			continue
		}
		if _, ok := r.subs.given[name]; !ok {
			continue
		}
		if err := fan.SetState(name, ""); err != nil {
			r.log.Warn("shared: resume", slog.String("subscription", name), slog.Int("partition", p), slog.Any("error", err))
		}
	}
}

// endFan takes fan out of the edits' reach (its partition released).
func (r *Replica) endFan(fan *fanout.Partition) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	delete(r.subs.fans, fan)
}

// Paused reports whether subscription name is the replica's and paused.
func (r *Replica) Paused(name string) bool {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	return r.subs.paused[name]
}
