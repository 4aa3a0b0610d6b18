package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jsbridge/jsbridge/webhook"
)

// receiver is the example webhook receiver: package webhook verifies the
// signature and dedups on Idempotency-Key; handle records what arrived so the
// check mode can prove every event came once and in order.
type receiver struct {
	verifier *webhook.Verifier
	dedup    webhook.IdempotencyStore
	logEach  bool

	mu         sync.Mutex
	processed  map[int64]bool
	lastVer    map[string]int64
	outOfOrder int
	twice      int
	accepted   int // 2xx answers: processed + duplicates dropped
	rejected   int // 401 answers: bad or missing signature
	latencies  []float64
	last       time.Time
}

func newReceiver(secret string, logEach bool) (*receiver, error) {
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	if err != nil {
		return nil, err
	}
	return &receiver{
		verifier: v, dedup: webhook.NewMemoryStore(1_000_000), logEach: logEach,
		processed: map[int64]bool{}, lastVer: map[string]int64{},
	}, nil
}

func (rc *receiver) Handler() http.Handler {
	inner := webhook.Handler(rc.verifier, rc.dedup, time.Hour, rc.handle)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		inner.ServeHTTP(sw, r)
		rc.mu.Lock()
		switch {
		case sw.status >= 200 && sw.status < 300:
			rc.accepted++
		case sw.status == http.StatusUnauthorized:
			rc.rejected++
		}
		rc.mu.Unlock()
	})
}

func (rc *receiver) handle(_ context.Context, r *http.Request, body []byte) error {
	ce, err := webhook.DecodeCloudEvent(r, body)
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(ce.ID, 10, 64)
	if err != nil {
		return fmt.Errorf("event id %q: %w", ce.ID, err)
	}
	now := time.Now()
	var latency float64
	if created, err := time.Parse(time.RFC3339Nano, ce.Time); err == nil {
		latency = float64(now.Sub(created).Microseconds()) / 1000
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.processed[id] {
		rc.twice++
	}
	rc.processed[id] = true
	last, seen := rc.lastVer[ce.Subject]
	if !seen {
		last = -1
	}
	if ce.StreamVersion != last+1 {
		rc.outOfOrder++
	}
	if ce.StreamVersion > last {
		rc.lastVer[ce.Subject] = ce.StreamVersion
	}
	rc.latencies = append(rc.latencies, latency)
	rc.last = now
	if rc.logEach {
		fmt.Printf("receiver: event %s %s %s v%d (%.1f ms after append)\n", ce.ID, ce.Subject, ce.Type, ce.StreamVersion, latency)
	}
	return nil
}

// stats is a snapshot of what the receiver saw.
type stats struct {
	Delivered, OutOfOrder, Twice, Duplicates, Rejected int
	P50, P99                                           float64
	Last                                               time.Time
}

func (rc *receiver) snapshot(withLatency bool) stats {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	s := stats{
		Delivered: len(rc.processed), OutOfOrder: rc.outOfOrder, Twice: rc.twice,
		Duplicates: rc.accepted - len(rc.processed) - rc.twice, Rejected: rc.rejected, Last: rc.last,
	}
	if withLatency && len(rc.latencies) > 0 {
		l := slices.Clone(rc.latencies)
		slices.Sort(l)
		s.P50 = l[len(l)*50/100]
		s.P99 = l[min(len(l)-1, len(l)*99/100)]
	}
	return s
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}
