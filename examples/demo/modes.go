package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

func statusLine(ctx context.Context, st *store.Store, rc *receiver) string {
	appended, forwarded, err := st.Totals(ctx)
	if err != nil {
		return fmt.Sprintf("status: %v", err)
	}
	s := rc.snapshot(false)
	return fmt.Sprintf("appended %d, forwarded %d, delivered %d (duplicates dropped %d)", appended, forwarded, s.Delivered, s.Duplicates)
}

// runSteady is `make run`: a steady producer and a status line a second
// until Ctrl-C, then a final tally.
func runSteady(ctx context.Context, cfg config, st *store.Store, rc *receiver, procs *proc.Group, natsURL string) (int, error) {
	var appended atomic.Int64
	errc := make(chan error, 1)
	go func() { errc <- produceSteady(ctx, st, cfg.Rate, &appended) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println("demo: stopping; " + tally(st, rc, natsURL))
			return 0, nil
		case err := <-errc:
			if err != nil {
				return 1, fmt.Errorf("producer: %w", err)
			}
		case <-tick.C:
			if err := procs.AnyExited(); err != nil {
				return 1, err
			}
			fmt.Println("demo: " + statusLine(ctx, st, rc))
		}
	}
}

// tally is the final count at Ctrl-C: events appended to Postgres, messages
// stored in the JetStream stream EVENTS, webhooks delivered to the receiver.
// It runs after the run's context ended, so it has a short one of its own.
func tally(st *store.Store, rc *receiver, natsURL string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	appended := "?"
	if a, _, err := st.Totals(ctx); err == nil {
		appended = strconv.FormatInt(a, 10)
	}
	stored := "?"
	if nc, err := nats.Connect(natsURL, nats.Timeout(time.Second)); err == nil {
		defer nc.Close()
		if js, err := jetstream.New(nc); err == nil {
			if s, err := js.Stream(ctx, wire.DefaultEventsStream); err == nil {
				if info, err := s.Info(ctx); err == nil {
					stored = strconv.FormatUint(info.State.Msgs, 10)
				}
			}
		}
	}
	s := rc.snapshot(false)
	return fmt.Sprintf("final tally: appended %s, stored in JetStream %s, delivered %d (duplicates dropped %d)", appended, stored, s.Delivered, s.Duplicates)
}

// runCheck is `make demo`: append N events, wait until all reached the
// receiver, verify and print the summary line.
func runCheck(ctx context.Context, cfg config, st *store.Store, rc *receiver, procs *proc.Group) (int, error) {
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- produce(ctx, st, cfg.N) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.After(cfg.Timeout)
	produced := false
	for !produced || rc.snapshot(false).Delivered < cfg.N {
		select {
		case <-ctx.Done():
			return 1, fmt.Errorf("interrupted")
		case <-deadline:
			return 1, fmt.Errorf("timed out after %s: %s", cfg.Timeout, statusLine(ctx, st, rc))
		case err := <-errc:
			if err != nil {
				return 1, fmt.Errorf("producer: %w", err)
			}
			produced = true
			errc = nil
		case <-tick.C:
			if err := procs.AnyExited(); err != nil {
				return 1, err
			}
			fmt.Println("demo: " + statusLine(ctx, st, rc))
		}
	}
	// Let late duplicates (redeliveries) arrive and be counted.
	time.Sleep(500 * time.Millisecond)
	s := rc.snapshot(true)
	elapsed := s.Last.Sub(start).Seconds()
	rate := float64(s.Delivered) / elapsed
	fmt.Printf("demo: delivered %d/%d events, %d duplicates dropped, %d out of order, %.0f events/s, append→webhook p50 %.1f ms p99 %.1f ms\n",
		s.Delivered, cfg.N, s.Duplicates, s.OutOfOrder, rate, s.P50, s.P99)
	switch {
	case s.Delivered != cfg.N:
		return 1, fmt.Errorf("%d of %d events delivered", s.Delivered, cfg.N)
	case s.OutOfOrder != 0:
		return 1, fmt.Errorf("%d events out of stream order", s.OutOfOrder)
	case s.Twice != 0:
		return 1, fmt.Errorf("%d events processed twice despite dedup", s.Twice)
	case s.Rejected != 0:
		return 1, fmt.Errorf("%d requests with an invalid signature", s.Rejected)
	}
	return 0, nil
}
