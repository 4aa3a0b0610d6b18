package attempt

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// A replica waking from a freeze finds the POSTs it had in flight timed
// out by its own stall. Cut at the partition's lease deadline
// (leaseFence.bound, through Call.Fence), they count nothing on the
// endpoint's breaker: before, their failures opened the (shared) breaker
// for every replica at each wake-up. The same failures cut for another
// reason open it.
func TestFailuresAnsweredAfterTheLeaseDeadlineDoNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // answers only once the POST was cut
		case <-r.Context().Done():
		case <-stop:
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(rc.Close)
	t.Cleanup(func() { close(stop) }) // before rc.Close
	cutBy := func(cause error) PostFence {
		return func(ctx context.Context) (context.Context, func() bool, error) {
			pctx, cancel := context.WithCancelCause(ctx)
			time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
			return pctx, func() bool { cancel(nil); return false }, nil
		}
	}
	// timedOutPast is a fence whose lease passed while the POST ran, but
	// whose cut came after the POST's own timeout: a replica waking from
	// a freeze, its timers all due at once, in no set order.
	timedOutPast := func(ctx context.Context) (context.Context, func() bool, error) {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		return pctx, func() bool { cancel(); return true }, nil
	}
	post := func(r *Sender, fence PostFence) {
		msg := reader.Event{Subject: "events.order.order-1.OrderNoted", Header: nats.Header{wire.HeaderMsgID: {"1"}, wire.HeaderID: {"1"}, wire.HeaderType: {"OrderNoted"},
			wire.HeaderSubject: {"order-1"}, wire.HeaderSource: {"jsbridge"}, wire.HeaderSpecVersion: {"1.0"}}, Data: []byte(`{}`)}
		for range 5 {
			s := r.Attempt(context.Background(), msg, 1, Call{Fence: fence})
			r.End(s.Trace)
			require.Error(t, s.Response.Err, "the POST was cut")
			if errors.Is(s.Response.Err, ErrLeasePassed) {
				require.Equal(t, ActCut, s.Act, "cut by the lease: nothing settled from it")
			} else {
				require.Equal(t, ActRetry, s.Act)
			}
		}
	}
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 5}, nil, nil)
	require.NoError(t, err)
	sub := subscription.Subscription{Name: "orders", URL: rc.URL + "/hook", FilterSubjects: []string{"events.>"}, Secrets: []string{"x"}, AllowPrivate: true}.WithDefaults()
	br := set.Breaker(sub.URL)
	r := newTestSender(t, sub, rc.Client(), Deps{Breaker: br})
	post(r, cutBy(ErrLeasePassed))
	require.Equal(t, breaker.Closed, br.State(), "POSTs cut at the lease deadline are not counted")
	post(r, timedOutPast)
	require.Equal(t, breaker.Closed, br.State(), "POSTs failed once the lease passed are not counted, whichever timer fired first")
	post(r, cutBy(errors.New("cut for another reason")))
	require.Equal(t, breaker.Open, br.State(), "the same failures for another reason open it")
}
