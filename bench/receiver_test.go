package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// The receiver child counts distinct Idempotency-Keys, forgets them on
// reset, and returns once its context ends.
func TestReceiverChildCountsAndResets(t *testing.T) {
	t.Parallel()
	// A free port can be taken by another test process before the child
	// listens on it: then it fails at once, and another port is tried.
	var (
		base   string
		cancel context.CancelFunc
		done   chan error
	)
	for try := 0; ; try++ {
		port, err := proc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		base = fmt.Sprintf("http://127.0.0.1:%d", port)
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		done = make(chan error, 1)
		go func() { done <- receiverChild(ctx, fmt.Sprintf("127.0.0.1:%d", port)) }()
		if answering(t, base, done) {
			break
		}
		cancel()
		if try == 4 {
			t.Fatal("receiver child could not listen on a free port 5 times")
		}
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("receiverChild = %v after its context ended", err)
		}
	}()

	count := func() string {
		t.Helper()
		resp, err := http.Get(base + receiverCountPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, key := range []string{"a", "b", "a"} {
		req, _ := http.NewRequest(http.MethodPost, base+"/hook", strings.NewReader(`{"x":1}`))
		req.Header.Set(wire.HeaderIdempotencyKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("POST /hook: status %d, want 204", resp.StatusCode)
		}
	}
	if got := count(); got != "2" {
		t.Fatalf("count after keys a, b, a = %q, want 2", got)
	}
	resp, err := http.Post(base+receiverResetPath, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := count(); got != "0" {
		t.Fatalf("count after reset = %q, want 0", got)
	}
}

// The CPU row compares the consumer's CPU per delivery with the
// receiver's against the target, ≤ 1.5.
func TestConsumerCPURowTarget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		consumer, receiver time.Duration
		ratio              string
		met                bool
	}{
		{150 * time.Millisecond, 100 * time.Millisecond, "1.50", true},
		{151 * time.Millisecond, 100 * time.Millisecond, "1.51", false},
	} {
		r := consumerCPU{deliveries: 1000, consumer: c.consumer, receiver: c.receiver, bareLoop: 90 * time.Millisecond, bareReceiver: 60 * time.Millisecond}.row()
		if r.Ratio != c.ratio || r.Met != c.met || r.Target != "≤ 1.5" {
			t.Errorf("consumer %v, receiver %v: ratio %s met %v target %s; want %s, %v, ≤ 1.5", c.consumer, c.receiver, r.Ratio, r.Met, r.Target, c.ratio, c.met)
		}
		if want := "loop 90.0, receiver 60.0 µs/delivery, ratio 1.50"; !strings.Contains(r.Reference, want) {
			t.Errorf("reference %q, want it to give the bare loop's figures: %q", r.Reference, want)
		}
	}
}

// answering waits until the receiver child at base answers (true), or
// its run ended with an error, e.g. its port taken (false); it fails the
// test after 10 s of neither.
func answering(t *testing.T, base string, done chan error) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-done:
			t.Logf("receiver child ended before answering: %v", err)
			return false
		default:
		}
		if resp, err := http.Get(base + receiverCountPath); err == nil {
			resp.Body.Close()
			return true
		}
		if time.Now().After(deadline) {
			t.Fatal("receiver child not answering after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
