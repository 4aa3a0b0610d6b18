package deliver

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/wire"
)

// claimStore is a breaker.Store in memory; onSwap runs before each swap
// is written, with its number (1-based).
type claimStore struct {
	mu     sync.Mutex
	st     breaker.SharedState
	rev    uint64
	swaps  int
	onSwap func(n int, st breaker.SharedState)
}

func (s *claimStore) Load(context.Context, string) (breaker.SharedState, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st, s.rev, nil
}

func (s *claimStore) Swap(_ context.Context, st breaker.SharedState, rev uint64) (uint64, error) {
	s.mu.Lock()
	s.swaps++
	n, hook := s.swaps, s.onSwap
	s.mu.Unlock()
	if hook != nil {
		hook(n, st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rev != rev {
		return 0, breaker.ErrConflict
	}
	s.rev++
	s.st = st
	return s.rev, nil
}

// set writes st at the next revision and returns it.
func (s *claimStore) set(st breaker.SharedState) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rev++
	s.st = st
	return s.rev
}

// hookTracer is a tracer that calls onStart when an attempt's span starts
// (after the lease fence's first check, before the breaker).
type hookTracer struct {
	trace.Tracer
	onStart func()
}

func (h hookTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if h.onStart != nil {
		h.onStart()
	}
	return h.Tracer.Start(ctx, name, opts...)
}

// eventMsg is an ackMsg of stream order-1 with the headers and body of an
// event the bridge published.
type eventMsg struct{ *ackMsg }

func newEventMsg(seq uint64) eventMsg {
	m := newAckMsg(seq)
	for k, v := range map[string]string{
		wire.HeaderMsgID: "1042", wire.HeaderID: "1042", wire.HeaderType: "OrderNoted", wire.HeaderSubject: "order-1",
		wire.HeaderSource: "jsbridge", wire.HeaderSpecVersion: "1.0", wire.HeaderContentType: "application/json",
		wire.HeaderTime: "2026-11-28T12:00:00Z",
	} {
		m.h.Set(k, v)
	}
	return eventMsg{m}
}

func (m eventMsg) Data() []byte { return []byte(`{"n":1}`) }

// probeSender makes pt deliver to a new httptest receiver (answering 204,
// counting its POSTs) through a breaker shared through store as replica
// "a", with tracer's spans.
func probeSender(t *testing.T, pt *partition, store breaker.Store, tracer trace.Tracer) (*atomic.Int32, *breaker.Set) {
	t.Helper()
	var posts atomic.Int32
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		posts.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	set, err := breaker.NewSet(breaker.Settings{}, nil, nil)
	require.NoError(t, err)
	set.Share(store, "a")
	sub := subscription.Subscription{Name: "orders", URL: rc.URL + "/hook", FilterSubjects: []string{"events.>"}, Secrets: []string{"x"}, AllowPrivate: true}.WithDefaults()
	r := newTestRunner(t, sub, rc.Client(), set.Breaker(sub.URL), pt.clock, tracer)
	pt.hol.r = r
	pt.hol.slots = make(chan struct{}, 1)
	pt.hol.parking = park.New(park.Config{}, park.Deps{})
	return &posts, set
}

// A replica frozen across the probe claim: the lease fence passed before
// the attempt, then a half-open shared breaker claimed the probe (a swap
// against the shared state, up to 2 s in production) and the replica's
// clock passed the lease deadline meanwhile. No POST is sent (the
// receiver sees none) and the event is neither acked nor Nak'd; once the
// lease is found lost the delivery ends. Without the freeze, the same
// path POSTs and acks.
func TestPartitionFrozenAcrossTheProbeClaimSendsNothing(t *testing.T) {
	t.Parallel()
	for _, frozen := range []bool{true, false} {
		name := "frozen"
		if !frozen {
			name = "not frozen"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			pt, clock, _ := fencedPartition(t) // the lease deadline 3 s ahead
			store := &claimStore{}
			var endpoint string
			var set *breaker.Set
			claimed := make(chan breaker.SharedState, 1)
			store.onSwap = func(n int, st breaker.SharedState) {
				if n == 1 { // the probe claim
					if frozen {
						clock.Advance(5 * time.Second) // frozen while the claim runs
					}
					claimed <- st
				}
			}
			// Past the fence's first check (mayStart), the shared state
			// is seen half-open: another replica's probe claim ran out.
			tracer := hookTracer{Tracer: tracing.Tracer(noop.NewTracerProvider()), onStart: func() {
				st := breaker.SharedState{Endpoint: endpoint, State: breaker.HalfOpen, Prober: "b", Until: time.Now().Add(-time.Millisecond)}
				set.Observe(st, store.set(st))
			}}
			var posts *atomic.Int32
			posts, set = probeSender(t, pt, store, tracer)
			endpoint = pt.hol.r.endpoint
			m := newEventMsg(10)

			done := make(chan struct{})
			go func() { pt.hol.deliver(m); close(done) }()
			select {
			case st := <-claimed:
				require.Equal(t, breaker.HalfOpen, st.State)
				require.Equal(t, "a", st.Prober, "this replica claimed the probe")
			case <-ctx.Done():
				t.Fatal("no probe claim")
			}
			if !frozen {
				select {
				case <-done:
				case <-ctx.Done():
					t.Fatal("not delivered")
				}
				require.Equal(t, int32(1), posts.Load(), "POSTed")
				require.Equal(t, int32(1), m.acks.Load(), "acked")
				return
			}
			// The delivery waits for its lease (a renewal), on the clock.
			require.NoError(t, clock.BlockUntilContext(ctx, 2), "the keep-alive timer and waitLease")
			require.Zero(t, posts.Load(), "no POST past the lease deadline")
			pt.lease.Lose() // the renewal finds the key taken
			pt.release()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("the delivery did not end after the lease was lost")
			}
			require.Zero(t, posts.Load(), "no POST")
			require.Zero(t, m.acks.Load()+m.naks.Load(), "neither acked nor Nak'd: it goes back by AckWait")
		})
	}
}

// Lease time across a suspended VM: the monotonic clock (the fake one
// here) stops while the machine is suspended, the wall clock does not. A
// replica woken after a suspension longer than its lease holds nothing:
// no attempt starts, no ack or InProgress is sent, a POST running is cut
// when its timer next looks; a renewal after the wake holds again.
func TestPartitionWokenAfterASuspensionLongerThanItsLeaseHoldsNothing(t *testing.T) {
	t.Parallel()
	pt, clock, _ := fencedPartition(t)
	var suspended atomic.Int64 // wall time the fake (monotonic) clock missed
	pt.lease.SetWallClock(func(t time.Time) time.Time { return t.Add(time.Duration(suspended.Load())) })
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second))
	m := newAckMsg(10)
	require.True(t, pt.lease.MayStart())
	require.NoError(t, pt.lease.inProgress(m))

	clock.Advance(time.Second)
	suspended.Store(int64(10 * time.Second)) // suspended for 10 s; the monotonic clock saw none of it
	require.True(t, clock.Now().Before(pt.lease.Deadline()), "the monotonic reading alone says the lease holds")
	require.False(t, pt.lease.MayStart(), "no attempt starts")
	require.ErrorIs(t, pt.lease.mayAck(), errLeasePassed, "no ack, Nak or InProgress")
	require.ErrorIs(t, pt.lease.inProgress(m), errLeasePassed)
	_, _, err := pt.lease.Bound(context.Background())
	require.ErrorIs(t, err, errLeasePassed, "no POST")
	require.Equal(t, int32(1), m.inProgress.Load())

	// A renewal after the wake (its start read on both clocks) holds.
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second))
	require.True(t, pt.lease.MayStart())
	require.NoError(t, pt.lease.mayAck())
}
