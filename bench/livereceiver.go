package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/webhook"
)

// The live pipeline rows' receiver: the webhook endpoint as a user writes
// it, in a process of its own (bench -live-receiver-child). It verifies
// every signature with package webhook (Standard Webhooks), decodes the
// CloudEvent (structured or binary mode), notes when the first delivery
// of each event arrived, and answers 204 after a set delay, the work a
// real endpoint does. Both pipelines POST to it, each subscription on a
// path of its own (/hook/<subscription>), so the receiver's cost is the
// same for both.

// liveSecretEnv names the environment variable holding the signing
// secret the receiver verifies with and the bare pipeline signs with (so
// that it is never in a process's arguments).
const liveSecretEnv = "JSBRIDGE_BENCH_LIVE_SECRET"

// Paths the live receiver serves besides POST /hook/<subscription>.
const (
	liveCountPath    = "/live/count"    // GET ?sub=<subscription>: distinct events received, decimal
	liveReceiptsPath = "/live/receipts" // GET ?sub=<subscription>: one line an event: "<ce-id> <received µs>"
	liveRejectedPath = "/live/rejected" // GET: requests refused (bad signature or not a CloudEvent), decimal
	liveResetPath    = "/live/reset"    // POST: forget every receipt
	liveTotalPath    = "/live/total"    // GET: "<pairs> <subscriptions>": distinct (subscription, event) pairs received, and subscriptions with one at least
)

// liveReceiver is the receiver child's handler and its receipts.
type liveReceiver struct {
	verifier *webhook.Verifier
	delay    time.Duration
	rejected atomic.Int64
	mu       sync.Mutex
	// receipts holds, by subscription and then by ce-id, when the first
	// request carrying that event arrived (Unix µs).
	receipts map[string]map[string]int64
	pairs    int // entries of receipts, over every subscription
}

// newLiveReceiver returns a receiver verifying with secret (whsec_) and
// answering after delay.
func newLiveReceiver(secret string, delay time.Duration) (*liveReceiver, error) {
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	if err != nil {
		return nil, err
	}
	return &liveReceiver{verifier: v, delay: delay, receipts: map[string]map[string]int64{}}, nil
}

func (lr *liveReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now().UnixMicro()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if err := lr.verifier.Verify(r.Header, body); err != nil {
		lr.rejected.Add(1)
		http.Error(w, webhook.Reason(err), http.StatusUnauthorized)
		return
	}
	ce, err := webhook.DecodeCloudEvent(r, body)
	if err != nil {
		lr.rejected.Add(1)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sub := r.PathValue("sub")
	lr.mu.Lock()
	m := lr.receipts[sub]
	if m == nil {
		m = map[string]int64{}
		lr.receipts[sub] = m
	}
	if _, ok := m[ce.ID]; !ok {
		m[ce.ID] = arrived
		lr.pairs++
	}
	lr.mu.Unlock()
	time.Sleep(lr.delay)
	w.WriteHeader(http.StatusNoContent)
}

func (lr *liveReceiver) count(sub string) int {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return len(lr.receipts[sub])
}

// mux serves the webhook and the bench's paths.
func (lr *liveReceiver) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /hook/{sub}", lr)
	mux.HandleFunc("GET "+liveCountPath, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strconv.Itoa(lr.count(r.URL.Query().Get("sub"))))
	})
	mux.HandleFunc("GET "+liveRejectedPath, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strconv.FormatInt(lr.rejected.Load(), 10))
	})
	mux.HandleFunc("GET "+liveReceiptsPath, func(w http.ResponseWriter, r *http.Request) {
		lr.mu.Lock()
		var b strings.Builder
		for id, at := range lr.receipts[r.URL.Query().Get("sub")] {
			fmt.Fprintf(&b, "%s %d\n", id, at)
		}
		lr.mu.Unlock()
		_, _ = io.WriteString(w, b.String())
	})
	mux.HandleFunc("GET "+liveTotalPath, func(w http.ResponseWriter, _ *http.Request) {
		lr.mu.Lock()
		pairs, subs := lr.pairs, len(lr.receipts)
		lr.mu.Unlock()
		fmt.Fprintf(w, "%d %d", pairs, subs)
	})
	mux.HandleFunc("POST "+liveResetPath, func(w http.ResponseWriter, _ *http.Request) {
		lr.mu.Lock()
		lr.receipts, lr.pairs = map[string]map[string]int64{}, 0
		lr.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// liveReceiverChild is the -live-receiver-child mode: arg is
// "127.0.0.1:<port> <delay>"; it verifies with the secret in
// liveSecretEnv and serves until ctx ends (SIGTERM).
func liveReceiverChild(ctx context.Context, arg string) error {
	addr, d, ok := strings.Cut(arg, " ")
	delay, err := time.ParseDuration(d)
	if !ok || err != nil || delay < 0 {
		return fmt.Errorf("-live-receiver-child %q: want \"127.0.0.1:<port> <delay>\" (a duration of at least 0)", arg)
	}
	lr, err := newLiveReceiver(os.Getenv(liveSecretEnv), delay)
	if err != nil {
		return fmt.Errorf("-live-receiver-child: %s: %w", liveSecretEnv, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-live-receiver-child %q: %w", addr, err)
	}
	return serveUntil(ctx, ln, lr.mux())
}

// liveReceiverProc is the receiver child as the bench sees it.
type liveReceiverProc struct {
	p      *proc.Process
	base   string // http://127.0.0.1:<port>
	client *http.Client
}

// hook is the webhook URL of subscription sub.
func (r *liveReceiverProc) hook(sub string) string { return r.base + "/hook/" + sub }

// startLiveReceiver starts the receiver child with secret and delay and
// returns it once it answers.
func (e *env) startLiveReceiver(ctx context.Context, secret string, delay time.Duration) (*liveReceiverProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := e.procs.Start("live receiver", self, []string{"-live-receiver-child", addr + " " + delay.String()}, liveSecretEnv+"="+secret)
	if err != nil {
		return nil, err
	}
	r := &liveReceiverProc{p: p, base: "http://" + addr, client: &http.Client{Timeout: 30 * time.Second}}
	if err := proc.WaitReady(ctx, r.base+liveRejectedPath, p); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *liveReceiverProc) get(path string) (string, error) {
	if r.p.Exited() {
		return "", errors.New("live receiver process ended early")
	}
	resp, err := r.client.Get(r.base + path)
	if err != nil {
		return "", fmt.Errorf("live receiver: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("live receiver: %w", err)
	}
	return string(b), nil
}

// count is the distinct events subscription sub has delivered.
func (r *liveReceiverProc) count(sub string) (int, error) {
	s, err := r.get(liveCountPath + "?sub=" + sub)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(s)
}

// rejected is the requests the receiver refused.
func (r *liveReceiverProc) rejected() (int64, error) {
	s, err := r.get(liveRejectedPath)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// receipts is, by ce-id, when subscription sub's first delivery of each
// event arrived.
func (r *liveReceiverProc) receipts(sub string) (map[string]time.Time, error) {
	s, err := r.get(liveReceiptsPath + "?sub=" + sub)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for line := range strings.Lines(s) {
		id, us, ok := strings.Cut(strings.TrimSpace(line), " ")
		n, err := strconv.ParseInt(us, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("live receiver receipts: line %q", line)
		}
		out[id] = time.UnixMicro(n)
	}
	return out, nil
}

// total is the distinct (subscription, event) pairs the receiver got,
// over every subscription, and the subscriptions that delivered one at
// least.
func (r *liveReceiverProc) total() (pairs, subs int, err error) {
	s, err := r.get(liveTotalPath)
	if err != nil {
		return 0, 0, err
	}
	if _, err := fmt.Sscanf(s, "%d %d", &pairs, &subs); err != nil {
		return 0, 0, fmt.Errorf("live receiver total %q: %w", s, err)
	}
	return pairs, subs, nil
}

// reset makes the receiver forget its receipts.
func (r *liveReceiverProc) reset() error {
	resp, err := r.client.Post(r.base+liveResetPath, "", nil)
	if err != nil {
		return fmt.Errorf("live receiver reset: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("live receiver reset: status %d", resp.StatusCode)
	}
	return nil
}
