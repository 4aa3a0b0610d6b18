package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// latencySink records, per distinct event, the time from append (ce-time,
// Postgres's clock on this machine) to receipt, and both times by event id
// (for the stage breakdown).
type latencySink struct {
	mu    sync.Mutex
	seen  map[string]bool
	lat   []time.Duration
	times map[string]*stageTimes
	url   string
	srv   *http.Server
}

func (s *latencySink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, _ := io.ReadAll(r.Body)
	var ce struct {
		ID   string `json:"id"`
		Time string `json:"time"`
	}
	if err := json.Unmarshal(body, &ce); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	created, err := time.Parse(time.RFC3339Nano, ce.Time)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if !s.seen[ce.ID] {
		s.seen[ce.ID] = true
		s.lat = append(s.lat, now.Sub(created))
		s.times[ce.ID] = &stageTimes{created: created, received: now}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *latencySink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// e2eWarmUp is how long after the first append the e2e row's steady
// latencies begin. The consumer answers /readyz before its ordered
// partitions deliver: in quick runs the events of the first ~0.5 s waited
// in the consumer for up to 450 ms, the later ones less the later they
// came (a queue worked off), and they were most of a 10 s run's p99
// (whole run 479 ms, after the first 2 s 27 ms).
const e2eWarmUp = 2 * time.Second

// steadyLatencies returns, sorted, append → receipt of the events
// appended at least warmUp after the first one.
func steadyLatencies(times map[string]*stageTimes, warmUp time.Duration) []time.Duration {
	var first time.Time
	for _, t := range times {
		if first.IsZero() || t.created.Before(first) {
			first = t.created
		}
	}
	var out []time.Duration
	for _, t := range times {
		if !t.created.Before(first.Add(warmUp)) {
			out = append(out, t.received.Sub(t.created))
		}
	}
	if len(out) == 0 {
		out = []time.Duration{0}
	}
	slices.Sort(out)
	return out
}

// e2eRow appends at a steady rate through a bridge and a consumer process
// (the defaults: ordered delivery) and measures append → webhook received,
// then breaks that latency down by stage (stages.go). The row is met when
// rate is reached (98 %) with a steady p99 (events appended after
// e2eWarmUp) of at most p99Target.
func (e *env) e2eRow(ctx context.Context, rate int, p99Target time.Duration) ([]row, error) {
	dur := e.cfg.E2EDuration
	const schema = "bench_e2e"
	if err := e.quiesce(ctx, schema); err != nil {
		return nil, err
	}
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return nil, err
	}
	// The JetStream server runs in a child process of its own, as it would
	// in production: its CPU is measured apart, and this process's
	// producers, receiver and garbage collector do not stall it.
	dir, err := os.MkdirTemp("", "jsbridge-bench-e2e-nats-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bus, err := e.startChildBus(ctx, dir, 1)
	if err != nil {
		return nil, err
	}
	defer bus.stop(20 * time.Second)
	server, natsURL, js := bus.proc, bus.urls, bus.js
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &latencySink{seen: map[string]bool{}, times: map[string]*stageTimes{}, url: "http://" + ln.Addr().String() + "/hook"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	defer s.srv.Close()

	bridge, bridgeOps, err := e.startBridgeAt(ctx, natsURL, schema)
	if err != nil {
		return nil, err
	}
	defer bridge.Stop(20 * time.Second)
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	ops, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	args := []string{"run",
		"--nats-url", natsURL, "--start", "all", "--name", "bench-e2e", "--filter", wire.All(wire.DefaultEventsPrefix), "--url", s.url,
		"--allow-private", "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--log-level", "warn",
	}
	ordering := "ordered delivery (the default)"
	if e.cfg.E2EOrdering != "" {
		args = append(args, "--ordering", e.cfg.E2EOrdering)
		ordering = "ordering " + e.cfg.E2EOrdering
	}
	if e.cfg.ProfileDir != "" {
		args = append(args, "--pprof")
	}
	consumer, err := e.procs.Start("consumer", e.cfg.Bin+"/consumer", args, "JSBRIDGE_SECRET=whsec_"+base64.StdEncoding.EncodeToString(secret))
	if err != nil {
		return nil, err
	}
	defer consumer.Stop(20 * time.Second)
	if err := proc.WaitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", ops), consumer); err != nil {
		return nil, err
	}
	e.profile(fmt.Sprintf("consumer-e2e-%d", rate), ops)
	e.profileSelf(fmt.Sprintf("producers-during-e2e-%d", rate))
	if port, err := serverChildPprof(dir); err == nil {
		e.profile(fmt.Sprintf("server-e2e-%d", rate), port)
	}

	// Sixteen producers, each on its own streams, each at rate/16: an
	// append is a round trip and a commit, and four producers (4 ms
	// apart at 1,000/s) fell behind the rate asked for on a busy machine.
	const producers = 16
	commits0, cerr := e.commits(ctx)
	stmts0, serr := e.statements(ctx)
	cpu0, began := e.sampleCPU(ctx, bridge.Pid(), consumer.Pid(), server.Pid()), time.Now()
	var appended atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	stop := time.Now().Add(dur)
	for g := range producers {
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) * producers / float64(rate)))
			defer tick.Stop()
			for i := 0; time.Now().Before(stop); i++ {
				<-tick.C
				stream := fmt.Sprintf("e2e-%d-%d", g, i%(100/producers+1))
				if _, err := st.Append(ctx, stream, store.AnyVersion, store.NewEvent{Name: "BenchEvent", Data: payload}); err != nil {
					errs <- err
					return
				}
				appended.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	n := int(appended.Load())
	if err := e.waitFor(ctx, 2*time.Minute, "end to end", func() (bool, error) { return s.count() >= n, nil }); err != nil {
		return nil, err
	}
	cpu := cpu0.perEvent(e.sampleCPU(ctx, bridge.Pid(), consumer.Pid(), server.Pid()), n, time.Since(began))
	fmt.Printf("bench: e2e: %s\n", cpu)
	s.mu.Lock()
	lat := slices.Clone(s.lat)
	s.mu.Unlock()
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	achieved := float64(n) / dur.Seconds()
	s.mu.Lock()
	times := s.times
	s.mu.Unlock()
	steady := steadyLatencies(times, e2eWarmUp)
	sp50, sp99 := steady[len(steady)/2], steady[len(steady)*99/100]
	fmt.Printf("bench: e2e: %d/s requested: %d events at %.0f/s: p50 %s p99 %s; after the first %s: p50 %s p99 %s\n", rate, n, achieved, ms(p50), ms(p99), e2eWarmUp, ms(sp50), ms(sp99))
	stages := e.stageBreakdown(ctx, js, times, bridgeOps)
	stages += "; " + cpu
	if stmts1, err := e.statements(ctx); err == nil && serr == nil {
		stages += fmt.Sprintf("; Postgres statements per event %.2f (pg_stat_statements)", float64(stmts1-stmts0)/float64(n))
	}
	if commits1, err := e.commits(ctx); err == nil && cerr == nil {
		stages += fmt.Sprintf("; Postgres transactions committed per event %.2f (pg_stat_database: every client of the database, the appends included)", float64(commits1-commits0)/float64(n))
		fmt.Printf("bench: e2e: Postgres commits %d for %d events\n", commits1-commits0, n)
	}
	return []row{{
		Name:      fmt.Sprintf("end to end: append → webhook received, %d events/s requested for %s, %s", rate, dur, ordering),
		Ours:      fmt.Sprintf("steady (appended after the first %s): p50 %s, p99 %s; whole run: p50 %s, p99 %s (%.0f events/s achieved)", e2eWarmUp, ms(sp50), ms(sp99), ms(p50), ms(p99), achieved),
		Reference: "—",
		Ratio:     "—",
		Target:    fmt.Sprintf("%d events/s reached, steady p99 ≤ %s", rate, ms(p99Target)),
		Met:       achieved >= 0.98*float64(rate) && sp99 <= p99Target,
	}, {
		Name:      fmt.Sprintf("end to end at %d events/s, by stage (the same events): append", rate) + " → stored in EVENTS (wake-up, claim, fetch, publish) → webhook received (read, sign, POST)",
		Ours:      stages,
		Reference: "—",
		Ratio:     "—",
		Target:    "printed",
		Met:       true,
	}}, nil
}
