package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// The live rows (issue 33): the bridge at the steady rates people run,
// beside a bare reference bridge in the same run. An open-loop generator
// in a process of its own appends one event per transaction over many
// streams, Postgres commits durably (fsync and synchronous_commit on for
// these rows), the JetStream server runs in a process of its own, and
// each figure is per event appended: Postgres commits and WAL bytes, the
// CPU of the pipeline's process, of Postgres and of the server, and the
// latency from append (and from the generator's intended time) to stored
// in EVENTS.

// The live rows' sessions' application_name.
const (
	livePipelineApp  = "bench-live-pipeline"
	liveGeneratorApp = "bench-live-generator"
)

// livePipeline names what drains the live rows' events: "bridge" (our
// bridge process) or "bare" (bareBridgeChild).
type livePipeline string

// liveFigures are one live run's measurements.
type liveFigures struct {
	events int // appended by the generator
	// lateMax is the generator's largest lateness behind its schedule.
	lateMax time.Duration
	// commits is the database's committed transactions during the run,
	// the appends' own included; wal its WAL bytes; statements the
	// statements run (pg_stat_statements; -1 where it is not loaded).
	commits, wal, statements int64
	// claims is the bridge's claim statements (its claim histogram's
	// count; -1 for the bare reference or when not read).
	claims int64
	// cpu: the pipeline's process, Postgres (all its processes), the
	// JetStream server's process.
	pipelineCPU, postgresCPU, serverCPU time.Duration
	// fromAppend and fromIntended are, sorted, each event's time from its
	// append (its created time: its transaction's start) and from its
	// intended time to its store time in EVENTS.
	fromAppend, fromIntended []time.Duration
	// load is /proc/loadavg's first field at the start and the end.
	loadStart, loadEnd string
}

// commitsPerEvent is the pipeline's commits per event: the run's commits
// less one per append.
func (f liveFigures) commitsPerEvent() float64 {
	return float64(f.commits-int64(f.events)) / float64(max(f.events, 1))
}

func (f liveFigures) perEvent(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(max(f.events, 1))
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(int(float64(len(d))*q), len(d)-1)]
}

// statementsLine says, where pg_stat_statements counted them, the
// statements per event beyond the append's own and the commits that ran
// no statement (a listening session reading notifications), and the
// bridge's claims per event.
func (f liveFigures) statementsLine() string {
	var out string
	if f.statements >= 0 {
		n := float64(max(f.events, 1))
		out = fmt.Sprintf("; statements %.3f/event beyond the append's own, commits without a statement (notifications read) %.3f/event",
			float64(f.statements-int64(f.events))/n, float64(f.commits-f.statements)/n)
	}
	if f.claims >= 0 {
		out += fmt.Sprintf("; claims %.3f/event", float64(f.claims)/float64(max(f.events, 1)))
	}
	return out
}

// summary is the figures as the row prints them.
func (f liveFigures) summary() string {
	return fmt.Sprintf("commits %.3f/event beyond the append's own%s; WAL %.0f B/event; CPU µs/event: pipeline %.0f, Postgres %.0f, JetStream server %.0f; append → EVENTS p50 %s p99 %s (from the intended time p50 %s p99 %s); %d events, generator at most %s late; load %s → %s",
		f.commitsPerEvent(), f.statementsLine(), float64(f.wal)/float64(max(f.events, 1)),
		f.perEvent(f.pipelineCPU), f.perEvent(f.postgresCPU), f.perEvent(f.serverCPU),
		ms(quantile(f.fromAppend, 0.5)), ms(quantile(f.fromAppend, 0.99)),
		ms(quantile(f.fromIntended, 0.5)), ms(quantile(f.fromIntended, 0.99)),
		f.events, ms(f.lateMax), f.loadStart, f.loadEnd)
}

// liveRows runs, for each rate of -live-rates, the bridge and then the
// bare reference, and returns one row per rate.
func (e *env) liveRows(ctx context.Context) ([]row, error) {
	restore, durable, err := e.durablePostgres(ctx)
	if err != nil {
		return nil, err
	}
	defer restore()
	var rows []row
	for _, rate := range e.cfg.LiveRates {
		var figs [2]liveFigures
		for i, p := range []livePipeline{"bridge", "bare"} {
			f, err := e.liveRun(ctx, p, rate)
			if err != nil {
				return rows, fmt.Errorf("%s at %d/s: %w", p, rate, err)
			}
			fmt.Printf("bench: live: %s at %d/s: %s\n", p, rate, f.summary())
			figs[i] = f
		}
		ours, bare := figs[0], figs[1]
		ratio := func(a, b float64) string {
			if b == 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f", a/b)
		}
		r := row{
			Name:      fmt.Sprintf("live: %d events/s for %s over %d streams, one event (%d B) per transaction from an open-loop generator (its own process); Postgres %s; JetStream server in its own process; per event appended", rate, e.cfg.LiveDuration, e.cfg.LiveStreams, liveDataSize, durable),
			Ours:      "bridge: " + ours.summary(),
			Reference: "bare (poll every 5 ms, read past a position, async publish, one UPDATE a batch): " + bare.summary(),
			Ratio: fmt.Sprintf("commits %s, WAL %s, pipeline CPU %s, Postgres CPU %s, p99 from append %s",
				ratio(ours.commitsPerEvent(), bare.commitsPerEvent()),
				ratio(float64(ours.wal), float64(bare.wal)),
				ratio(ours.perEvent(ours.pipelineCPU), bare.perEvent(bare.pipelineCPU)),
				ratio(ours.perEvent(ours.postgresCPU), bare.perEvent(bare.postgresCPU)),
				ratio(float64(quantile(ours.fromAppend, 0.99)), float64(quantile(bare.fromAppend, 0.99)))),
			Target: "printed",
			Met:    true,
		}
		if rate == 1000 {
			r.Target = "the bridge's commits ≤ 0.05 per event (issue 33)"
			r.Met = ours.commitsPerEvent() <= 0.05
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// durablePostgres turns fsync, synchronous_commit and full_page_writes on
// (ALTER SYSTEM, then a reload) for the live rows; restore puts back what
// the configuration files say (the throwaway server has them off). Where
// that is refused (not a superuser) the rows run as the server is
// configured, and durable says which.
func (e *env) durablePostgres(ctx context.Context) (restore func(), durable string, err error) {
	settings := []string{"fsync", "synchronous_commit", "full_page_writes"}
	show := func() string {
		var parts []string
		for _, s := range settings {
			var v string
			if err := e.pool.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = $1", s).Scan(&v); err != nil {
				v = "?"
			}
			parts = append(parts, s+" "+v)
		}
		return strings.Join(parts, ", ")
	}
	restore = func() {}
	for _, s := range settings {
		if _, err := e.pool.Exec(ctx, "ALTER SYSTEM SET "+s+" = on"); err != nil {
			fmt.Printf("bench: live: cannot make Postgres durable (%v); running as configured\n", err)
			return restore, "as configured: " + show(), nil
		}
	}
	restore = func() {
		for _, s := range settings {
			_, _ = e.pool.Exec(context.WithoutCancel(ctx), "ALTER SYSTEM RESET "+s)
		}
		_, _ = e.pool.Exec(context.WithoutCancel(ctx), "SELECT pg_reload_conf()")
	}
	if _, err := e.pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		restore()
		return nil, "", err
	}
	// A backend applies a reload between statements: every new one has.
	want := "fsync on, synchronous_commit on, full_page_writes on"
	err = e.waitFor(ctx, 10*time.Second, "Postgres reload", func() (bool, error) { return show() == want, nil })
	if err != nil {
		restore()
		return nil, "", err
	}
	return restore, want, nil
}

// liveRun runs one live case: a fresh schema, JetStream server and
// pipeline; a warm-up event on every stream (so the run measures steady
// state, not the streams' first rows); then the generator at rate for
// -live-duration, until every event is in EVENTS.
func (e *env) liveRun(ctx context.Context, p livePipeline, rate int) (liveFigures, error) {
	var f liveFigures
	schema := "bench_live_" + string(p)
	if err := e.quiesce(ctx, ""); err != nil {
		return f, err
	}
	if _, err := e.freshStore(ctx, schema); err != nil {
		return f, err
	}
	if p == "bare" {
		if _, err := e.pool.Exec(ctx, strings.ReplaceAll(bareSetupSQL, "{schema}", schema)); err != nil {
			return f, fmt.Errorf("bare schema: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "jsbridge-bench-live-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	bus, err := e.startChildBus(ctx, dir, 1)
	if err != nil {
		return f, err
	}
	defer bus.stop(20 * time.Second)
	// Named, so that the run can wait for their sessions to end (a
	// backend reports its counts when it ends).
	url := e.dbURL + sep(e.dbURL) + "application_name=" + livePipelineApp
	genURL := e.dbURL + sep(e.dbURL) + "application_name=" + liveGeneratorApp

	// The pipeline.
	var pipe *proc.Process
	ops := 0
	if p == "bridge" {
		if pipe, ops, err = e.startBridgeAtURL(ctx, bus.urls, url, schema, e.cfg.LiveBridgeArgs...); err != nil {
			return f, err
		}
		e.profile("bridge-"+schema, ops)
	} else {
		self, err := os.Executable()
		if err != nil {
			return f, err
		}
		if pipe, err = e.procs.Start("bare bridge", self, []string{"-live-bare-child", url + " " + schema + " " + bus.urls}); err != nil {
			return f, err
		}
	}
	defer pipe.Stop(20 * time.Second)

	// The warm-up: one event on every stream, drained.
	warm, _, err := e.generate(ctx, genURL, schema, dir, "warm", e.cfg.LiveStreams, 0)
	if err != nil {
		return f, err
	}
	if err := e.waitEvents(ctx, bus.js, warm); err != nil {
		return f, fmt.Errorf("warm-up: %w", err)
	}
	// Every session's counts reported: the generator's have ended, the
	// pipeline's report within a second of going idle.
	if err := e.settleCounts(ctx, liveGeneratorApp); err != nil {
		return f, err
	}

	c0, err := e.liveCounters(ctx)
	if err != nil {
		return f, err
	}
	var claims0 int64
	if ops != 0 {
		claims0, _ = bridgeCount(ops, "claim")
	}
	pipe0, srv0, pg0 := mustCPU(pipe.Pid()), mustCPU(bus.proc.Pid()), e.postgresCPU(ctx)
	f.loadStart = loadAvg()
	n, late, err := e.generate(ctx, genURL, schema, dir, "run", int(float64(rate)*e.cfg.LiveDuration.Seconds()), rate)
	if err != nil {
		return f, err
	}
	if err := e.waitEvents(ctx, bus.js, warm+n); err != nil {
		return f, err
	}
	f.pipelineCPU, f.serverCPU, f.postgresCPU = mustCPU(pipe.Pid())-pipe0, mustCPU(bus.proc.Pid())-srv0, e.postgresCPU(ctx)-pg0
	f.loadEnd = loadAvg()
	f.events, f.lateMax = n, late
	f.claims = -1
	if ops != 0 {
		if c, err := bridgeCount(ops, "claim"); err == nil {
			f.claims = c - claims0
		}
	}
	if err := pipe.Stop(20 * time.Second); err != nil {
		return f, fmt.Errorf("%s exit: %w", p, err)
	}
	if err := e.settleCounts(ctx, livePipelineApp); err != nil {
		return f, err
	}
	c1, err := e.liveCounters(ctx)
	if err != nil {
		return f, err
	}
	f.commits, f.wal, f.statements = c1.commits-c0.commits, c1.wal-c0.wal, -1
	if c0.statements >= 0 && c1.statements >= 0 {
		f.statements = c1.statements - c0.statements
	}
	f.fromAppend, f.fromIntended, err = liveLatencies(ctx, bus.js)
	return f, err
}

// sep is the separator before one more query parameter of url.
func sep(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}

// mustCPU is processCPU, 0 when it cannot be read.
func mustCPU(pid int) time.Duration {
	d, _ := processCPU(pid)
	return d
}

// loadAvg is /proc/loadavg's 1-minute figure.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// generate runs the generator child until it has appended events (at
// rate a second; rate 0: a warm-up of one event on each of the first
// events streams, as fast as it goes) and stops it.
func (e *env) generate(ctx context.Context, url, schema, dir, name string, events, rate int) (int, time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	out := filepath.Join(dir, "generator-"+name)
	streams, dur := e.cfg.LiveStreams, time.Duration(float64(events)/float64(max(rate, 1))*float64(time.Second))
	if rate == 0 {
		streams = events
	}
	arg := fmt.Sprintf("%s %s %d %s %d %s", url, schema, rate, dur, streams, out)
	g, err := e.procs.Start("generator", self, []string{"-live-generator-child", arg})
	if err != nil {
		return 0, 0, err
	}
	defer g.Stop(20 * time.Second)
	var got []string
	err = e.waitFor(ctx, dur+5*time.Minute, "generator", func() (bool, error) {
		b, err := os.ReadFile(out)
		if err != nil {
			return false, nil
		}
		got = strings.Fields(string(b))
		return true, nil
	})
	if err != nil {
		return 0, 0, err
	}
	if len(got) != 2 {
		return 0, 0, fmt.Errorf("generator wrote %q", got)
	}
	n, err1 := strconv.Atoi(got[0])
	late, err2 := strconv.ParseInt(got[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("generator wrote %q: %w", got, err)
	}
	return n, time.Duration(late) * time.Microsecond, nil
}

// waitEvents waits until EVENTS holds n messages (polling JetStream, not
// Postgres, whose counts the row measures).
func (e *env) waitEvents(ctx context.Context, js jetstream.JetStream, n int) error {
	s, err := js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return err
	}
	var last uint64
	err = e.waitFor(ctx, 5*time.Minute, fmt.Sprintf("%d events in %s", n, wire.DefaultEventsStream), func() (bool, error) {
		info, err := s.Info(ctx)
		if err != nil {
			return false, err
		}
		if info.State.Msgs > uint64(n) {
			return false, fmt.Errorf("%s holds %d messages, more than the %d appended", wire.DefaultEventsStream, info.State.Msgs, n)
		}
		last = info.State.Msgs
		return info.State.Msgs == uint64(n), nil
	})
	if err != nil {
		return fmt.Errorf("%w (it holds %d)", err, last)
	}
	return nil
}

// settleCounts waits until the sessions named gone (application_name)
// have ended, and then a little over a second: Postgres publishes a
// backend's counts when it ends, or within a second of it going idle
// (the pipeline's, which keeps polling, never stays idle long enough
// for its counts to stop moving).
func (e *env) settleCounts(ctx context.Context, gone string) error {
	err := e.waitFor(ctx, 30*time.Second, "the sessions of "+gone+" to end", func() (bool, error) {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, gone).Scan(&n)
		return n == 0, err
	})
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(1200 * time.Millisecond):
		return nil
	}
}

// liveCounter are the database-wide counters a live run reads;
// statements is -1 without pg_stat_statements.
type liveCounter struct{ commits, wal, statements int64 }

func (e *env) liveCounters(ctx context.Context) (liveCounter, error) {
	var c liveCounter
	err := e.pool.QueryRow(ctx, `SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.commits, &c.wal)
	if err != nil {
		return c, err
	}
	if c.statements, err = e.statements(ctx); err != nil {
		c.statements = -1
	}
	return c, nil
}

// bridgeCount is the count of the bridge's histogram
// jsbridge_bridge_<what>_duration_seconds, read from its ops port.
func bridgeCount(ops int, what string) (int64, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", ops))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, count, err := histogramSumCount(resp.Body, "jsbridge_bridge_"+what+"_duration_seconds")
	return int64(count), err
}

// liveLatencies reads EVENTS and returns, sorted, each generated event's
// time from its append (ce-time: its created time) and from its intended
// time (in its data) to its store time; warm-up events are left out.
func liveLatencies(ctx context.Context, js jetstream.JetStream) (fromAppend, fromIntended []time.Duration, err error) {
	err = eachStored(ctx, js, wire.DefaultEventsStream, func(m jetstream.Msg) {
		intended, ok := liveIntended(m.Data())
		md, err := m.Metadata()
		if !ok || err != nil {
			return
		}
		created, err := time.Parse(time.RFC3339Nano, m.Headers().Get(wire.HeaderTime))
		if err != nil {
			return
		}
		fromAppend = append(fromAppend, md.Timestamp.Sub(created))
		fromIntended = append(fromIntended, md.Timestamp.Sub(intended))
	})
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(fromAppend)
	slices.Sort(fromIntended)
	return fromAppend, fromIntended, nil
}

// liveRates parses -live-rates.
func liveRates(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-live-rates: %q is not a rate of at least 1 event/s", f)
		}
		out = append(out, n)
	}
	return out, nil
}
