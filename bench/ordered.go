package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// Ordered delivery rows: the consumer process with --ordering stream
// against --ordering none, with 1 and 2 replicas, over orderedStreams
// active streams; and the hand-over after a replica is SIGKILLed.
const (
	orderedStreams    = 1000
	orderedPartitions = 16
	orderedLeaseTTL   = 2 * time.Second
)

// runRates are a consumer run's deliveries per second: over the whole run,
// from the processes' start, so with their start-up (connecting,
// provisioning, the first partition claims), and in its
// steady middle, from 20 % to 80 % of the events delivered.
type runRates struct{ whole, steady float64 }

// consumerRun runs replicas consumer processes of subscription name with
// the given ordering until n distinct events reached s; it returns
// deliveries per second. When kill is set, it SIGKILLs a replica once a
// quarter was delivered and returns what the hand-over took too.
func (e *env) consumerRun(ctx context.Context, s *partSink, name, ordering string, replicas, n int, kill bool) (runRates, handoverResult, error) {
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	start := time.Now()
	var ps []*proc.Process
	for i := range replicas {
		args := []string{"run",
			"--nats-url", e.srv.ClientURL(), "--start", "all", "--name", name, "--filter", wire.All(wire.DefaultEventsPrefix), "--url", s.url,
			"--allow-private", "--max-in-flight", fmt.Sprint(e.cfg.InFlight), "--ops-addr", "", "--log-level", "warn",
			"--ordering", ordering, "--partitions", fmt.Sprint(orderedPartitions), "--lease-ttl", orderedLeaseTTL.String(),
			"--timeout", "2s", "--replica-id", fmt.Sprintf("%s-%d", name, i),
		}
		ops := 0
		var err error
		if e.cfg.ProfileDir != "" && i == 0 && !kill {
			// The first replica's CPU profile (-profile-dir).
			if ops, err = proc.FreePort(); err != nil {
				return runRates{}, handoverResult{}, err
			}
			args = append(args, "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--pprof")
		}
		p, err := e.procs.Start(fmt.Sprintf("consumer %s-%d", name, i), e.cfg.Bin+"/consumer", args, "JSBRIDGE_SECRET=whsec_"+base64.StdEncoding.EncodeToString(secret))
		if err != nil {
			return runRates{}, handoverResult{}, err
		}
		ps = append(ps, p)
		if ops != 0 {
			e.profile("consumer-"+name, ops)
		}
	}
	if e.cfg.ProfileDir != "" && !kill {
		// This process hosts the JetStream server (and the sink).
		go func() {
			time.Sleep(time.Second)
			e.profileSelf("server-" + name)
		}()
	}
	var ho handoverResult
	if kill {
		var err error
		if ho, err = e.killOne(ctx, s, name, ps, n); err != nil {
			return runRates{}, ho, err
		}
	}
	// The steady middle: the first poll at or past 20 % and at or past
	// 80 % of n, with the counts then.
	var t20, t80 time.Time
	var n20, n80 int64
	err := e.waitFor(ctx, 10*time.Minute, name, func() (bool, error) {
		got, now := s.n.Load(), time.Now()
		if t20.IsZero() && got >= int64(n)/5 {
			t20, n20 = now, got
		}
		if t80.IsZero() && got >= int64(n)*4/5 {
			t80, n80 = now, got
		}
		return got >= int64(n), nil
	})
	if err != nil {
		return runRates{}, handoverResult{}, err
	}
	rate := runRates{whole: float64(n) / time.Since(start).Seconds()}
	if t80.After(t20) {
		rate.steady = float64(n80-n20) / t80.Sub(t20).Seconds()
	}
	for _, p := range ps {
		if err := p.Stop(20 * time.Second); err != nil && !kill {
			return runRates{}, handoverResult{}, fmt.Errorf("%s exit: %w", p.Name, err)
		}
	}
	fmt.Printf("bench: ordered: %s (%s, %d replica(s)): %.0f deliveries/s steady, %.0f over the whole run\n", name, ordering, replicas, rate.steady, rate.whole)
	return rate, ho, nil
}

// orderedRows: Messages events over 1,000 streams in EVENTS, delivered by
// the consumer process with --ordering none and stream, 1 and 2 replicas
// each (own subscription each run), then the hand-over run.
func (e *env) orderedRows(ctx context.Context) ([]row, error) {
	n := e.cfg.Messages
	if err := e.freshEventsStream(ctx); err != nil {
		return nil, err
	}
	if _, err := e.publishAsync(ctx, backlog(n, orderedStreams)); err != nil {
		return nil, err
	}
	s, err := newPartSink()
	if err != nil {
		return nil, err
	}
	defer s.srv.Close()
	var rows []row
	for _, replicas := range []int{1, 2} {
		if err := e.freshPositions(ctx, s, n); err != nil {
			return nil, err
		}
		none, _, err := e.consumerRun(ctx, s, fmt.Sprintf("none%d", replicas), "none", replicas, n, false)
		if err != nil {
			return nil, err
		}
		if err := e.freshPositions(ctx, s, n); err != nil {
			return nil, err
		}
		ord, _, err := e.consumerRun(ctx, s, fmt.Sprintf("ordered%d", replicas), "stream", replicas, n, false)
		if err != nil {
			return nil, err
		}
		ratio := ord.steady / none.steady
		rows = append(rows, row{
			Name: fmt.Sprintf("ordered delivery, %d replica(s): %d messages over %d active streams, %d in flight per replica; "+
				"steady (20 %% to 80 %% delivered), and over the whole run with start-up", replicas, n, orderedStreams, e.cfg.InFlight),
			Ours:      fmt.Sprintf("%.0f deliveries/s (whole run %.0f)", ord.steady, ord.whole),
			Reference: fmt.Sprintf("%.0f deliveries/s (whole run %.0f; the same consumer, ordering none)", none.steady, none.whole),
			Ratio:     fmt.Sprintf("%.2f (whole run %.2f)", ratio, ord.whole/none.whole),
			Target:    "≥ 0.9",
			Met:       ratio >= 0.9,
		})
	}
	if err := e.freshPositions(ctx, s, n); err != nil {
		return nil, err
	}
	_, ho, err := e.consumerRun(ctx, s, "handover", "stream", 2, n, true)
	if err != nil {
		return nil, err
	}
	return append(rows, ho.row()), nil
}

// freshPositions deletes the lease and positions buckets the last run
// left and resets the sink, so that the next run's subscription starts
// on partition records of its own. Each run has a subscription of its
// own on the same events: on the last run's records (their floors at
// the head) it joined every partition behind and was delivered by
// cursors (a per-partition re-read of EVENTS) instead of the shared
// read, which is what these rows measure.
func (e *env) freshPositions(ctx context.Context, s *partSink, n int) error {
	for _, b := range []string{wire.DefaultLeaseBucket, position.DefaultBucket} {
		if err := e.js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("delete bucket %s: %w", b, err)
		}
	}
	s.reset(n)
	return nil
}
