package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/proc"
)

// env is what every row shares: Postgres, the embedded JetStream server, a
// client connection, and the child processes.
type env struct {
	cfg   config
	pool  *pgxpool.Pool
	dbURL string
	srv   *embedded.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	procs proc.Group

	drainCPU drainCPU // set by the drain row
}

// row is one line of the results table.
type row struct {
	Name, Ours, Reference, Ratio, Target string
	Met                                  bool
}

func run(ctx context.Context, cfg config) error {
	e := &env{cfg: cfg, dbURL: cfg.DatabaseURL}
	if e.dbURL == "" {
		url, stopPG, err := proc.StartPostgres(cfg.Repo)
		if err != nil {
			return err
		}
		defer stopPG()
		e.dbURL = url
	}
	pcfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	pcfg.MaxConns = 16
	if e.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return err
	}
	defer e.pool.Close()

	dir, err := os.MkdirTemp("", "jsbridge-bench-nats-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if e.srv, err = embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort}); err != nil {
		return err
	}
	defer e.srv.Shutdown()
	if e.nc, err = e.srv.Connect(); err != nil {
		return err
	}
	defer e.nc.Close()
	if e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return err
	}
	defer e.procs.StopAll(20 * time.Second)

	only := map[string]bool{}
	for _, o := range strings.Split(cfg.Only, ",") {
		if o = strings.TrimSpace(o); o != "" {
			only[o] = true
		}
	}
	began := time.Now()
	var took rowTimes
	want := func(name string) bool {
		if len(only) > 0 && !only[name] {
			return false
		}
		took.start(name)
		return true
	}

	var rows []row
	var mem memory
	if want("drain") {
		r, rss, err := e.drainRow(ctx)
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		rows, mem.bridge = append(rows, r, e.drainCPU.row()), rss
	}
	if want("r3") {
		r, err := e.r3Row(ctx)
		if err != nil {
			return fmt.Errorf("r3: %w", err)
		}
		rows = append(rows, r)
	}
	if want("claim") {
		r, err := e.claimRow(ctx)
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		rows = append(rows, r)
	}
	if want("fair") {
		for _, bridges := range []int{1, 2} {
			r, err := e.fairRow(ctx, bridges)
			if err != nil {
				return fmt.Errorf("fairness, %d bridge(s): %w", bridges, err)
			}
			rows = append(rows, r)
		}
	}
	if want("consumer") {
		rs, rss, err := e.consumerRow(ctx)
		if err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
		rows, mem.consumer = append(rows, rs...), rss
	}
	if want("ordered") {
		rs, err := e.orderedRows(ctx)
		if err != nil {
			return fmt.Errorf("ordered: %w", err)
		}
		rows = append(rows, rs...)
	}
	if want("tracing") {
		r, err := e.tracingRow(ctx)
		if err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
		rows = append(rows, r)
	}
	if want("e2e") {
		rs, err := e.e2eRow(ctx, e.cfg.E2ERate, 10*time.Millisecond)
		if err != nil {
			return fmt.Errorf("end to end: %w", err)
		}
		rows = append(rows, rs...)
		if e.cfg.E2EHighRate > 0 {
			rs, err := e.e2eRow(ctx, e.cfg.E2EHighRate, 30*time.Millisecond)
			if err != nil {
				return fmt.Errorf("end to end at %d/s: %w", e.cfg.E2EHighRate, err)
			}
			rows = append(rows, rs...)
		}
	}
	if want("live") {
		rs, err := e.liveRows(ctx)
		rows = append(rows, rs...)
		if err != nil {
			return fmt.Errorf("live: %w", err)
		}
	}
	if want("live-pipeline") {
		rs, err := e.livePipelineRows(ctx)
		rows = append(rows, rs...)
		if err != nil {
			return fmt.Errorf("live pipeline: %w", err)
		}
	}
	if want("storage") {
		r, err := e.storageRow(ctx)
		if err != nil {
			return fmt.Errorf("storage: %w", err)
		}
		rows = append(rows, r)
	}
	if want("many") {
		rs, err := e.manyRows(ctx)
		rows = append(rows, rs...)
		if err != nil {
			return fmt.Errorf("many subscriptions: %w", err)
		}
	}
	took.start("")
	if mem.bridge > 0 || mem.consumer > 0 {
		rows = append(rows, mem.row())
	}
	table := render(cfg, rows)
	fmt.Print(table)
	fmt.Printf("\nbench: took %s in all (%s)\n", time.Since(began).Round(time.Second), took)
	if cfg.Out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.Out), 0o755); err != nil {
			return err
		}
		history := readHistory(cfg.Out) + historyLine(cfg, rows, cfg.Repo)
		if err := os.WriteFile(cfg.Out, []byte(markdown(cfg, table)+"\n"+keptSections(cfg.Out)+history), 0o644); err != nil {
			return err
		}
		fmt.Printf("bench: wrote %s\n", cfg.Out)
	}
	return nil
}

type memory struct{ bridge, consumer int64 }

func (m memory) row() row {
	mb := func(b int64) string {
		if b == 0 {
			return "not measured"
		}
		return fmt.Sprintf("%.0f MB", float64(b)/(1<<20))
	}
	return row{
		Name:      "memory at full speed: peak RSS",
		Ours:      "bridge " + mb(m.bridge) + ", consumer " + mb(m.consumer),
		Reference: "—",
		Ratio:     "—",
		Target:    "≤ 100 MB / ≤ 150 MB",
		Met:       m.bridge <= 100<<20 && m.consumer <= 150<<20,
	}
}

func render(cfg config, rows []row) string {
	var b strings.Builder
	size := "full"
	if cfg.Quick {
		size = "quick"
	}
	fmt.Fprintf(&b, "\njsbridge bench (%s sizes) on %s\n\n", size, machine())
	fmt.Fprintf(&b, "| row | ours | reference (same run) | ratio | target | met |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		met := "yes"
		if !r.Met {
			met = "NO"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Name, r.Ours, r.Reference, r.Ratio, r.Target, met)
	}
	return b.String()
}

func markdown(cfg config, table string) string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Written by `make bench` (`bin/bench`, built from `bench/`); the table's figures are from the last full run, and the history at the end keeps the headline rows of every run that wrote this file. What limits the rows not met: `docs/performance.md`.\n\n")
	fmt.Fprintf(&b, "Command: `%s`  \nDate: %s  \nGo: %s\n", strings.Join(os.Args, " "), time.Now().UTC().Format(time.RFC3339), runtime.Version())
	b.WriteString(table)
	return b.String()
}

// machine names the CPU model and core count.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtime.NumCPU(), model)
}

// waitFor polls cond every 100 ms until it is true, ctx ends, timeout passes,
// or check returns an error (a child died).
func (e *env) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := e.procs.AnyExited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not done after %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// profile saves, in the background, a CPU profile (-profile-seconds) of the process
// whose ops port is ops to <ProfileDir>/<name>.cpu.pprof (when -profile-dir
// is set and the process serves --pprof).
func (e *env) profile(name string, ops int) {
	if e.cfg.ProfileDir == "" {
		return
	}
	go func() {
		time.Sleep(500 * time.Millisecond) // past start-up, into full speed
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", ops, e.cfg.ProfileSecs))
		if err != nil {
			fmt.Printf("bench: profile %s: %v\n", name, err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			// E.g. a profile already running: the body is the reason, not a profile.
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
			fmt.Printf("bench: profile %s: %s: %s\n", name, resp.Status, strings.TrimSpace(string(msg)))
			return
		}
		if err := os.MkdirAll(e.cfg.ProfileDir, 0o755); err != nil {
			return
		}
		f, err := os.Create(filepath.Join(e.cfg.ProfileDir, name+".cpu.pprof"))
		if err != nil {
			return
		}
		defer f.Close()
		_, _ = io.Copy(f, resp.Body)
		fmt.Printf("bench: profile %s: wrote %s\n", name, f.Name())
	}()
}

// profileSelf saves, in the background, a CPU profile (-profile-seconds) of this
// process (it hosts the JetStream server) to <ProfileDir>/<name>.cpu.pprof.
func (e *env) profileSelf(name string) {
	if e.cfg.ProfileDir == "" {
		return
	}
	if err := os.MkdirAll(e.cfg.ProfileDir, 0o755); err != nil {
		return
	}
	f, err := os.Create(filepath.Join(e.cfg.ProfileDir, name+".cpu.pprof"))
	if err != nil {
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return
	}
	go func() {
		time.Sleep(time.Duration(e.cfg.ProfileSecs) * time.Second)
		pprof.StopCPUProfile()
		f.Close()
		fmt.Printf("bench: profile %s: wrote %s\n", name, f.Name())
	}()
}
