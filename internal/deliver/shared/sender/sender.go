// Package sender is the shared engine's attempts for one claimed
// partition: Sender, the fan-out's fanout.Sender, makes every attempt
// through the subscription's attempt.Sender (build, sign, breaker, POST,
// classify) behind the claim's lease fence, waits for the endpoint's
// breaker, the subscription's POST slots on the replica (Set), its
// health and throttle, stores an event given up on in the dead-letter
// stream and an ordered one's version as skipped before it settles it,
// and counts the attempts that spent one of MaxDeliver. The replica
// (internal/deliver/shared) makes one per claim; Set is its senders by
// subscription.
package sender

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// minRetry is the pause before an attempt goes again when the settlement
// names none (a POST cut or refused at the lease fence).
const minRetry = 100 * time.Millisecond

// Config is one claim's Sender.
type Config struct {
	// Replica is this replica's id, named in every attempt.
	Replica string
	// StuckAfter bounds an order gate's continuous refusals of an event
	// before it is dead-lettered and its stream parked
	// (attempt.OrderStuck; 0: never).
	StuckAfter time.Duration
	// Clock drives the pauses of the dead letters' retries and the
	// order gate's refusals. Default the real one.
	Clock clockwork.Clock
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Deps are what a Sender uses.
type Deps struct {
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

// Sender is one claimed partition's fanout.Sender: every attempt goes
// through the subscription's attempt.Sender (build, sign, breaker, POST,
// classify), its POST bound by the claim's lease fence. Safe for
// concurrent use.
type Sender struct {
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
}

// New returns the Sender of cfg and deps.
func New(cfg Config, deps Deps) *Sender {
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sender{senders: deps.Senders, claim: deps.Claim, epochs: deps.Epochs, replica: cfg.Replica, letters: deps.Letters,
		deadLettered: deps.DeadLettered, breakers: deps.Breakers, skipped: deps.Skipped, stuckAfter: cfg.StuckAfter,
		clock: cfg.Clock, log: cfg.Logger}
}

// Attempt implements fanout.Sender: one attempt at d, and what it means
// for d's event (a dead letter stored first).
func (s *Sender) Attempt(ctx context.Context, d fanout.Delivery) fanout.Settlement {
	snd := s.senders.Get(d.Subscription)
	if snd == nil {
		// Not a subscription of this replica: the members index and the
		// senders are made together, so this is a bug; nothing is sent.
		s.log.Error("sender: no sender for subscription", slog.String("subscription", d.Subscription))
		return fanout.Settlement{Act: fanout.Retry, Delay: time.Second}
	}
	c := attempt.Call{ID: eventID(d.Event.Header), Replica: s.replica, Fence: s.fence, AfterFailure: d.Attempt > 1,
		Ready: func() (uint64, func(), bool) {
			// While the endpoint's breaker is open (its subscriptions
			// have breaker cursors meanwhile: the replica gives them), for one of
			// the subscription's MaxInFlight slots on the replica (all
			// partitions together), while the subscription is disabled,
			// and for its throttle (rate limit, Retry-After), the
			// attempt waits here, unsent; the partition released ends
			// the wait (ActNotReady). The breaker is waited for first,
			// so an open one holds no slot.
			if s.breakers != nil {
				if err := s.breakers.Breaker(snd.Subscription().URL).Wait(ctx); err != nil {
					return 0, nil, false
				}
			}
			release, ok := s.senders.Acquire(ctx, d.Subscription)
			if !ok {
				return 0, nil, false
			}
			gen, err := snd.Gate(ctx, noHold)
			if err != nil {
				release()
				return 0, nil, false
			}
			return gen, release, true
		}}
	if d.Ordered {
		c.Order = attempt.OrderFieldsOf(d.Event.Header, d.Previous, d.Partition, d.Epoch)
		if c.Order == nil {
			c.Owner = &attempt.Owner{Partition: d.Partition, Epoch: d.Epoch}
		}
	}
	n := s.spent.next(d.Subscription, d.Event.Seq, d.Spent)
	st := snd.Attempt(ctx, eventMsg{ev: d.Event, attempt: n}, n, c)
	defer snd.End(st.Trace)
	var set fanout.Settlement
	switch st.Act {
	case attempt.ActDeadLetter:
		dl := deadletter.Letter{EventID: c.ID, Attempt: n, Status: st.Response.Status, Reason: st.Reason, At: st.Response.At}
		set = s.deadLetter(ctx, snd, d, c, dl, st)
	case attempt.ActWait:
		now := s.clock.Now()
		since := s.spent.refused(d.Subscription, d.Event.Seq, now)
		if dl, stuck := attempt.OrderStuck(since, now, s.stuckAfter, st.Response, c.ID, n); stuck {
			st.Outcome = attempt.OutcomeOrderStuck
			st.Trace.Decide(st.Outcome, st.Class, dl.Reason)
			set = s.deadLetter(ctx, snd, d, c, dl, st)
			break
		}
		set = s.settle(snd, d, st)
	case attempt.ActRetry:
		s.spent.failed(d.Subscription, d.Event.Seq, n)
		set = s.settle(snd, d, st)
	default:
		set = s.settle(snd, d, st)
	}
	switch st.Act {
	case attempt.ActRetry, attempt.ActThrottle, attempt.ActDisable, attempt.ActStale:
		s.spent.answered(d.Subscription, d.Event.Seq) // the gate's refusals must be continuous to count
	}
	if set.Act != fanout.Retry {
		s.spent.settled(d.Subscription, d.Event.Seq)
	} else {
		set.Spent = s.spent.next(d.Subscription, d.Event.Seq, d.Spent) - 1 // the retries entry's count
	}
	return set
}

// fence is the attempts' attempt.PostFence: the claim's lease fence
// alone bounds a POST once it started. The fan-out's context ending (the
// partition released, its fan-out closed) starts nothing more, but a
// POST under way runs to its answer, which the fan-out settles and
// commits before the lease goes (graceful release: cut, the next owner
// would send every one of them again). The lease deadline passing, or
// the lease or the record found lost (Claim.Lose), cuts it with cause
// ErrLeasePassed: an attempt cut so counts for neither the endpoint's
// breaker nor its health, and settles nothing (attempt.ActCut).
func (s *Sender) fence(ctx context.Context) (context.Context, context.CancelFunc, error) {
	return s.claim.Fence.Bound(context.WithoutCancel(ctx))
}

// settle turns an attempt's settlement into the fan-out's, counting the
// outcomes the settler counts (attempt.Sender.Attempt counts the rest).
func (s *Sender) settle(snd *attempt.Sender, d fanout.Delivery, st attempt.Settlement) fanout.Settlement {
	delay := max(st.Delay, minRetry)
	if st.Act == attempt.ActBreakerOpen && s.breakers != nil {
		// Refused at half-open (another attempt is the probe): the next
		// attempt waits for the breaker itself (Ready), so no open
		// timeout's pause here.
		delay = minRetry
	}
	switch st.Act {
	case attempt.ActAck:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		return fanout.Settlement{Act: fanout.Delivered}
	case attempt.ActStale:
		// A receiver processed the stream under a later epoch: this
		// claim is stale. Raise the counter above what it names, and
		// give the partition up.
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		s.epochs.AfterStale(context.Background(), s.log, d.Epoch, st.Response.OrderEpoch)
		s.claim.Lose()
		return fanout.Settlement{Act: fanout.Retry, Delay: delay}
	case attempt.ActRetry, attempt.ActWait, attempt.ActThrottle, attempt.ActDisable:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
	}
	// ActBreakerOpen, ActCut, ActNotSent, ActNotReady: nothing settled.
	return fanout.Settlement{Act: fanout.Retry, Delay: delay}
}

// deadLetter gives d's event up (a permanent answer, the last attempt
// MaxDeliver allows failing, an event that cannot become a webhook, or
// an order gate refusing it for longer than stuckAfter, dl.OrderStuck):
// it stores dl, the attempt's letter, as the old engine does (deadletter.Writer:
// the dead-letter stream's subject dlq.<subscription>.<subject>, the
// event's data and reader headers, the Jsbridge-Dlq-* headers, and an
// ordered attempt's chain headers), retrying in place with backoff while
// the store fails, and only then settles: fanout.Park for an ordered
// subscription with on_dead_letter: park or order-stuck (its stream set
// aside), else
// fanout.DeadLetter (an ordered stream's next event names the same
// predecessor as this one did). The fan-out ending first (the partition
// released) settles nothing: the next owner sends the event again, and
// the dead-letter stream's duplicate window drops a second copy of a
// letter that was stored.
func (s *Sender) deadLetter(ctx context.Context, snd *attempt.Sender, d fanout.Delivery, c attempt.Call, dl deadletter.Letter, st attempt.Settlement) fanout.Settlement {
	sub := snd.Subscription()
	dl.Subscription, dl.Endpoint, dl.Msg = d.Subscription, snd.Endpoint(), eventMsg{ev: d.Event, attempt: dl.Attempt}
	dl = dl.WithOrder(c.Order)
	log := s.log.With(slog.String("subscription", d.Subscription), slog.String("event_id", c.ID),
		slog.Uint64("seq", d.Event.Seq), slog.Int("attempt", dl.Attempt), slog.Int("status", dl.Status))
	if !s.retry(ctx, log, "storing the dead letter failed; retrying in place (the event is not settled meanwhile)", func(ctx context.Context) error {
		if s.letters == nil {
			return nil
		}
		return s.letters.DeadLetter(ctx, dl)
	}) || !s.skip(ctx, log, d, dl) {
		st.Trace.Decide(attempt.OutcomeRetry, st.Class, dl.Reason+" (not settled: the partition was released first)")
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
	if d.Ordered && (sub.OnDeadLetter == subscription.DeadLetterPark || dl.OrderStuck) {
		log.Error("delivery failed for good, "+stored+"; its stream is parked for the subscription until `consumer dlq replay` or `consumer dlq skip`",
			slog.String("outcome", st.Outcome), slog.String("reason", dl.Reason))
		return fanout.Settlement{Act: fanout.Park}
	}
	log.Error("delivery failed for good, "+stored+"; its stream goes on", slog.String("outcome", st.Outcome), slog.String("reason", dl.Reason))
	return fanout.Settlement{Act: fanout.DeadLetter}
}

// skip records an ordered dead letter's version in the positions
// bucket as dead-lettered and not delivered (deadletter.RecordSkipped,
// skipped.<sub>.<stream>, with the predecessor its attempt named), so
// that whoever looks the stream's chain up later, on any replica, steps
// over it (chain.Previous); a replay of the letter forgets it. Retried
// in place like the letter; false when the fan-out ended first. An
// event without a version chain (unordered, or no stream version) has
// nothing to record.
func (s *Sender) skip(ctx context.Context, log *slog.Logger, d fanout.Delivery, dl deadletter.Letter) bool {
	v, prev, ok := dl.Chain()
	if !ok || s.skipped == nil {
		return true
	}
	key := wire.StreamKey(d.Event.Subject)
	return s.retry(ctx, log, "recording the dead-lettered version for its stream's version chain failed; retrying in place", func(ctx context.Context) error {
		return deadletter.RecordSkipped(ctx, s.skipped, d.Subscription, key, v, prev)
	})
}

// retry runs do until it succeeds, pausing with backoff after each
// failure (logged with msg), and reports whether it did; false when ctx
// (the fan-out's) ended first. Each try is bounded by storeTimeout and
// outlives ctx: a write under way is not cut by a hand-over.
func (s *Sender) retry(ctx context.Context, log *slog.Logger, msg string, do func(context.Context) error) bool {
	var pause backoff.Backoff
	for {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		err := do(tctx)
		cancel()
		if err == nil {
			return true
		}
		d := pause.Next()
		log.Error(msg, slog.Any("error", err), slog.Duration("retry_in", d))
		t := s.clock.NewTimer(d)
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
// retryable failure (attempt.ActRetry). fanout.Delivery.Attempt counts
// every call of the Sender, also those that spent none (the breaker
// open, throttled, disabled, refused by an order gate, cut or refused at
// the lease fence), which would dead-letter an event after fewer POSTs
// than MaxDeliver; the old engine counts POSTs only as well
// (failedAttempts). Kept for the claim, from the count earlier owners
// left in the event's retries entry (fanout.Delivery.Spent), which each
// Retry's fanout.Settlement.Spent updates: a hand-over goes on counting.
// Safe for concurrent use; the zero value is ready.
type attempts struct {
	mu sync.Mutex
	n  map[spentKey]int
	// since is when an order gate began refusing the event, its
	// refusals continuous since (OrderStuck).
	since map[spentKey]time.Time
}

type spentKey struct {
	sub string
	seq uint64
}

// next returns the number of the next attempt at sub's event seq: one
// past the attempts spent on this claim or, when more, before it (spent).
func (a *attempts) next(sub string, seq uint64, spent int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(a.n[spentKey{sub, seq}], spent) + 1
}

// failed records attempt n at sub's event seq as spent.
func (a *attempts) failed(sub string, seq uint64, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[spentKey]int{}
	}
	a.n[spentKey{sub, seq}] = n
}

// refused records that an order gate refused sub's event seq at now,
// and returns since when it has refused it without another answer
// between.
func (a *attempts) refused(sub string, seq uint64, now time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := spentKey{sub, seq}
	if since, ok := a.since[k]; ok {
		return since
	}
	if a.since == nil {
		a.since = map[spentKey]time.Time{}
	}
	a.since[k] = now
	return now
}

// answered ends the order gate's refusals of sub's event seq: another
// answer came between.
func (a *attempts) answered(sub string, seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.since, spentKey{sub, seq})
}

// settled forgets sub's event seq.
func (a *attempts) settled(sub string, seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.n, spentKey{sub, seq})
	delete(a.since, spentKey{sub, seq})
}

// noHold is Gate's hold: an event of the shared read has nothing to keep
// from redelivery.
func noHold() func() { return func() {} }

// eventID is the event's id: its Nats-Msg-Id, else its ce-id
// (attempt.EventID, for a reader.Event).
func eventID(h nats.Header) string {
	if id := attempt.HeaderValue(h, wire.HeaderMsgID); id != "" {
		return id
	}
	return attempt.HeaderValue(h, wire.HeaderID)
}

// errNotDelivered is what eventMsg's acknowledgements return: an event
// of the shared read is no JetStream delivery, and nothing acks it.
var errNotDelivered = errors.New("sender: an event of the shared read is not acknowledged")

// eventMsg is a reader.Event as an attempt reads a message: its headers,
// body, subject and metadata (the span's and the record's sequence and
// attempt number). The acknowledgements fail: the positions settle it.
type eventMsg struct {
	ev      reader.Event
	attempt int
}

func (m eventMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.ev.Seq},
		NumDelivered: uint64(max(m.attempt, 1)), Timestamp: m.ev.Time}, nil
}
func (m eventMsg) Data() []byte                     { return m.ev.Data }
func (m eventMsg) Headers() nats.Header             { return m.ev.Header }
func (m eventMsg) Subject() string                  { return m.ev.Subject }
func (m eventMsg) Reply() string                    { return "" }
func (m eventMsg) Ack() error                       { return errNotDelivered }
func (m eventMsg) DoubleAck(context.Context) error  { return errNotDelivered }
func (m eventMsg) Nak() error                       { return errNotDelivered }
func (m eventMsg) NakWithDelay(time.Duration) error { return errNotDelivered }
func (m eventMsg) InProgress() error                { return errNotDelivered }
func (m eventMsg) Term() error                      { return errNotDelivered }
func (m eventMsg) TermWithReason(string) error      { return errNotDelivered }

var _ jetstream.Msg = eventMsg{}

// NewSet returns an empty set.
func NewSet() *Set { return &Set{m: map[string]*attempt.Sender{}} }

// Set is the replica's attempt.Sender of each subscription, by name:
// replaced as the subscription is put again, dropped as it is removed,
// while the claims' Senders read it. Beside each, the subscription's POST slots on the replica:
// MaxInFlight is per consumer process (subscription.Subscription), so
// every partition the replica owns draws from the one bound.
type Set struct {
	mu    sync.RWMutex
	m     map[string]*attempt.Sender
	slots map[string]chan struct{}
}

// Get returns subscription name's sender, nil when it has none.
func (ss *Set) Get(name string) *attempt.Sender {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	return ss.m[name]
}

// Put makes snd the sender of subscription name (nil: none); its slots
// are made again only when its MaxInFlight changed (the POSTs running
// free the slots they took).
func (ss *Set) Put(name string, snd *attempt.Sender) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if snd == nil {
		delete(ss.m, name)
		delete(ss.slots, name)
		return
	}
	ss.m[name] = snd
	if n := snd.Subscription().MaxInFlight; n > 0 && cap(ss.slots[name]) != n {
		if ss.slots == nil {
			ss.slots = map[string]chan struct{}{}
		}
		ss.slots[name] = make(chan struct{}, n)
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
		out[name] = len(slots)
	}
	return out
}

// Acquire waits for one of subscription name's POST slots on the
// replica and returns its release; false when ctx ended first. A
// subscription without slots (MaxInFlight 0, or none) takes none.
func (ss *Set) Acquire(ctx context.Context, name string) (release func(), ok bool) {
	ss.mu.RLock()
	slots := ss.slots[name]
	ss.mu.RUnlock()
	if slots == nil {
		return func() {}, true
	}
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, true
	case <-ctx.Done():
		return nil, false
	}
}
