package forward_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// stallProxy relays TCP between clients and a NATS server and can stall:
// while stalled it holds what either side sends, as a server that stopped
// answering (a stopped process, a frozen network) would; on resume it
// delivers it all in order.
type stallProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		p.resume()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	conns.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, s)
			mu.Unlock()
			conns.Go(func() { p.relay(s, c) })
			conns.Go(func() { p.relay(c, s) })
		}
	})
	return p
}

// relay copies from src to dst, holding each chunk while stalled.
func (p *stallProxy) relay(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or closed: the other side is gone
			return
		}
	}
}

func (p *stallProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *stallProxy) stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

func (p *stallProxy) resume() {
	p.mu.Lock()
	p.stalled = false
	p.mu.Unlock()
	p.cond.Broadcast()
}

// outcomes records every Outcome a Forwarder reports.
type outcomes struct {
	mu  sync.Mutex
	all []forward.Outcome
}

func (o *outcomes) Published(out forward.Outcome, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = append(o.all, out)
}

func (o *outcomes) failed() []forward.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []forward.Outcome
	for _, x := range o.all {
		if x.Status == forward.Failed {
			out = append(out, x)
		}
	}
	return out
}

// A publish (a fast batch, or one event at a time) or a reconciliation
// lookup that JetStream does not answer before the handler's context ends
// (the drain's cycle deadline, here shorter than the publish timeout) is an
// outage: drain.UnavailableError, error class timeout (the
// publish_errors_total label), never an ordinary failure that would count
// toward blocking the stream. Once JetStream answers again, the next
// attempt (with Reconcile, as the drain sets it after an outage) stores
// every event once, in order, whether or not the cut publish was stored.
func TestHandleCutByTheDeadlineIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		batched   bool // the JetStream stream allows fast batches
		reconcile bool // the cut attempt reconciles first (the lookup is cut)
	}{
		{name: "fast batch", batched: true},
		{name: "one at a time"},
		{name: "reconciliation lookup", batched: true, reconcile: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := jsbridgetest.StartJetStream(t, embedded.Config{})
			u, err := url.Parse(srv.ClientURL())
			require.NoError(t, err)
			proxy := startStallProxy(t, u.Host)
			nc, err := nats.Connect(proxy.url())
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{
				Name: wire.DefaultEventsStream, Subjects: []string{"events.>"}, AllowBatchPublish: c.batched,
			})
			require.NoError(t, err)
			obs := &outcomes{}
			const publishTimeout = 10 * time.Second
			fwd, err := forward.New(js, forward.Config{PublishTimeout: publishTimeout, Observer: obs})
			require.NoError(t, err)

			evs := events("order-1", 1, 5)
			require.Equal(t, drain.Result{Done: 2}, fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[:2]}})[0])

			proxy.stall()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			began := time.Now()
			res := fwd.Handle(ctx, []drain.Batch{{Stream: "order-1", Events: evs[2:], Reconcile: c.reconcile}})[0]
			cancel()
			require.Less(t, time.Since(began), publishTimeout/2, "cut by the context, not the publish timeout")
			require.Equal(t, 0, res.Done)
			require.True(t, drain.IsUnavailable(res.Err), "an outage, not the stream's fault: %v", res.Err)
			require.False(t, drain.IsNonRetryable(res.Err))
			require.ErrorIs(t, res.Err, context.DeadlineExceeded)
			require.Equal(t, forward.ClassTimeout, forward.ErrorClass(res.Err))
			failed := obs.failed()
			require.Len(t, failed, 1, "one failure reported, for the first event")
			require.Equal(t, forward.ClassTimeout, forward.ErrorClass(failed[0].Err), "the metric's class")
			require.True(t, failed[0].Retryable)

			// An attempt after the deadline sends nothing: its outcome
			// would be as unknown.
			res = fwd.Handle(ctx, []drain.Batch{{Stream: "order-1", Events: evs[2:]}})[0]
			require.True(t, drain.IsUnavailable(res.Err), "%v", res.Err)

			proxy.resume()
			res = fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[2:], Reconcile: true}})[0]
			require.Equal(t, drain.Result{Done: 3}, res)
			require.Equal(t, []string{"1", "2", "3", "4", "5"}, ids(storedVia(t, js)))
		})
	}
}

// storedVia returns the messages of the EVENTS stream, in stream order.
func storedVia(t *testing.T, js jetstream.JetStream) []*jetstream.RawStreamMsg {
	t.Helper()
	return bundle{js: js}.stored(t, "events.")
}
