package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/proc"
)

// sink is the loopback receiver both consumer rows POST to: it reads the
// body, counts distinct Idempotency-Keys and answers 204.
type sink struct {
	mu   sync.Mutex
	seen map[string]bool
	n    atomic.Int64
	srv  *http.Server
	url  string
}

func newSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{seen: map[string]bool{}, url: "http://" + ln.Addr().String() + "/hook"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	if !s.seen[key] {
		s.seen[key] = true
		s.n.Add(1)
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *sink) reset() {
	s.mu.Lock()
	s.seen = map[string]bool{}
	s.n.Store(0)
	s.mu.Unlock()
}

// bareLoop is the reference: pull → POST → ack with inFlight workers and no
// signing, on its own durable consumer.
func (e *env) bareLoop(ctx context.Context, s *sink, n, inFlight int) (float64, error) {
	cons, err := e.js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "bench-bare", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxAckPending: 1000, FilterSubjects: []string{"events.>"},
	})
	if err != nil {
		return 0, err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inFlight, MaxConnsPerHost: inFlight}, Timeout: 10 * time.Second}
	start := time.Now()
	iter, err := cons.Messages(jetstream.PullMaxMessages(inFlight))
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range inFlight {
		wg.Go(func() {
			for {
				msg, err := iter.Next()
				if err != nil {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(msg.Data()))
				req.Header.Set("Idempotency-Key", msg.Headers().Get("Nats-Msg-Id"))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					_ = msg.Nak()
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				_ = msg.Ack()
			}
		})
	}
	err = e.waitFor(ctx, 10*time.Minute, "bare pull-POST-ack loop", func() (bool, error) {
		return s.n.Load() >= int64(n), nil
	})
	elapsed := time.Since(start)
	iter.Stop()
	wg.Wait()
	if err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// consumerRow: n messages in EVENTS; the bare loop delivers them, then the
// consumer process (signing on, inFlight in flight) delivers them again on
// its own durable consumer.
func (e *env) consumerRow(ctx context.Context) (row, int64, error) {
	n, inFlight := e.cfg.Messages, e.cfg.InFlight
	if err := e.freshEventsStream(ctx); err != nil {
		return row{}, 0, err
	}
	if _, err := e.publishAsync(ctx, backlog(n, 1000)); err != nil {
		return row{}, 0, err
	}
	s, err := newSink()
	if err != nil {
		return row{}, 0, err
	}
	defer s.srv.Close()

	ref, err := e.bareLoop(ctx, s, n, inFlight)
	if err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: consumer: bare pull → POST → ack loop %.0f deliveries/s\n", ref)
	s.reset()

	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	ops, err := proc.FreePort()
	if err != nil {
		return row{}, 0, err
	}
	start := time.Now()
	args := []string{"run",
		"--nats-url", e.srv.ClientURL(), "--name", "bench", "--filter", "events.>", "--url", s.url,
		"--allow-private", "--max-in-flight", fmt.Sprint(inFlight), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--log-level", "warn",
	}
	if e.cfg.ProfileDir != "" {
		args = append(args, "--pprof")
	}
	p, err := e.procs.Start("consumer", e.cfg.Bin+"/consumer", args, "JSBRIDGE_SECRET=whsec_"+base64.StdEncoding.EncodeToString(secret))
	if err != nil {
		return row{}, 0, err
	}
	e.profile("consumer", ops)
	err = e.waitFor(ctx, 10*time.Minute, "consumer", func() (bool, error) { return s.n.Load() >= int64(n), nil })
	if err != nil {
		return row{}, 0, err
	}
	ours := float64(n) / time.Since(start).Seconds()
	rss, rssErr := p.PeakRSS()
	if err := p.Stop(20 * time.Second); err != nil {
		return row{}, 0, fmt.Errorf("consumer exit: %w", err)
	}
	if rssErr != nil {
		return row{}, 0, rssErr
	}
	fmt.Printf("bench: consumer: %.0f deliveries/s, peak RSS %.0f MB\n", ours, float64(rss)/(1<<20))
	ratio := ours / ref
	return row{
		Name:      fmt.Sprintf("consumer throughput: %d messages → signed POST to a loopback receiver → ack, %d in flight", n, inFlight),
		Ours:      fmt.Sprintf("%.0f deliveries/s", ours),
		Reference: fmt.Sprintf("%.0f deliveries/s (bare pull → POST → ack)", ref),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≥ 0.8 and ≥ 10,000/s",
		Met:       ratio >= 0.8 && ours >= 10_000,
	}, rss, nil
}
