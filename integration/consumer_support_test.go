package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// jsBundle is a JetStream server with the EVENTS stream and a client: what
// consumer tests need (no Postgres).
type jsBundle struct {
	srv *embedded.Server
	js  jetstream.JetStream
	ctx context.Context
}

func setupJetStream(t *testing.T) *jsBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	srv, js := testJetStream(t)
	_, err := forward.Provision(ctx, js, forward.StreamConfig{})
	require.NoError(t, err)
	return &jsBundle{srv: srv, js: js, ctx: ctx}
}

// publish publishes events as the bridge does (forward.Message): ids
// first..first+n-1, each in stream "order-<id % streams>", and returns the
// event ids as the webhooks carry them.
func (b *jsBundle) publish(t *testing.T, first int64, n, streams int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range int64(n) {
		id := first + i
		e := event.Event{ID: id, Stream: fmt.Sprintf("order-%d", id%int64(streams)), Version: i / int64(streams),
			Name: "OrderNoted", Data: fmt.Appendf(nil, `{"n":%d}`, id), Created: time.Now()}
		f, err := b.js.PublishMsgAsync(forward.Message(e, forward.Config{}))
		require.NoError(t, err)
		futures = append(futures, f)
		ids = append(ids, event.FormatID(id))
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("publish ack timed out")
		}
	}
	return ids
}

// startConsumer runs an in-process consumer (the public package, as an
// application runs it) with cfg and subs until the test ends, and returns
// its dead-letter stream, which Provision made.
func (b *jsBundle) startConsumer(t *testing.T, cfg consumer.Config, subs ...consumer.Subscription) *consumer.DeadLetters {
	t.Helper()
	nc, err := b.srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cfg.Subscriptions = subs
	c, err := consumer.New(js, cfg)
	require.NoError(t, err)
	runUntilCleanup(t, c.Run)
	return c.DeadLetters()
}

// lastByPartition maps each partition (of partitions) to the last of the
// events first..first+n-1 that publish put in it: event id i is stream
// sequence i on a fresh EVENTS, in stream "order-<i % streams>".
func lastByPartition(first int64, n, streams, partitions int) map[int]uint64 {
	last := map[int]uint64{}
	for i := range int64(n) {
		id := first + i
		last[wire.StreamPartition(fmt.Sprintf("order-%d", id%int64(streams)), partitions)] = uint64(id)
	}
	return last
}

// waitSettled waits until the positions bucket shows every partition of
// last settled up to its last event for every subscription (the floor),
// with nothing in retry and no cursor: nothing is left to deliver.
func (b *jsBundle) waitSettled(t *testing.T, last map[int]uint64, d time.Duration) {
	t.Helper()
	var behind []string
	require.Eventually(t, func() bool {
		parts, err := consumer.ReadSharedPositions(b.ctx, b.js)
		if err != nil {
			return false
		}
		behind = behind[:0]
		seen := 0
		for _, p := range parts {
			want, ok := last[p.Partition]
			if ok {
				seen++
			}
			if p.Record.Floor < want || len(p.Record.Retries) > 0 || len(p.Cursors) > 0 {
				behind = append(behind, fmt.Sprintf("p%d: floor %d of %d, %d retries, %d cursors",
					p.Partition, p.Record.Floor, want, len(p.Record.Retries), len(p.Cursors)))
			}
		}
		return seen == len(last) && len(behind) == 0
	}, d, 100*time.Millisecond, "every partition settled to its last event: %v", behind)
}

// hits is an httptest endpoint recording each request's arrival and
// Idempotency-Key and answering with respond.
type hits struct {
	*httptest.Server
	mu      sync.Mutex
	at      []time.Time
	keys    []string
	respond func(w http.ResponseWriter, r *http.Request)
}

func newHits(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) *hits {
	t.Helper()
	h := &hits{respond: respond}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.at = append(h.at, time.Now())
		h.keys = append(h.keys, r.Header.Get("Idempotency-Key"))
		h.mu.Unlock()
		h.respond(w, r)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hits) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.keys)
}

// distinct returns the number of distinct Idempotency-Keys seen.
func (h *hits) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, k := range h.keys {
		seen[k] = true
	}
	return len(seen)
}

func (h *hits) snapshot() ([]time.Time, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Time(nil), h.at...), append([]string(nil), h.keys...)
}

// proc is a consumer process the test may kill.
type proc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{} // closed when the process has exited; then err is set
	err    error
}

// startProc starts bin with args; at cleanup a process still running gets
// SIGTERM and must exit 0 within 20 s.
func startProc(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(filepath.Join(binaries(t), bin), args...), out: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return // killed (or exited) during the test
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
			if p.err != nil {
				t.Errorf("%s exited with %v after SIGTERM; output:\n%s", bin, p.err, p.out.String())
			}
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			t.Errorf("%s did not exit within 20 s of SIGTERM; output:\n%s", bin, p.out.String())
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to die.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("process did not die after SIGKILL")
	}
}

// waitFor polls cond every 10 ms until it holds (true) or d passes (false).
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// waitProgress polls every 20 ms until done holds (true), for as long as
// count keeps rising: it gives up (false) only when count did not rise for
// stall, or after limit in all. A loaded machine makes a run longer, not
// red; a stall still fails.
func waitProgress(done func() bool, count func() int, stall, limit time.Duration) bool {
	end := time.Now().Add(limit)
	last, since := count(), time.Now()
	for !done() {
		if time.Since(since) > stall || time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
		if n := count(); n > last {
			last, since = n, time.Now()
		}
	}
	return true
}
