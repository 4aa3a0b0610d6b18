package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// Ordered delivery rows: the consumer process with --ordering stream
// against --ordering none, with 1 and 2 replicas, over orderedStreams
// active streams; and the hand-over after a replica is SIGKILLed.
const (
	orderedStreams    = 1000
	orderedPartitions = 16
	orderedAckWait    = 5 * time.Second
	orderedLeaseTTL   = 2 * time.Second
)

// partSink counts distinct Idempotency-Keys like sink and, for the
// hand-over row, notes per partition who delivered last and when a
// partition of a killed replica was first delivered by another.
type partSink struct {
	mu   sync.Mutex
	seen map[string]bool
	n    atomic.Int64
	srv  *http.Server
	url  string

	last    map[int]string    // partition → replica of its last delivery
	killed  string            // the killed replica's id, "" before the kill
	victim  map[int]bool      // partitions whose last delivery at the kill was the victim's
	resumed map[int]time.Time // victim partitions → first delivery by another replica
}

func newPartSink() (*partSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &partSink{url: "http://" + ln.Addr().String() + "/hook"}
	s.reset()
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *partSink) reset() {
	s.mu.Lock()
	s.seen, s.last, s.killed, s.victim, s.resumed = map[string]bool{}, map[int]string{}, "", nil, map[int]time.Time{}
	s.n.Store(0)
	s.mu.Unlock()
}

func (s *partSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	replica := r.Header.Get(wire.HeaderReplica)
	id, _ := strconv.Atoi(key)
	// backlog(n, orderedStreams): event id i is in stream bench-<(i-1) mod streams>.
	p := wire.StreamPartition(fmt.Sprintf("bench-%d", (id-1)%orderedStreams), orderedPartitions)
	s.mu.Lock()
	if !s.seen[key] {
		s.seen[key] = true
		s.n.Add(1)
	}
	s.last[p] = replica
	if s.killed != "" && replica != s.killed && s.victim[p] && s.resumed[p].IsZero() {
		s.resumed[p] = time.Now()
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// kill notes that replica is being killed now.
func (s *partSink) kill(replica string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killed, s.victim = replica, map[int]bool{}
	for p, r := range s.last {
		if r == replica {
			s.victim[p] = true
		}
	}
}

// handover returns the longest time from at until a victim partition was
// delivered by another replica, and whether every victim partition was.
func (s *partSink) handover(at time.Time) (time.Duration, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var longest time.Duration
	for p := range s.victim {
		t := s.resumed[p]
		if t.IsZero() {
			return 0, len(s.victim), false
		}
		longest = max(longest, t.Sub(at))
	}
	return longest, len(s.victim), true
}

// runRates are a consumer run's deliveries per second: over the whole run,
// from the processes' start, so with their start-up (connecting,
// provisioning, the first partition claims and fences; for the first
// ordered run, the partitioned copy sourcing the backlog too), and in its
// steady middle, from 20 % to 80 % of the events delivered.
type runRates struct{ whole, steady float64 }

// consumerRun runs replicas consumer processes of subscription name with
// the given ordering until n distinct events reached s; it returns
// deliveries per second. When kill is set, it SIGKILLs the first replica
// once a quarter was delivered and returns the hand-over time too.
func (e *env) consumerRun(ctx context.Context, s *partSink, name, ordering string, replicas, n int, kill bool) (runRates, time.Duration, error) {
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	start := time.Now()
	var ps []*proc.Process
	for i := range replicas {
		args := []string{"run",
			"--nats-url", e.srv.ClientURL(), "--start", "all", "--name", name, "--filter", wire.All(wire.DefaultEventsPrefix), "--url", s.url,
			"--allow-private", "--max-in-flight", fmt.Sprint(e.cfg.InFlight), "--ops-addr", "", "--log-level", "warn",
			"--ordering", ordering, "--partitions", fmt.Sprint(orderedPartitions), "--lease-ttl", orderedLeaseTTL.String(),
			"--ack-wait", orderedAckWait.String(), "--timeout", "2s", "--replica-id", fmt.Sprintf("%s-%d", name, i),
		}
		ops := 0
		var err error
		if e.cfg.ProfileDir != "" && i == 0 && !kill {
			// The first replica's CPU profile (-profile-dir).
			if ops, err = proc.FreePort(); err != nil {
				return runRates{}, 0, err
			}
			args = append(args, "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--pprof")
		}
		p, err := e.procs.Start(fmt.Sprintf("consumer %s-%d", name, i), e.cfg.Bin+"/consumer", args, "JSBRIDGE_SECRET=whsec_"+base64.StdEncoding.EncodeToString(secret))
		if err != nil {
			return runRates{}, 0, err
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
	var handover time.Duration
	if kill {
		if err := e.waitFor(ctx, 10*time.Minute, name+": a quarter delivered", func() (bool, error) { return s.n.Load() >= int64(n/4), nil }); err != nil {
			return runRates{}, 0, err
		}
		victim := name + "-0"
		s.kill(victim)
		at := time.Now()
		ps[0].Kill()
		var parts int
		err := e.waitFor(ctx, 10*time.Minute, name+": the killed replica's partitions delivered again", func() (bool, error) {
			d, np, ok := s.handover(at)
			handover, parts = d, np
			return ok, nil
		})
		if err != nil {
			return runRates{}, 0, err
		}
		fmt.Printf("bench: ordered: %s: SIGKILL of %s (last to deliver %d partitions): all of them delivered by another replica after %s\n",
			name, victim, parts, handover.Round(time.Millisecond))
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
		return runRates{}, 0, err
	}
	rate := runRates{whole: float64(n) / time.Since(start).Seconds()}
	if t80.After(t20) {
		rate.steady = float64(n80-n20) / t80.Sub(t20).Seconds()
	}
	for _, p := range ps {
		if err := p.Stop(20 * time.Second); err != nil && !kill {
			return runRates{}, 0, fmt.Errorf("%s exit: %w", p.Name, err)
		}
	}
	fmt.Printf("bench: ordered: %s (%s, %d replica(s)): %.0f deliveries/s steady, %.0f over the whole run\n", name, ordering, replicas, rate.steady, rate.whole)
	return rate, handover, nil
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
		s.reset()
		none, _, err := e.consumerRun(ctx, s, fmt.Sprintf("none%d", replicas), "none", replicas, n, false)
		if err != nil {
			return nil, err
		}
		s.reset()
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
			Target:    "≥ 0.8",
			Met:       ratio >= 0.8,
		})
	}
	s.reset()
	_, handover, err := e.consumerRun(ctx, s, "handover", "stream", 2, n, true)
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{
		Name:      fmt.Sprintf("ordered hand-over after SIGKILL of 1 of 2 replicas (lease TTL %s, AckWait %s): until each of its partitions is delivered by the other", orderedLeaseTTL, orderedAckWait),
		Ours:      handover.Round(100 * time.Millisecond).String(),
		Reference: "2 × AckWait = " + (2 * orderedAckWait).String(),
		Ratio:     fmt.Sprintf("%.2f", handover.Seconds()/(2*orderedAckWait).Seconds()),
		Target:    "< 1 (under 2 × AckWait)",
		Met:       handover < 2*orderedAckWait,
	})
	return rows, nil
}
