package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
)

// The consumer row's receiver (the webhook endpoint) runs in a child
// process of its own (bench -receiver-child), so that the CPU its HTTP
// server spends per delivery is measured apart from the consumer's and
// from this process's (which hosts the JetStream server). It is the same
// sink the other rows run in process: net/http, read the body, note the
// Idempotency-Key, answer 204; no signature check.

// Paths the receiver child serves besides the webhook's (sink.url's /hook).
const (
	receiverCountPath = "/count" // GET: distinct Idempotency-Keys seen, decimal
	receiverResetPath = "/reset" // POST: forget them
)

// receiverChild is the -receiver-child mode: it serves a sink on addr
// ("127.0.0.1:<port>") with /count and /reset beside /hook until ctx
// ends (SIGTERM).
func receiverChild(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-receiver-child %q: %w", addr, err)
	}
	s := &sink{seen: map[string]bool{}}
	mux := http.NewServeMux()
	mux.Handle("POST /hook", s)
	mux.HandleFunc("GET "+receiverCountPath, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strconv.FormatInt(s.n.Load(), 10))
	})
	// For -profile-dir (env.profile).
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("POST "+receiverResetPath, func(w http.ResponseWriter, _ *http.Request) {
		s.reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return serveUntil(ctx, ln, mux)
}

// receiver is the receiver child as this process sees it.
type receiver struct {
	p      *proc.Process
	port   int    // on 127.0.0.1; it also serves /debug/pprof/profile
	url    string // the webhook's URL (POST)
	base   string // http://127.0.0.1:<port>
	client *http.Client
}

// startReceiver starts this program as a receiver child and returns it
// once it answers.
func (e *env) startReceiver(ctx context.Context, self string) (*receiver, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := e.procs.Start("receiver", self, []string{"-receiver-child", addr})
	if err != nil {
		return nil, err
	}
	r := &receiver{p: p, port: port, url: "http://" + addr + "/hook", base: "http://" + addr, client: &http.Client{Timeout: 5 * time.Second}}
	if err := proc.WaitReady(ctx, r.base+receiverCountPath, p); err != nil {
		return nil, err
	}
	return r, nil
}

// count is the number of distinct Idempotency-Keys the receiver has seen
// since it started or was last reset; an error once it has exited.
func (r *receiver) count() (int64, error) {
	if r.p.Exited() {
		return 0, errors.New("receiver process ended early")
	}
	resp, err := r.client.Get(r.base + receiverCountPath)
	if err != nil {
		return 0, fmt.Errorf("receiver count: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("receiver count: %w", err)
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("receiver count %q: %w", b, err)
	}
	return n, nil
}

// reached reports whether the receiver has seen n distinct keys (a
// waitFor condition).
func (r *receiver) reached(n int) (bool, error) {
	got, err := r.count()
	return got >= int64(n), err
}

// reset makes the receiver forget the keys it has seen.
func (r *receiver) reset() error {
	resp, err := r.client.Post(r.base+receiverResetPath, "", nil)
	if err != nil {
		return fmt.Errorf("receiver reset: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("receiver reset: status %d", resp.StatusCode)
	}
	return nil
}

// cpu is the CPU time (user + system) the receiver process has used so far.
func (r *receiver) cpu() (time.Duration, error) {
	return processCPU(r.p.Pid())
}

// cpuNow is cpu, or 0 when it cannot be read.
func (r *receiver) cpuNow() time.Duration {
	d, _ := r.cpu()
	return d
}

// consumerCPURow starts the name of the consumer ÷ receiver CPU row (the
// history finds it by it).
const consumerCPURow = "CPU per delivery during the consumer row"

// consumerCPU is the CPU time (user + system) per delivery of the consumer
// process (over its whole life) and of the receiver process (while the
// consumer delivered) in the consumer row.
type consumerCPU struct {
	deliveries         int
	consumer, receiver time.Duration
	// bareLoop and bareReceiver are the same for the bare loop process
	// (-bare-consumer-child) with the same receiver.
	bareLoop, bareReceiver time.Duration
}

// perDelivery is d in microseconds per delivery.
func (c consumerCPU) perDelivery(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(max(c.deliveries, 1))
}

// row is the "CPU per delivery, consumer ÷ the endpoint's HTTP server" row
// (target ≤ 1.5).
func (c consumerCPU) row() row {
	cons, recv := c.perDelivery(c.consumer), c.perDelivery(c.receiver)
	ratio := cons / recv
	return row{
		Name: fmt.Sprintf(consumerCPURow+" (%d deliveries): the consumer process against the endpoint's HTTP server "+
			"(the receiver, a process of its own: net/http, read the body, note the Idempotency-Key, 204)", c.deliveries),
		Ours: fmt.Sprintf("consumer %.1f µs/delivery", cons),
		Reference: fmt.Sprintf("receiver %.1f µs/delivery (during the bare loop process: loop %.1f, receiver %.1f µs/delivery, ratio %.2f)",
			recv, c.perDelivery(c.bareLoop), c.perDelivery(c.bareReceiver), c.perDelivery(c.bareLoop)/c.perDelivery(c.bareReceiver)),
		Ratio:  fmt.Sprintf("%.2f", ratio),
		Target: "≤ 1.5",
		Met:    ratio <= 1.5,
	}
}

// serveUntil serves h on ln until ctx ends, then shuts the server down
// (5 s for the requests in flight); it returns Serve's error if serving
// stops first. The receiver children's server.
func serveUntil(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
