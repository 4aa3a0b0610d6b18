package integration

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// fenceWatch is a receiver behind webhook's order gate (memory stores)
// that fails 5 % of requests with 500 before the gate. Per stream it
// records the order of each version's first POST and the versions the
// handler processed, with when; per Jsbridge-Order value the gate's
// refusals; the POSTs of a version already processed (re-sends) and those
// of a version whose predecessor was not processed yet (sent early: the
// sender broke its promise, whatever the gate answered); per replica its
// last POST.
type fenceWatch struct {
	streams  int
	mu       sync.Mutex
	firsts   map[int][]int        // versions in the order of their first POST
	seen     map[int]map[int]bool // versions POSTed at least once
	done     map[int][]int        // versions processed, in order
	doneAt   map[int][]time.Time  // when each of done was processed
	refused  map[string]int       // gate answers by Jsbridge-Order
	resent   int                  // POSTs of a version already processed
	early    []string             // POSTs of a version before its predecessor was processed
	lastPost map[string]time.Time // replica -> its last POST's arrival
	// hold, when set, is called on a request of replica before it is
	// answered (the test freezes the replica there, or makes the receiver
	// slow).
	hold func(replica string)
}

func newFenceWatch(t *testing.T, streams int) (*fenceWatch, *httptest.Server) {
	w := &fenceWatch{streams: streams, firsts: map[int][]int{}, seen: map[int]map[int]bool{}, done: map[int][]int{},
		doneAt: map[int][]time.Time{}, refused: map[string]int{}, lastPost: map[string]time.Time{}}
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	gate := webhook.NewOrderGate(webhook.NewMemoryOrderStore())
	h := webhook.Handler(v, webhook.NewMemoryStore(1<<20), time.Hour, func(_ context.Context, r *http.Request, _ []byte) error {
		s, ver := w.event(r.Header.Get(wire.HeaderIdempotencyKey))
		w.mu.Lock()
		w.done[s] = append(w.done[s], ver)
		w.doneAt[s] = append(w.doneAt[s], time.Now())
		w.mu.Unlock()
		return nil
	}, webhook.WithOrderGate(gate), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		s, ver := w.event(r.Header.Get(wire.HeaderIdempotencyKey))
		w.mu.Lock()
		if w.seen[s] == nil {
			w.seen[s] = map[int]bool{}
		}
		if !w.seen[s][ver] {
			w.seen[s][ver] = true
			w.firsts[s] = append(w.firsts[s], ver)
		}
		switch {
		case slices.Contains(w.done[s], ver):
			w.resent++
		case ver > 0 && !slices.Contains(w.done[s], ver-1):
			w.early = append(w.early, fmt.Sprintf("stream %d: version %d sent by %s while version %d was not processed",
				s, ver, r.Header.Get(wire.HeaderReplica), ver-1))
		}
		w.lastPost[r.Header.Get(wire.HeaderReplica)] = time.Now()
		hold := w.hold
		w.mu.Unlock()
		if hold != nil {
			hold(r.Header.Get(wire.HeaderReplica))
		}
		if rand.IntN(20) == 0 {
			rw.WriteHeader(http.StatusInternalServerError)
			return
		}
		rec := &statusRecorder{ResponseWriter: rw, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		if o := rw.Header().Get(wire.HeaderOrder); o != "" && rec.status == http.StatusConflict {
			w.mu.Lock()
			w.refused[o]++
			w.mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	return w, srv
}

// holdOnce makes the first request of replica that reaches the receiver
// call act before it is answered; the channel closes once act returned.
func (w *fenceWatch) holdOnce(replica string, act func()) <-chan struct{} {
	done := make(chan struct{})
	var once sync.Once
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hold = func(r string) {
		if r != replica {
			return
		}
		once.Do(func() {
			act()
			close(done)
		})
	}
	return done
}

// event maps an event id of jsBundle.publish(first=1) to its stream and
// version.
func (w *fenceWatch) event(id string) (stream, version int) {
	var n int
	_, _ = fmt.Sscan(id, &n)
	return n % w.streams, (n - 1) / w.streams
}

func (w *fenceWatch) processed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, d := range w.done {
		n += len(d)
	}
	return n
}

// check fails unless every stream's first POSTs came in version order and
// the handler processed exactly 0..perStream-1 in order (none missing,
// none twice); it logs the gate's refusals.
func (w *fenceWatch) check(t *testing.T, perStream int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	want := make([]int, perStream)
	for i := range want {
		want[i] = i
	}
	bad := 0
	for s := range w.streams {
		if !equalInts(w.firsts[s], want) || !equalInts(w.done[s], want) {
			if bad++; bad <= 10 {
				t.Errorf("stream %d: first POSTs %v, processed %v; want 0..%d in order", s, w.firsts[s], w.done[s], perStream-1)
			}
		}
	}
	t.Logf("order gate refusals: %v", w.refused)
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A replica loses its lease without dying while 3 replicas deliver 500
// streams to a gated receiver failing 5 % with 500: SIGSTOPped mid-POST
// for longer than the lease TTL (2 s) but shorter than AckWait (4 s), for
// longer than AckWait, or cut off from NATS (not from the endpoint) by a
// proxy that stops forwarding for 6 s. Every stream's first POSTs come in
// version order and the handler processes every stream exactly in order.
// The last case kills instead: r1 and then r2 are SIGKILLed mid-POST and
// started again, and the same must hold.
func TestOrderedZombieReplicaIsFenced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		freeze time.Duration // SIGSTOP for this long; 0: cut off from NATS
		kill   bool          // SIGKILL r1, then r2, mid-POST and restart them
	}{
		{"frozen past the lease, below AckWait", 3 * time.Second, false},
		{"frozen past AckWait", 6 * time.Second, false},
		{"cut off from NATS", 0, false},
		{"killed mid-POST and restarted", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const streams = 500
			perStream := 10
			if tc.kill {
				perStream = 30 // two kills and restarts need events left to hold
			}
			events := streams * perStream
			b := setupJetStream(t)
			watch, rsrv := newFenceWatch(t, streams)
			env := []string{"JSBRIDGE_SECRET=" + testSecret}
			natsURL := b.srv.ClientURL()
			var proxy *tcpProxy
			if tc.freeze == 0 && !tc.kill {
				proxy = newTCPProxy(t, strings.TrimPrefix(natsURL, "nats://"))
				natsURL = "nats://" + proxy.addr()
			}
			start := func(id, url string) *proc {
				p := startProc(t, env, "consumer", append(orderedArgs(url, rsrv.URL, "--max-in-flight", "64", "--log-level", "info"), "--replica-id", id)...)
				require.True(t, waitFor(20*time.Second, func() bool { return strings.Contains(p.out.String(), "consumer started") }), "%s started:\n%s", id, p.out.String())
				return p
			}
			zombie := start("r1", natsURL)
			second := start("r2", b.srv.ClientURL())
			start("r3", b.srv.ClientURL())
			publishVersions(t, b, events, streams)
			require.True(t, waitProgress(func() bool { return watch.processed() >= events/4 }, watch.processed, 60*time.Second, 3*time.Minute), "a quarter processed")

			switch {
			case tc.kill:
				// SIGKILL r1 while one of its POSTs is at the receiver; the
				// others take its partitions over; r1 starts again. Then
				// the same for r2, started again at once.
				for i, id := range []string{"r1", "r2"} {
					victim := []*proc{zombie, second}[i]
					select {
					case <-watch.holdOnce(id, func() {
						if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
							t.Errorf("SIGKILL %s: %v", id, err)
						}
					}):
					case <-time.After(time.Minute):
						t.Fatalf("no POST of %s reached the receiver within a minute (%d of %d processed)", id, watch.processed(), events)
					}
					<-victim.exited
					if id == "r1" {
						at := watch.processed()
						require.True(t, waitProgress(func() bool { return watch.processed() > at+events/20 }, watch.processed, 30*time.Second, time.Minute), "the others go on")
					}
					restarted := start(id, b.srv.ClientURL())
					if id == "r1" {
						zombie = restarted
					}
				}
			case tc.freeze > 0:
				// Freeze r1 while one of its POSTs is at the receiver.
				frozen := watch.holdOnce("r1", func() {
					if err := zombie.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
						t.Errorf("SIGSTOP: %v", err)
					}
				})
				<-frozen
				frozeAt := time.Now()
				t.Cleanup(func() { _ = zombie.cmd.Process.Signal(syscall.SIGCONT) })
				at := watch.processed()
				// Frozen for tc.freeze (its lease expires meanwhile) while
				// the others take its partitions over and go on.
				require.True(t, waitProgress(func() bool { return time.Since(frozeAt) >= tc.freeze && watch.processed() > at },
					watch.processed, 30*time.Second, time.Minute), "the others go on")
				require.NoError(t, zombie.cmd.Process.Signal(syscall.SIGCONT))
			default:
				proxy.block()
				at := watch.processed()
				require.True(t, waitProgress(func() bool { return watch.processed() > at+events/20 }, watch.processed, 30*time.Second, time.Minute), "the others go on")
				require.True(t, waitFor(30*time.Second, func() bool { return strings.Contains(zombie.out.String(), "lease deadline passed") }),
					"r1 stops pulling past its deadline:\n%s", zombie.out.String())
				proxy.resume()
			}
			require.True(t, waitProgress(func() bool { return watch.processed() >= events }, watch.processed, 60*time.Second, 3*time.Minute),
				"all processed: %d of %d; r1:\n%s", watch.processed(), events, zombie.out.String())
			watch.check(t, perStream)
			t.Logf("r1 (the zombie):\n%s", grepLines(zombie.out.String(), "lease", "order gate", "pulling"))
		})
	}
}

// tcpProxy forwards connections to a target until blocked: then it stops
// forwarding (both ways, connections kept open) until resumed.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{} // closed while forwarding
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpProxy{ln: ln, target: target, open: make(chan struct{})}
	close(p.open)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *tcpProxy) block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = make(chan struct{})
}

func (p *tcpProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.open)
}

func (p *tcpProxy) serve(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				<-p.gate() // blocked: hold what was read until resumed
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
}

// grepLines returns the lines of out containing any of words.
func grepLines(out string, words ...string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				b.WriteString(l + "\n")
				break
			}
		}
	}
	return b.String()
}

// publishVersions publishes events 1..n as jsBundle.publish(first=1, n,
// streams) numbers them (event id i: version (i-1)/streams of stream
// order-<i mod streams>, the version in ce-streamversion too, as an order
// gate reads it), 1,000 at a time.
func publishVersions(t *testing.T, b *jsBundle, n, streams int) {
	t.Helper()
	for first := 1; first <= n; first += 1000 {
		require.NoError(t, publishVersionRange(b, first, min(first+999, n), streams))
	}
}

// publishVersionRange publishes events first..last numbered as
// publishVersions numbers them and waits for every publish ack (30 s at
// most). It returns the first error; it may run outside the test's
// goroutine.
func publishVersionRange(b *jsBundle, first, last, streams int) error {
	futures := make([]jetstream.PubAckFuture, 0, last-first+1)
	for id := first; id <= last; id++ {
		e := event.Event{ID: int64(id), Stream: fmt.Sprintf("order-%d", id%streams), Version: int64((id - 1) / streams),
			Name: "OrderNoted", Data: fmt.Appendf(nil, `{"n":%d}`, id), Created: time.Now()}
		f, err := b.js.PublishMsgAsync(forward.Message(e, forward.Config{}))
		if err != nil {
			return fmt.Errorf("publish event %d: %w", id, err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("publish event %s: %w", f.Msg().Header.Get(jetstream.MsgIDHeader), err)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("publish ack of event %s timed out", f.Msg().Header.Get(jetstream.MsgIDHeader))
		}
	}
	return nil
}
