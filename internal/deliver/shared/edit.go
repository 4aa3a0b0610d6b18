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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

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
	attempts   attemptlog.Recorder // nil: no records
	record     attemptlog.Mode
	tracer     trace.Tracer

	mu      sync.Mutex
	given   map[string]subscription.Subscription // as Put, by name
	paused  map[string]bool
	created map[string]time.Time // when the bucket's subscriptions were created (PutAt)
	after   map[string]uint64    // each subscription's start, resolved (start.go)
	deleted map[string]bool      // removed (the bucket deleted them) and not put since: not held
	// The endpoints' breakers (breakers.go): watched from Start (bctx),
	// by endpoint; opened: those whose breaker is open.
	bctx    context.Context
	watched map[string]bool
	opened  map[string]bool
	fans    map[*fanout.Partition]int     // the fan-outs running, with their partition
	records map[*fanout.Partition]flusher // and their partition's record
}

// Put makes subscription sub delivered by this replica, while it runs
// or before Start: a new one starts on every partition the replica
// serves from its start position (fanout.Partition.Join: below the
// partition's head as a cursor reading from there, else live; see
// after for how a start becomes a sequence), and on the partitions it
// gains later alike, unless a partition's record holds it already; one
// whose secrets or scheme alone changed signs its next attempt with the
// new ones, in place; any other change replaces its Member (filters,
// ordering, limits) and its attempt.Sender, the attempts running
// finishing with the former one (a changed start is not applied again).
// A paused subscription Put is resumed: its cursors read from where it
// was paused and rejoin. Errors: an invalid sub
// (subscription.ErrInvalidSubscription), a filter the member index
// refuses; what ran is kept. A start that cannot be resolved or joined
// is logged and the subscription gets nothing on that partition until
// the partition is claimed again.
func (r *Replica) Put(sub subscription.Subscription) error { return r.PutAt(sub, time.Time{}, false) }

// PutAt is Put of a subscription created at created (the subscriptions
// bucket's document says when): a start "new" begins after the events
// stream's last event stored before it. A zero created is "when the
// replica first starts it". With paused (a subscription found paused in
// the bucket) it stays paused (Pause): known, its filters and position
// kept, nothing sent to it until Put.
func (r *Replica) PutAt(sub subscription.Subscription, created time.Time, paused bool) error {
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
	if snd := r.senders.Get(s.Name); had && snd != nil && onlySigningChanged(old, sub) {
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
		attempt.Deps{Archetype: r.cfg.Archetype, Breaker: r.subs.breakers.Breaker(s.URL), Health: r.health, Tracer: r.subs.tracer,
			Metrics: r.metrics.Attempt(s.Name, r.subs.deliveries), Attempts: r.subs.attempts, Record: r.subs.record})
	if err != nil {
		return fmt.Errorf("shared: %w", err)
	}
	// The sender first: a partition dispatching to the new member finds
	// its sender.
	prev := r.senders.Get(s.Name)
	r.senders.Put(s.Name, snd)
	if err := r.members.Put(member.Of(s)); err != nil {
		r.senders.Put(s.Name, prev)
		return fmt.Errorf("shared: subscription %q: %w", s.Name, err)
	}
	r.subs.given[s.Name] = sub
	delete(r.subs.deleted, s.Name)
	r.watchBreaker(s.URL)
	r.health.Added(s.Name)
	if had {
		r.log.Info("shared: subscription changed", slog.String("subscription", s.Name))
		return r.pauseOrResume(s.Name, paused)
	}
	if !created.IsZero() {
		r.subs.created[s.Name] = created
	}
	r.log.Info("shared: subscription added", slog.String("subscription", s.Name), slog.String("start", s.Start.String()))
	for fan, p := range r.subs.fans {
		if err := r.join(fan, p, s); err != nil {
			r.log.Error("shared: the subscription cannot start on the partition", slog.String("subscription", s.Name), slog.Int("partition", p), slog.Any("error", err))
		}
	}
	defer r.poke()
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
	to := r.cursorState(name) // its endpoint's breaker open: StateBreaker (breakers.go)
	if r.health.IsDisabled(name) {
		to = fanout.StateDisabled // resumed, but disabled still (health.go)
	}
	var errs []error
	for fan := range r.subs.fans {
		errs = append(errs, fan.SetState(name, to))
	}
	r.poke()
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
// record entries go, it stops holding the floor, and its cursor key is
// deleted after the commit Remove waits for; the other replicas drop
// theirs as they apply the same change). A name the replica does not
// deliver is dropped alike where its partitions hold it (a stranger's
// place, fanout.StateHeld). The name is remembered as deleted: a
// partition claimed later drops what it holds of it instead of holding
// it, until it is put again. A removed subscription put again starts as
// a new one. Its failure streak is forgotten, here and in the health
// bucket (health.State.Forget). A commit that failed is retried by the
// partition, or left to its next owner, which drops the name too; the
// error returned is the streak key's deletion's only.
func (r *Replica) Remove(ctx context.Context, name string) error {
	r.subs.mu.Lock()
	_, ok := r.subs.given[name]
	delete(r.subs.given, name)
	delete(r.subs.paused, name)
	delete(r.subs.created, name)
	delete(r.subs.after, name)
	r.subs.deleted[name] = true
	if ok {
		r.members.Remove(name)
	}
	parts := map[int]flusher{}
	for fan, p := range r.subs.fans {
		fan.Forget(name)
		parts[p] = r.subs.records[fan]
	}
	if ok {
		r.senders.Put(name, nil)
	}
	r.subs.mu.Unlock()
	if ok {
		r.log.Info("shared: subscription removed", slog.String("subscription", name))
	}
	for p, rec := range parts {
		r.cursors.Drop(name, p)
		if rec == nil {
			continue
		}
		// A partition released meanwhile committed what it had; its
		// next owner drops the name at its claim (deleted).
		if err := rec.Flush(ctx); err != nil {
			r.log.Debug("shared: remove: the partition's record was not committed", slog.Int("partition", p), slog.Any("error", err))
		}
	}
	// Its failure streak goes with it (every replica tries; deleting an
	// absent key is fine).
	return r.health.Forget(ctx, name)
}

// deleted reports whether subscription name was removed and not put
// since (fanout.Config.Deleted).
func (r *Replica) deleted(name string) bool {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	return r.subs.deleted[name]
}

// Names returns the subscriptions the replica has (paused ones too),
// sorted.
func (r *Replica) Names() []string {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	return slices.Sorted(maps.Keys(r.subs.given))
}

// startFan registers fan, the fan-out of partition p just made, and
// rec, its record, with the edits, starts every subscription on it from its start (Join,
// which leaves those the record holds as they are), and gives it the
// subscription set's states: a paused
// subscription a paused cursor, and a cursor left paused by a former
// owner of a subscription resumed since back to reading.
func (r *Replica) startFan(p int, fan *fanout.Partition, rec flusher) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	r.subs.fans[fan], r.subs.records[fan] = p, rec
	for name := range fan.Behind() {
		if r.subs.deleted[name] { // removed since the fan-out was made
			fan.Forget(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.subs.given)) {
		if err := r.join(fan, p, r.subs.given[name].WithDefaults()); err != nil {
			r.log.Error("shared: the subscription cannot start on the partition", slog.String("subscription", name), slog.Int("partition", p), slog.Any("error", err))
		}
	}
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
	r.applyHealth(fan)   // a disabled subscription starts disabled
	r.applyBreakers(fan) // one whose endpoint's breaker is open, in StateBreaker
}

// poke wakes the dispatch loop (when it runs) for the cursors' round;
// r.subs.mu is held (Start sets the loop under it).
func (r *Replica) poke() {
	if r.loop != nil {
		r.loop.poke()
	}
}

// endFan takes fan out of the edits' reach (its partition released).
func (r *Replica) endFan(fan *fanout.Partition) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	delete(r.subs.fans, fan)
	delete(r.subs.records, fan)
}

// flusher is position.Partition's Flush.
type flusher interface {
	Flush(ctx context.Context) error
}

// Paused reports whether subscription name is the replica's and paused.
func (r *Replica) Paused(name string) bool {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	return r.subs.paused[name]
}
