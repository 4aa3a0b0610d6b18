package attempt

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// The room's own tests: one Attempt against a real HTTP server
// (httptest), with fake breaker and health it owns the interfaces of,
// and time on the archetype's fake clock: the throttle's, and the one
// that stamps the POST.

// fakeBreaker is a Breaker that is open or closed as told, counting the
// failures Execute saw and the reads of its state.
type fakeBreaker struct {
	open     atomic.Bool
	failures atomic.Int32
	states   atomic.Int32
}

func (b *fakeBreaker) Execute(fn func() error) error {
	if b.open.Load() {
		return breaker.ErrOpen
	}
	err := fn()
	if err != nil && !errors.Is(err, breaker.ErrExcluded) {
		b.failures.Add(1)
	}
	return err
}

func (b *fakeBreaker) State() breaker.State {
	b.states.Add(1)
	if b.open.Load() {
		return breaker.Open
	}
	return breaker.Closed
}

func (b *fakeBreaker) OpenTimeout() time.Duration { return 30 * time.Second }

// fakeHealth records what an attempt told it.
type fakeHealth struct {
	mu        sync.Mutex
	succeeded int
	failed    int
	disabled  []health.DisabledRecord
}

func (h *fakeHealth) Succeeded(string) { h.mu.Lock(); h.succeeded++; h.mu.Unlock() }
func (h *fakeHealth) Failed(string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed++
	return false
}
func (h *fakeHealth) Disable(_ context.Context, rec health.DisabledRecord) {
	h.mu.Lock()
	h.disabled = append(h.disabled, rec)
	h.mu.Unlock()
}
func (h *fakeHealth) IsDisabled(string) bool                    { return false }
func (h *fakeHealth) WaitEnabled(context.Context, string) error { return nil }

// records is an attemptlog.Recorder keeping what it was given.
type records struct {
	mu  sync.Mutex
	all []attemptlog.Attempt
}

func (r *records) RecordAttempt(a attemptlog.Attempt) {
	r.mu.Lock()
	r.all = append(r.all, a)
	r.mu.Unlock()
}
func (r *records) list() []attemptlog.Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]attemptlog.Attempt(nil), r.all...)
}

// bundle is one test's sender and what surrounds it.
type bundle struct {
	snd     *Sender
	br      *fakeBreaker
	health  *fakeHealth
	records *records
	clock   *clockwork.FakeClock
	// requests are the requests the receiver got.
	requests chan *http.Request
}

// setup starts a receiver answering with answer and returns a Sender of
// a subscription with MaxDeliver 3 and the backoff 1 s, 5 s POSTing to it.
func setup(t *testing.T, answer http.HandlerFunc) *bundle {
	t.Helper()
	b := &bundle{br: &fakeBreaker{}, health: &fakeHealth{}, records: &records{}, requests: make(chan *http.Request, 16),
		clock: clockwork.NewFakeClockAt(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC))}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.requests <- r.Clone(context.Background())
		answer(w, r)
	}))
	t.Cleanup(rc.Close)
	sub := subscription.Subscription{Name: "orders", URL: rc.URL + "/hook", FilterSubjects: []string{"events.>"}, Secrets: []string{"x"},
		AllowPrivate: true, MaxDeliver: 3, BackOff: []time.Duration{time.Second, 5 * time.Second}}.WithDefaults()
	b.snd = newTestSender(t, sub, rc.Client(), Deps{Breaker: b.br, Health: b.health, Archetype: base.New(b.clock, nil, ""), Attempts: b.records})
	return b
}

// orderPlaced is a message of event 1042, stream order-42 version 3.
func orderPlaced() reader.Event {
	return reader.Event{Seq: 7, Subject: "events.order.order-42.OrderPlaced", Header: nats.Header{
		wire.HeaderMsgID: {"1042"}, wire.HeaderID: {"1042"}, wire.HeaderType: {"OrderPlaced"}, wire.HeaderSubject: {"order-42"},
		wire.HeaderSource: {"jsbridge"}, wire.HeaderSpecVersion: {"1.0"}, wire.HeaderContentType: {"application/json"},
		wire.HeaderStreamVersion: {"3"},
	}, Data: []byte(`{"order":"order-42"}`)}
}

func status(code int, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(code)
	}
}

// A 2xx: ActAck; the request is signed and stamped on the clock,
// carries the Idempotency-Key and the replica; the health hears of the
// success. On the first attempt the attempts record does not get it (the
// default, attemptlog.ModeFailures); after a failure in place it does,
// at the clock's time.
func TestAttemptAcksA2xx(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	s := b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{Replica: "r1"})
	b.snd.End(s.Trace)
	require.Equal(t, ActAck, s.Act)
	require.Equal(t, OutcomeAck, s.Outcome)
	require.Equal(t, "2xx", s.Class)
	require.Equal(t, http.StatusNoContent, s.Response.Status)
	require.Equal(t, b.clock.Now(), s.Response.At, "sent at the clock's time")

	req := <-b.requests
	require.Equal(t, "1042", req.Header.Get(wire.HeaderIdempotencyKey))
	require.Equal(t, "r1", req.Header.Get(wire.HeaderReplica))
	require.Equal(t, strconv.FormatInt(b.clock.Now().Unix(), 10), req.Header.Get(webhook.HeaderWebhookTimestamp), "signed at the clock's time")
	require.NotEmpty(t, req.Header.Get(webhook.HeaderWebhookSignature))

	require.Equal(t, 1, b.health.succeeded)
	require.Empty(t, b.records.list(), "a 2xx on the first attempt is not recorded")

	s = b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{AfterFailure: true})
	b.snd.End(s.Trace)
	require.Equal(t, ActAck, s.Act)
	<-b.requests
	rec := b.records.list()
	require.Len(t, rec, 1, "the 2xx ending a series with a failure is recorded")
	require.Equal(t, OutcomeAck, rec[0].Outcome)
	require.Equal(t, b.clock.Now(), rec[0].At)
	require.Equal(t, http.StatusNoContent, rec[0].Status)
}

// The breaker's state is read for what names it (a recording span's
// attribute, the attempts record), not for an attempt nothing keeps: it
// takes the breaker's lock, shared by every POST to the endpoint.
func TestAttemptEndReadsTheBreakerStateOnlyForARecord(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	s := b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{})
	b.snd.End(s.Trace)
	<-b.requests
	require.Empty(t, b.records.list())
	require.Zero(t, b.br.states.Load(), "a first-attempt 2xx, untraced: nothing names the state")

	b = setup(t, status(http.StatusInternalServerError))
	s = b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{})
	b.snd.End(s.Trace)
	<-b.requests
	rec := b.records.list()
	require.Len(t, rec, 1)
	require.Equal(t, breaker.Closed.String(), rec[0].Breaker, "the record names the state")
}

// A 5xx: ActRetry after the backoff's entry for the attempt, an endpoint
// failure for the breaker and the health; on the last attempt
// (MaxDeliver) it is dead-lettered as exhausted.
func TestAttemptRetriesThenExhausts(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusInternalServerError))
	s := b.snd.Attempt(context.Background(), orderPlaced(), 2, Call{})
	b.snd.End(s.Trace)
	require.Equal(t, ActRetry, s.Act)
	require.Equal(t, 5*time.Second, s.Delay, "the backoff's second entry")
	require.EqualValues(t, 1, b.br.failures.Load())
	require.Equal(t, 1, b.health.failed)

	s = b.snd.Attempt(context.Background(), orderPlaced(), 3, Call{})
	b.snd.End(s.Trace)
	require.Equal(t, ActDeadLetter, s.Act)
	require.Equal(t, OutcomeExhausted, s.Outcome)
	require.Equal(t, "HTTP 500 Internal Server Error (attempt 3 of MaxDeliver 3)", s.Reason)
}

// A 503 with Retry-After throttles: ActThrottle with the delay asked
// for, no breaker failure, and the throttle holds the next POST until
// the engine's clock passed it and the cut rate lets it go.
func TestAttemptThrottledHoldsTheNextPost(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusServiceUnavailable, "Retry-After", "3"))
	s := b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{})
	b.snd.End(s.Trace)
	require.Equal(t, ActThrottle, s.Act)
	require.Equal(t, 3*time.Second, s.Delay)
	require.Zero(t, b.br.failures.Load(), "a throttling answer is no endpoint failure")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.snd.Gate(ctx)
		done <- err
	}()
	require.NoError(t, b.clock.BlockUntilContext(ctx, 1))
	select {
	case <-done:
		t.Fatal("the gate let a POST through inside the Retry-After")
	default:
	}
	// Past the Retry-After, the rate the cut set (no 2xx seen: its
	// floor, one POST in 5 s from the cut) lets it go.
	b.clock.Advance(3 * time.Second)
	for range 10 {
		select {
		case err := <-done:
			require.NoError(t, err)
			require.False(t, math.IsInf(b.snd.throttle.Rate(), 1), "the rate was cut (and grows back a step a second)")
			return
		case <-time.After(20 * time.Millisecond):
			b.clock.Advance(time.Second)
		}
	}
	t.Fatal("the gate still holds the POST 13 s after the cut")
}

// A 410 Gone disables the subscription (ActDisable), with the endpoint
// and the status in the record.
func TestAttemptGoneDisables(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusGone))
	s := b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{})
	b.snd.End(s.Trace)
	require.Equal(t, ActDisable, s.Act)
	require.Len(t, b.health.disabled, 1)
	require.Equal(t, health.ReasonGone, b.health.disabled[0].Reason)
	require.Equal(t, http.StatusGone, b.health.disabled[0].Status)
}

// A message without an event id cannot become a webhook: ActDeadLetter
// (term), no POST, and its attempt recorded.
func TestAttemptMalformedIsNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	msg := orderPlaced()
	delete(msg.Header, wire.HeaderMsgID)
	delete(msg.Header, wire.HeaderID)
	s := b.snd.Attempt(context.Background(), msg, 1, Call{})
	b.snd.End(s.Trace)
	require.Equal(t, ActDeadLetter, s.Act)
	require.Equal(t, OutcomeTerm, s.Outcome)
	require.Equal(t, ClassNone, s.Class)
	require.Zero(t, s.Response.Status)
	require.Empty(t, b.requests)
	require.Len(t, b.records.list(), 1)
}

// The breaker open: nothing sent, ActBreakerOpen with its open timeout.
func TestAttemptBreakerOpen(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	b.br.open.Store(true)
	s := b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{})
	b.snd.End(s.Trace)
	require.Equal(t, ActBreakerOpen, s.Act)
	require.Equal(t, OutcomeBreakerOpen, s.Outcome)
	require.Equal(t, 30*time.Second, s.Delay)
	require.Empty(t, b.requests)
}

// The ordered path's parameters: Ready may refuse the attempt (nothing
// started); its done is called once the POST ended; a fence refusing
// the POST sends nothing and records nothing (ActNotSent); without a
// version chain the owner's partition and epoch go unsigned; with one,
// the order fields are signed.
func TestAttemptOrderedParameters(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	ctx := context.Background()

	s := b.snd.Attempt(ctx, orderPlaced(), 1, Call{Ready: func() (uint64, func(), bool) { return 0, nil, false }})
	require.Equal(t, ActNotReady, s.Act)
	require.Nil(t, s.Trace)

	refused := func(ctx context.Context) (context.Context, func() bool, error) {
		return nil, nil, ErrLeasePassed
	}
	s = b.snd.Attempt(ctx, orderPlaced(), 1, Call{Fence: refused})
	require.Equal(t, ActNotSent, s.Act)
	require.Nil(t, s.Trace)
	require.Empty(t, b.requests)
	require.Empty(t, b.records.list(), "not sent: no record")

	var released atomic.Bool
	ready := func() (uint64, func(), bool) { return 0, func() { released.Store(true) }, true }
	unversioned := orderPlaced()
	delete(unversioned.Header, wire.HeaderStreamVersion)
	s = b.snd.Attempt(ctx, unversioned, 1, Call{Ready: ready, Chain: &Chain{Previous: 2, Partition: 4, Epoch: 9}})
	b.snd.End(s.Trace)
	require.Equal(t, ActAck, s.Act)
	require.Nil(t, s.Order, "no stream version: no version chain")
	require.True(t, released.Load(), "done called once the POST ended")
	req := <-b.requests
	require.Equal(t, "4", req.Header.Get(wire.HeaderPartition))
	require.Equal(t, "9", req.Header.Get(wire.HeaderLeaseEpoch))
	require.Empty(t, req.Header.Get(wire.HeaderOrderSignature))

	s = b.snd.Attempt(ctx, orderPlaced(), 1, Call{Chain: &Chain{Previous: 2, Partition: 4, Epoch: 9}})
	b.snd.End(s.Trace)
	require.Equal(t, ActAck, s.Act)
	require.Equal(t, "1042", s.EventID)
	require.Equal(t, &webhook.OrderFields{Stream: "order-42", Version: 3, Previous: 2, Partition: 4, Epoch: 9}, s.Order)
	req = <-b.requests
	require.Equal(t, "2", req.Header.Get(wire.HeaderPreviousVersion))
	require.Equal(t, "4", req.Header.Get(wire.HeaderPartition))
	require.NotEmpty(t, req.Header.Get(wire.HeaderOrderSignature))
}

// The structured-mode body of an event is built once, by its first
// webhook, and the event's other webhooks (another subscription, a
// retry) send the same bytes; data that is not JSON cannot go in a
// structured-mode body, so every structured-mode webhook of the event is
// dead-lettered without a POST, while a binary-mode one sends the data
// as it is, never checked.
func TestAnEventsStructuredBodyIsBuiltOnceAndItsDataCheckedThere(t *testing.T) {
	t.Parallel()
	bodies := make(chan []byte, 8)
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies <- body
		w.WriteHeader(http.StatusNoContent)
	})
	other := newTestSender(t, b.snd.Subscription(), b.snd.client, Deps{Breaker: b.br, Health: b.health})
	binarySub := b.snd.Subscription()
	binarySub.Body = subscription.BodyBinary
	binary := newTestSender(t, binarySub, b.snd.client, Deps{Breaker: b.br, Health: b.health})

	ev := orderPlaced()
	ev.Envelope = new(reader.Envelope)
	var sent [][]byte
	for _, snd := range []*Sender{b.snd, other, b.snd} { // two subscriptions, and a retry
		s := snd.Attempt(context.Background(), ev, 1, Call{})
		snd.End(s.Trace)
		require.Equal(t, ActAck, s.Act)
		sent = append(sent, <-bodies)
	}
	first, err := ev.Envelope.Body(func() ([]byte, error) { return nil, errors.New("built again") })
	require.NoError(t, err, "the first webhook built it")
	for _, body := range sent {
		require.Equal(t, string(first), string(body))
	}

	bad := orderPlaced()
	bad.Data, bad.Envelope = []byte(`{"order":`), new(reader.Envelope)
	for _, snd := range []*Sender{b.snd, other} {
		s := snd.Attempt(context.Background(), bad, 1, Call{})
		snd.End(s.Trace)
		require.Equal(t, ActDeadLetter, s.Act)
		require.Equal(t, OutcomeTerm, s.Outcome)
		require.Contains(t, s.Reason, "data is not JSON")
	}
	require.Empty(t, bodies, "nothing was sent")
	s := binary.Attempt(context.Background(), bad, 1, Call{})
	binary.End(s.Trace)
	require.Equal(t, ActAck, s.Act)
	require.Equal(t, `{"order":`, string(<-bodies), "binary mode sends the data as it is")
}

// A webhook says Accept-Encoding: gzip, as net/http's transport would
// add it by itself, but set with the subscription's static headers (no
// map of the transport's own each request); a subscription's own
// Accept-Encoding is sent instead. Jsbridge-Replica names the replica
// on every webhook.
func TestAWebhookCarriesAcceptEncodingAndTheReplica(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	for range 2 {
		s := b.snd.Attempt(context.Background(), orderPlaced(), 1, Call{Replica: "replica-7"})
		b.snd.End(s.Trace)
		require.Equal(t, ActAck, s.Act)
		req := <-b.requests
		require.Equal(t, []string{"gzip"}, req.Header.Values("Accept-Encoding"))
		require.Equal(t, []string{"replica-7"}, req.Header.Values(wire.HeaderReplica))
	}
	require.Equal(t, "gzip", StaticHeaders(nil, "ua").Get("Accept-Encoding"))
	require.Equal(t, "identity", StaticHeaders(map[string]string{"accept-encoding": "identity"}, "ua").Get("Accept-Encoding"))
}

// An event's trace parent, under any case of its header name, is the
// parent of every webhook made of it (read once an event: its copies
// share the Envelope); an event without one sends none.
func TestAttemptCarriesTheEventsTraceParent(t *testing.T) {
	t.Parallel()
	b := setup(t, status(http.StatusNoContent))
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ev := orderPlaced()
	ev.Header["Traceparent"] = []string{parent}
	ev.Envelope = new(reader.Envelope)
	for range 2 {
		s := b.snd.Attempt(context.Background(), ev, 1, Call{Replica: "r1"})
		b.snd.End(s.Trace)
		require.Equal(t, ActAck, s.Act)
		got := (<-b.requests).Header.Get("traceparent")
		require.Equal(t, parent[:35], got[:min(len(got), 35)], "the event's trace id")
	}

	plain := orderPlaced()
	plain.Envelope = new(reader.Envelope)
	s := b.snd.Attempt(context.Background(), plain, 1, Call{Replica: "r1"})
	b.snd.End(s.Trace)
	require.Empty(t, (<-b.requests).Header.Get("traceparent"))
}
