package attempt

// The attempts of one claimed partition: Claim, the fan-out's
// fanout.Sender, makes every attempt through the subscription's Sender
// (build, sign, breaker, POST, classify) behind the claim's lease fence,
// waits for the endpoint's breaker, the subscription's POST slots on the
// replica (Set), its health and throttle, stores an event given up on in
// the dead-letter stream and an ordered one's version as skipped before
// it settles it, and counts the attempts that spent one of MaxDeliver.
// The replica (internal/deliver/shared) makes one per claim; Set is its
// senders by subscription.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// minRetry is the pause before an attempt goes again when the settlement
// names none (a POST cut or refused at the lease fence).
const minRetry = 100 * time.Millisecond

// ClaimConfig is one claim's attempts (Claim).
type ClaimConfig struct {
	// Archetype is the engine's clock (the pauses of the dead letters'
	// retries and the order gate's refusals), logger and replica id
	// (named in every attempt). Default base.Default.
	*base.Archetype
	// StuckAfter bounds an order gate's continuous refusals of an event
	// before it is dead-lettered and its stream parked
	// (OrderStuck; 0: never).
	StuckAfter time.Duration
}

// ClaimDeps are what a Claim uses.
type ClaimDeps struct {
	// Senders are the replica's senders and POST slots. Required.
	Senders *Set
	// Claim is the partition's claim: its lease fence bounds every POST,
	// and a receiver naming a later epoch loses it. Required.
	Claim *owner.Claim
	// Epochs is the lease epoch counter, raised above an epoch a
	// receiver names (owner.Epochs.AfterStale).
	Epochs owner.Epochs
	// Letters stores the dead letters (nil: each is logged, not stored);
	// DeadLettered counts them by subscription (nil: not counted).
	Letters      deadletter.Writer
	DeadLettered *prometheus.CounterVec
	// Breakers are the endpoints' circuit breakers: an attempt waits
	// for its endpoint's (nil: it does not).
	Breakers *breaker.Set
	// Skipped is the positions bucket: the dead-lettered versions of
	// ordered subscriptions' streams (skipped.<sub>.<stream>; nil: none
	// recorded).
	Skipped jetstream.KeyValue
}

// Claim is one claimed partition's fanout.Sender: every attempt goes
// through the subscription's Sender (build, sign, breaker, POST,
// classify), its POST bound by the claim's lease fence. Safe for
// concurrent use.
type Claim struct {
	senders      *Set
	claim        *owner.Claim
	epochs       owner.Epochs
	replica      string
	letters      deadletter.Writer
	deadLettered *prometheus.CounterVec
	breakers     *breaker.Set
	skipped      jetstream.KeyValue
	stuckAfter   time.Duration
	clock        clockwork.Clock
	log          *slog.Logger
	// spent counts the attempts each event in retry spent on this claim
	// (attempts).
	spent attempts
	// byURL holds the endpoints' breakers by subscription URL (breaker).
	byURL sync.Map
}

// NewClaim returns the Claim of cfg and deps.
func NewClaim(cfg ClaimConfig, deps ClaimDeps) *Claim {
	cfg.Archetype = base.Default(cfg.Archetype)
	return &Claim{senders: deps.Senders, claim: deps.Claim, epochs: deps.Epochs, replica: cfg.Replica, letters: deps.Letters,
		deadLettered: deps.DeadLettered, breakers: deps.Breakers, skipped: deps.Skipped, stuckAfter: cfg.StuckAfter,
		clock: cfg.Clock, log: cfg.Logger}
}

// Attempt implements fanout.Sender: one attempt at d, and what it means
// for d's event. The path is straight: the attempt (Sender: body,
// sign, breaker, POST, verdict, behind the ready wait and the lease
// fence), its count (attempts), then one switch over its act (settle):
// delivered, dead-lettered (stored first), the claim stale, or tried
// again.
func (s *Claim) Attempt(ctx context.Context, d fanout.Delivery) fanout.Settlement {
	snd := s.senders.Get(d.Subscription)
	if snd == nil {
		// Not a subscription of this replica: the members index and the
		// senders are made together, so this is a bug; nothing is sent.
		s.log.Error("sender: no sender for subscription", slog.String("subscription", d.Subscription))
		return fanout.Settlement{Act: fanout.Retry, Delay: time.Second}
	}
	k := spentKey{d.Subscription, d.Event.Seq}
	n := s.spent.next(k, d.Spent)
	st := snd.Attempt(ctx, d.Event, n, s.call(ctx, snd, d))
	defer snd.End(st.Trace)
	refused, stuck := s.spent.count(k, n, st.Act, s.clock.Now(), s.stuckAfter)
	if stuck {
		// The order-stuck state (DefaultOrderStuckAfter): the
		// gate's refusals turn into a dead letter that parks the stream.
		st.Act, st.Outcome = ActDeadLetter, OutcomeOrderStuck
		st.Reason = fmt.Sprintf("order-stuck: the receiver's order gate refused the event (%s) for %s, longer than --order-stuck-after %s",
			st.Response.Order, refused.Round(time.Second), s.stuckAfter)
	}
	set := s.settle(ctx, snd, d, n, &st, stuck)
	st.Trace.Decide(st.Outcome, st.Class, st.Reason)
	if set.Act == fanout.Retry {
		set.Spent = s.spent.next(k, d.Spent) - 1 // the retries entry's count
	}
	return set
}

// call is the attempt's parameters for d: the replica, the version
// chain of an ordered subscription's event, the claim's lease fence,
// and the wait before the POST (Ready). While the endpoint's breaker is
// open (its subscriptions have breaker cursors meanwhile: the replica
// gives them), for one of the subscription's MaxInFlight slots on the
// replica (all partitions together), while the subscription is
// disabled, and for its throttle (rate limit, Retry-After), the attempt
// waits there, unsent (for a slot, oldest event first); the partition
// released ends the wait (ActNotReady). The breaker is waited for first,
// so an open one holds no slot.
func (s *Claim) call(ctx context.Context, snd *Sender, d fanout.Delivery) Call {
	c := Call{Replica: s.replica, Fence: s.fence, AfterFailure: d.Attempt > 1,
		Ready: func() (uint64, func(), bool) {
			if s.breakers != nil {
				if err := s.breaker(snd.Subscription().URL).Wait(ctx); err != nil {
					return 0, nil, false
				}
			}
			release, ok := s.senders.Acquire(ctx, d.Subscription, d.Event.Seq)
			if !ok {
				return 0, nil, false
			}
			gen, err := snd.Gate(ctx)
			if err != nil {
				release()
				return 0, nil, false
			}
			return gen, release, true
		}}
	if d.Ordered {
		c.Chain = &Chain{Previous: d.Previous, Partition: d.Partition, Epoch: d.Epoch}
	}
	return c
}

// breaker is the circuit breaker of the endpoint at url, looked up in the
// set once per URL and claim: breaker.Set.Breaker parses the URL and
// takes the set's lock, which every attempt of every partition would
// otherwise share; the set never drops a breaker it made.
func (s *Claim) breaker(url string) *breaker.Breaker {
	if b, ok := s.byURL.Load(url); ok {
		return b.(*breaker.Breaker)
	}
	b := s.breakers.Breaker(url)
	s.byURL.Store(url, b)
	return b
}

// fence is the attempts' PostFence: the claim's lease fence
// alone bounds a POST once it started. The fan-out's context ending (the
// partition released, its fan-out closed) starts nothing more, but a
// POST under way runs to its answer, which the fan-out settles and
// commits before the lease goes (graceful release: cut, the next owner
// would send every one of them again). The lease deadline passing, or
// the lease or the record found lost (Claim.Lose), cuts it with cause
// ErrLeasePassed: an attempt cut so counts for neither the endpoint's
// breaker nor its health, and settles nothing (ActCut).
func (s *Claim) fence(ctx context.Context) (context.Context, func() bool, error) {
	return s.claim.Fence.Bound(context.WithoutCancel(ctx))
}

// settle turns attempt n's settlement st into the fan-out's, counting
// the outcomes the settler counts (Sender.Attempt counts the
// rest): delivered; given up on (deadLetter); the claim stale (a
// receiver processed the stream under a later epoch: the epoch counter
// is raised above what it names and the partition given up); else the
// event goes again after the settlement's delay. ActBreakerOpen, ActCut,
// ActNotSent and ActNotReady settle and count nothing.
func (s *Claim) settle(ctx context.Context, snd *Sender, d fanout.Delivery, n int, st *Settlement, stuck bool) fanout.Settlement {
	delay := max(st.Delay, minRetry)
	switch st.Act {
	case ActAck:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		return fanout.Settlement{Act: fanout.Delivered}
	case ActDeadLetter:
		return s.deadLetter(ctx, snd, d, n, st, stuck)
	case ActStale:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		s.epochs.AfterStale(context.Background(), s.log, d.Epoch, st.Response.OrderEpoch)
		s.claim.Lose()
	case ActRetry, ActWait, ActThrottle, ActDisable:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
	case ActBreakerOpen:
		if s.breakers != nil {
			// Refused at half-open (another attempt is the probe): the
			// next attempt waits for the breaker itself (Ready), so no
			// open timeout's pause here.
			delay = minRetry
		}
	}
	return fanout.Settlement{Act: fanout.Retry, Delay: delay}
}

// deadLetter gives d's event up (a permanent answer, the last attempt
// MaxDeliver allows failing, an event that cannot become a webhook, or
// an order gate refusing it for longer than stuckAfter: stuck): it
// stores the letter and an ordered event's skipped version (store), and
// only then settles: fanout.Park for an ordered subscription with
// on_dead_letter: park or order-stuck (its stream set aside), else
// fanout.DeadLetter (an ordered stream's next event names the same
// predecessor as this one did). The fan-out ending first (the partition
// released) settles nothing: the next owner sends the event again, and
// the dead-letter stream's duplicate window drops a second copy of a
// letter that was stored.
func (s *Claim) deadLetter(ctx context.Context, snd *Sender, d fanout.Delivery, n int, st *Settlement, stuck bool) fanout.Settlement {
	log := s.log.With(slog.String("subscription", d.Subscription), slog.String("event_id", st.EventID),
		slog.Uint64("seq", d.Event.Seq), slog.Int("attempt", n), slog.Int("status", st.Response.Status))
	if !s.store(ctx, log, snd, d, n, st, stuck) {
		st.Outcome, st.Reason = OutcomeRetry, st.Reason+" (not settled: the partition was released first)"
		return fanout.Settlement{Act: fanout.Retry, Delay: minRetry}
	}
	snd.Count(st.Outcome, st.Class, st.Response.Status)
	if s.letters != nil && s.deadLettered != nil {
		s.deadLettered.WithLabelValues(d.Subscription).Inc()
	}
	stored := "dead-lettered"
	if s.letters == nil {
		stored = "given up on (no dead-letter stream configured: not stored)"
	}
	if d.Ordered && (snd.Subscription().OnDeadLetter == subscription.DeadLetterPark || stuck) {
		log.Error("delivery failed for good, "+stored+"; its stream is parked for the subscription until `consumer dlq replay` or `consumer dlq skip`",
			slog.String("outcome", st.Outcome), slog.String("reason", st.Reason))
		return fanout.Settlement{Act: fanout.Park}
	}
	log.Error("delivery failed for good, "+stored+"; its stream goes on", slog.String("outcome", st.Outcome), slog.String("reason", st.Reason))
	return fanout.Settlement{Act: fanout.DeadLetter}
}

// store writes the dead letter of attempt n at d's event, as the old
// engine did (deadletter.Writer: the dead-letter stream's subject
// dlq.<subscription>.<subject>, the event's data and reader headers, the
// Jsbridge-Dlq-* headers, and an ordered attempt's chain headers), then
// records an ordered dead letter's version in the positions bucket as
// dead-lettered and not delivered (deadletter.RecordSkipped,
// skipped.<sub>.<stream>, with the predecessor its attempt named), so
// that whoever looks the stream's chain up later, on any replica, steps
// over it (chain.Previous); a replay of the letter forgets it. An event
// without a version chain (unordered, or no stream version) has nothing
// to record. While a write fails it is tried again in place with
// backoff (the event is not settled meanwhile), each try bounded by
// storeTimeout and outliving ctx (a write under way is not cut by a
// hand-over); false when ctx (the fan-out's) ended first.
func (s *Claim) store(ctx context.Context, log *slog.Logger, snd *Sender, d fanout.Delivery, n int, st *Settlement, stuck bool) bool {
	dl := deadletter.Letter{Subscription: d.Subscription, Endpoint: snd.Endpoint(), EventID: st.EventID, Attempt: n,
		Status: st.Response.Status, Reason: st.Reason, At: st.Response.At, OrderStuck: stuck,
		Event: deadletter.Event{Seq: d.Event.Seq, Subject: d.Event.Subject, Header: d.Event.Header, Data: d.Event.Data, Time: d.Event.Time}}.WithOrder(st.Order)
	var chain func(context.Context) error // the skipped version's record, if it has one
	if st.Order != nil && s.skipped != nil {
		key := wire.StreamKey(d.Event.Subject)
		chain = func(ctx context.Context) error {
			return deadletter.RecordSkipped(ctx, s.skipped, d.Subscription, key, st.Order.Version, st.Order.Previous)
		}
	}
	try := func(write func(context.Context) error) error {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		defer cancel()
		return write(tctx)
	}
	letters := s.letters // nil: logged, not stored (or stored: not again)
	var pause backoff.Backoff
	for {
		failed, err := "storing the dead letter failed; retrying in place (the event is not settled meanwhile)", error(nil)
		if letters != nil {
			if err = try(func(ctx context.Context) error { return letters.DeadLetter(ctx, dl) }); err == nil {
				letters, pause = nil, backoff.Backoff{}
			}
		}
		if err == nil && chain != nil {
			failed = "recording the dead-lettered version for its stream's version chain failed; retrying in place"
			if err = try(chain); err == nil {
				chain = nil
			}
		}
		if err == nil {
			return true
		}
		wait := pause.Next()
		log.Error(failed, slog.Any("error", err), slog.Duration("retry_in", wait))
		t := s.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.Chan():
		}
	}
}

// storeTimeout bounds one write of a dead letter or a skipped version.
const storeTimeout = 10 * time.Second

// attempts counts, per (subscription, event), the attempts that spent
// one of the subscription's MaxDeliver: the POSTs answered with a
// retryable failure (ActRetry). fanout.Delivery.Attempt counts
// every call of the Claim, also those that spent none (the breaker
// open, throttled, disabled, refused by an order gate, cut or refused at
// the lease fence), which would dead-letter an event after fewer POSTs
// than MaxDeliver; the old engine counted POSTs only as well. Beside
// the count, since when an order gate has refused the event without
// another answer between (the order-stuck state). Kept for the claim,
// from the count earlier owners left in the event's retries entry
// (fanout.Delivery.Spent), which each Retry's fanout.Settlement.Spent
// updates: a hand-over goes on counting. Safe for concurrent use; the
// zero value is ready.
type attempts struct {
	mu    sync.Mutex
	n     map[spentKey]int
	since map[spentKey]time.Time
}

type spentKey struct {
	sub string
	seq uint64
}

// next returns the number of the next attempt at k's event: one past
// the attempts spent on this claim or, when more, before it (spent).
func (a *attempts) next(k spentKey, spent int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(a.n[k], spent) + 1
}

// count records what attempt n at k's event came to, act at now, and
// returns how long an order gate has refused the event without another
// answer between (0 unless act is ActWait), and whether that is
// stuckAfter or longer (stuck; stuckAfter 0: never). A retryable failure
// spends attempt n; any other answer than the gate's refusal ends a run
// of refusals; an event acked, dead-lettered or stuck is forgotten (a
// dead letter the fan-out's end keeps from being stored is forgotten
// too: the claim, and this count with it, ends). Acts that sent nothing
// (breaker open, cut, not sent, not ready) change nothing.
func (a *attempts) count(k spentKey, n int, act Act, now time.Time, stuckAfter time.Duration) (refused time.Duration, stuck bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch act {
	case ActWait:
		since, ok := a.since[k]
		if !ok {
			if a.since == nil {
				a.since = map[spentKey]time.Time{}
			}
			since, a.since[k] = now, now
		}
		refused = now.Sub(since)
		if stuck = stuckAfter > 0 && refused >= stuckAfter; !stuck {
			return refused, false
		}
	case ActRetry:
		if a.n == nil {
			a.n = map[spentKey]int{}
		}
		a.n[k] = n
		delete(a.since, k)
		return 0, false
	case ActThrottle, ActDisable, ActStale:
		delete(a.since, k)
		return 0, false
	case ActAck, ActDeadLetter:
	default:
		return 0, false
	}
	delete(a.n, k)
	delete(a.since, k)
	return refused, stuck
}

// NewSet returns an empty set.
func NewSet() *Set { return &Set{m: map[string]*Sender{}} }

// Set is the replica's Sender of each subscription, by name:
// replaced as the subscription is put again, dropped as it is removed,
// while the Claims read it. Beside each, the subscription's POST slots on the replica:
// MaxInFlight is per consumer process (subscription.Subscription), so
// every partition the replica owns draws from the one bound.
type Set struct {
	mu    sync.RWMutex
	m     map[string]*Sender
	slots map[string]*slots
}

// Get returns subscription name's sender, nil when it has none.
func (ss *Set) Get(name string) *Sender {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	return ss.m[name]
}

// Put makes snd the sender of subscription name (nil: none); its slots
// are made again only when its MaxInFlight changed (the POSTs running
// free the slots they took).
func (ss *Set) Put(name string, snd *Sender) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if snd == nil {
		delete(ss.m, name)
		delete(ss.slots, name)
		return
	}
	ss.m[name] = snd
	if n := snd.Subscription().MaxInFlight; n > 0 && (ss.slots[name] == nil || ss.slots[name].limit != n) {
		if ss.slots == nil {
			ss.slots = map[string]*slots{}
		}
		ss.slots[name] = newSlots(n)
	}
}

// InFlight returns, by subscription, the POST slots taken on the
// replica (jsbridge_consumer_in_flight): attempts that hold one, from
// the slot to the answer.
func (ss *Set) InFlight() map[string]int {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	out := make(map[string]int, len(ss.slots))
	for name, slots := range ss.slots {
		out[name] = slots.inFlight()
	}
	return out
}

// Acquire waits for one of subscription name's POST slots on the
// replica for the event at seq (its sequence in the events stream) and
// returns its release; false when ctx ended first. While every slot is
// taken, the one freed next goes to the waiting event of lowest
// sequence (slots). A subscription without slots (MaxInFlight 0, or
// none) takes none.
func (ss *Set) Acquire(ctx context.Context, name string, seq uint64) (release func(), ok bool) {
	ss.mu.RLock()
	sl := ss.slots[name]
	ss.mu.RUnlock()
	if sl == nil {
		return func() {}, true
	}
	if !sl.acquire(ctx, seq) {
		return nil, false
	}
	return sl.release, true
}
