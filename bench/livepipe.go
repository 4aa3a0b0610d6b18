package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// The live pipeline rows (issue 33, items 1 to 3): the whole path at the
// steady rates people run, append → webhook received, beside a bare
// reference pipeline in the same run. The open-loop generator (its own
// process) appends one event per transaction over -live-pipeline-streams
// streams with a skewed spread (livespread.go); Postgres commits durably;
// the bridge and the consumer run as users run them (bin/bridge,
// bin/consumer with a subscriptions file: one ordered and one unordered
// subscription); the JetStream server and the receiver (livereceiver.go:
// it verifies every signature and answers after -live-receiver-delay)
// are processes of their own. The bare reference (one process,
// bench -live-bare-child with a webhook URL): poll every 5 ms → read → async
// publish with Nats-Msg-Id → one pull consumer → signed POST → ack, to the
// same receiver program.

// The receiver paths' subscription names.
const (
	liveSubOrdered   = "ordered"
	liveSubUnordered = "unordered"
	liveSubBare      = "bare"
)

// livePipelineRows runs the live pipeline rows: for each rate of
// -live-pipeline-rates, our pipeline and then the bare one; then the
// search for the highest rate each holds for -live-hold; and the rows of
// issue 33's targets.
func (e *env) livePipelineRows(ctx context.Context) ([]row, error) {
	restore, durable, err := e.durablePostgres(ctx)
	if err != nil {
		return nil, err
	}
	defer restore()
	if err := e.ensureStatements(ctx); err != nil {
		fmt.Printf("bench: live pipeline: pg_stat_statements not loaded (%v): the statement split is left out\n", err)
	}
	var rows []row
	type pair struct{ ours, bare livePipeFigures }
	byRate := map[int]pair{}
	for _, rate := range e.cfg.LivePipeRates {
		var pr pair
		for _, p := range e.cfg.LivePipes {
			f, err := e.livePipeRun(ctx, p, rate, e.cfg.LiveDuration)
			if err != nil {
				return rows, fmt.Errorf("%s pipeline at %d/s: %w", p, rate, err)
			}
			fmt.Printf("bench: live pipeline: %s at %d/s: %s\n", p, rate, f.summary())
			if p == "bridge" {
				pr.ours = f
			} else {
				pr.bare = f
			}
		}
		byRate[rate] = pr
		rows = append(rows, e.livePipeRateRows(pr.ours, pr.bare, durable)...)
	}
	// The hottest stream, from the highest rate's run of ours.
	if len(e.cfg.LivePipeRates) > 0 {
		top := slices.Max(e.cfg.LivePipeRates)
		rows = append(rows, e.liveHotRow(byRate[top].ours))
	}
	if e.cfg.LiveSearchSteps > 0 {
		var held [2]int
		var known [2]bool
		for i, p := range []livePipeline{"bridge", "bare"} {
			start := 0
			for _, rate := range e.cfg.LivePipeRates {
				f := byRate[rate].ours
				if p == "bare" {
					f = byRate[rate].bare
				}
				if f.held && rate > start {
					start = rate
				}
			}
			if start == 0 && len(e.cfg.LivePipeRates) > 0 {
				start = slices.Min(e.cfg.LivePipeRates) / 2
			}
			h, top, err := e.liveSearch(ctx, p, start)
			if err != nil {
				return rows, fmt.Errorf("%s pipeline, highest rate: %w", p, err)
			}
			held[i], known[i] = h, top
		}
		say := func(h int, bounded bool) string {
			if h == 0 {
				return "none held"
			}
			if !bounded {
				return fmt.Sprintf("%d events/s (the highest tried)", h)
			}
			return fmt.Sprintf("%d events/s", h)
		}
		r := float64(held[0]) / float64(max(held[1], 1))
		rows = append(rows, row{
			Name:      fmt.Sprintf("live pipeline: the highest rate held for %s without a growing backlog (generator never over 1 s late, under a second's events undelivered at its end), ordered subscription; searched in %d steps a pipeline", e.cfg.LiveHold, e.cfg.LiveSearchSteps),
			Ours:      say(held[0], known[0]),
			Reference: "bare pipeline: " + say(held[1], known[1]),
			Ratio:     liveRatio(float64(held[0]), float64(held[1])),
			Target:    "≥ 0.8 (issue 33)",
			Met:       held[1] > 0 && r >= 0.8,
		})
	}
	return rows, nil
}

// liveSearch finds the highest rate pipeline p holds for -live-hold,
// from start (a rate it held in a shorter run, or a guess): each step
// runs one rate for -live-hold; up by half while every step holds, then
// halving the interval. It returns the highest rate held (0: none) and
// whether a higher one was seen failing (else the search ran out of steps
// going up).
func (e *env) liveSearch(ctx context.Context, p livePipeline, start int) (int, bool, error) {
	lo, hi, rate := 0, 0, max(start, 50)
	for range e.cfg.LiveSearchSteps {
		f, err := e.livePipeRun(ctx, p, rate, e.cfg.LiveHold)
		if err != nil {
			return 0, false, err
		}
		fmt.Printf("bench: live pipeline: search: %s at %d/s for %s: held %v (backlog %v, generator at most %s late)\n", p, rate, e.cfg.LiveHold, f.held, f.backlog, ms(f.lateMax))
		if f.held {
			lo = rate
		} else {
			hi = rate
		}
		next := rate * 3 / 2
		if hi > 0 {
			next = (lo + hi) / 2
		}
		next = next / 25 * 25
		if next <= lo || (hi > 0 && next >= hi) {
			break
		}
		rate = next
	}
	return lo, hi > 0, nil
}

// liveConsumerConfig is the subscriptions file of our pipeline: one
// ordered and one unordered subscription of every event to the receiver.
func liveConsumerConfig(r *liveReceiverProc) string {
	var b strings.Builder
	b.WriteString("subscriptions:\n")
	for _, s := range []struct{ name, ordering string }{{liveSubOrdered, "stream"}, {liveSubUnordered, "none"}} {
		fmt.Fprintf(&b, "  - name: live-%s\n    filter_subjects: [%s]\n    url: %s\n    secrets_env: [%s]\n    allow_private: true\n    ordering: %s\n    start: all\n",
			s.name, wire.All(wire.DefaultEventsPrefix), r.hook(s.name), liveSecretEnv, s.ordering)
	}
	return b.String()
}

// livePipeRun runs one live pipeline case: a fresh schema, JetStream
// server, receiver and pipeline; a warm-up event on every stream,
// delivered; then the generator at rate for dur, until every event is
// received by every subscription.
func (e *env) livePipeRun(ctx context.Context, p livePipeline, rate int, dur time.Duration) (livePipeFigures, error) {
	f := livePipeFigures{pipeline: p, rate: rate, dur: dur, cpu: map[string]time.Duration{}, stmtAppends: -1, stmtOther: -1, claims: -1}
	schema := "bench_livepipe_" + string(p)
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
	dir, err := os.MkdirTemp("", "jsbridge-bench-livepipe-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	bus, err := e.startChildBus(ctx, dir, 1)
	if err != nil {
		return f, err
	}
	defer bus.stop(20 * time.Second)
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	recv, err := e.startLiveReceiver(ctx, secret, e.cfg.LiveDelay)
	if err != nil {
		return f, err
	}
	defer recv.p.Stop(5 * time.Second)
	url := e.dbURL + sep(e.dbURL) + "application_name=" + livePipelineApp
	genURL := e.dbURL + sep(e.dbURL) + "application_name=" + liveGeneratorApp

	// The pipeline: its processes by name.
	procs := map[string]*proc.Process{}
	ops := 0
	var profOps map[string]int // with -profile-dir: the processes profiled during the run, by ops port
	if p == "bridge" {
		f.subs = []string{liveSubOrdered, liveSubUnordered}
		bridge, bops, err := e.startBridgeAtURL(ctx, bus.urls, url, schema, e.cfg.LiveBridgeArgs...)
		if err != nil {
			return f, err
		}
		defer bridge.Stop(20 * time.Second)
		procs["bridge"], ops = bridge, bops
		cfgFile := filepath.Join(dir, "subscriptions.yaml")
		if err := os.WriteFile(cfgFile, []byte(liveConsumerConfig(recv)), 0o600); err != nil {
			return f, err
		}
		cops, err := proc.FreePort()
		if err != nil {
			return f, err
		}
		cargs := []string{"run", "-c", cfgFile, "--nats-url", bus.urls,
			"--ops-addr", fmt.Sprintf("127.0.0.1:%d", cops), "--log-level", "warn"}
		if e.cfg.ProfileDir != "" {
			cargs = append(cargs, "--pprof")
		}
		cons, err := e.procs.Start("consumer", e.cfg.Bin+"/consumer", cargs, liveSecretEnv+"="+secret)
		if err != nil {
			return f, err
		}
		defer cons.Stop(20 * time.Second)
		procs["consumer"] = cons
		profOps = map[string]int{"bridge": bops, "consumer": cops}
		if err := proc.WaitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", cops), cons); err != nil {
			return f, err
		}
	} else {
		f.subs = []string{liveSubBare}
		self, err := os.Executable()
		if err != nil {
			return f, err
		}
		bp, err := e.procs.Start("bare pipeline", self, []string{"-live-bare-child", url + " " + schema + " " + bus.urls + " " + recv.hook(liveSubBare)}, liveSecretEnv+"="+secret)
		if err != nil {
			return f, err
		}
		defer bp.Stop(20 * time.Second)
		procs["bare pipeline"] = bp
	}
	procs["server"], procs["receiver"] = bus.proc, recv.p
	delivered := func(n int) func() (bool, error) {
		return func() (bool, error) {
			for _, s := range f.subs {
				c, err := recv.count(s)
				if err != nil || c < n {
					return false, err
				}
			}
			return true, nil
		}
	}

	// The warm-up: one event on every stream, delivered.
	warm, err := e.generateLive(ctx, genURL, schema, dir, "warm", e.cfg.LivePipeStreams, 0, 0, nil)
	if err != nil {
		return f, err
	}
	if err := e.waitEvents(ctx, bus.js, warm.n); err != nil {
		return f, fmt.Errorf("warm-up: %w", err)
	}
	if err := e.waitFor(ctx, 10*time.Minute, "the warm-up delivered", delivered(warm.n)); err != nil {
		return f, err
	}
	if err := e.settleCounts(ctx, liveGeneratorApp); err != nil {
		return f, err
	}
	if err := e.analyzeLive(ctx, schema); err != nil {
		return f, err
	}
	if err := recv.reset(); err != nil {
		return f, err
	}

	c0, err := e.liveCounters(ctx)
	if err != nil {
		return f, err
	}
	var claims0 int64
	var hist0 map[string]histogram
	if ops != 0 {
		claims0, _ = bridgeCount(ops, "claim")
		hist0, _ = bridgeHistograms(ops)
	}
	x0, xErr := e.liveXactCounters(ctx)
	st0, st0Err := e.liveStatementsNow(ctx)
	cpu0 := map[string]time.Duration{}
	for name, pr := range procs {
		cpu0[name] = mustCPU(pr.Pid())
	}
	pg0, pgPipe0 := e.postgresCPU(ctx), e.sessionCPU(ctx, livePipelineApp)
	a0, o0, stmtErr := e.statementTimes(ctx)
	rejected0, _ := recv.rejected()
	f.load[0] = loadAvg()
	events := int(float64(rate) * dur.Seconds())
	for name, port := range profOps {
		e.profile(fmt.Sprintf("livepipe-%s-%d", name, rate), port)
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan sessionWaits, 1)
	go func() { sampled <- e.sampleWaits(sampleCtx, livePipelineApp, liveGeneratorApp) }()
	run, err := e.generateLive(ctx, genURL, schema, dir, "run", events, rate, e.cfg.LiveZipf, func() {
		f.backlog = map[string]int{}
		for _, s := range f.subs {
			c, _ := recv.count(s)
			f.backlog[s] = events - c
		}
		f.cpu["postgres: appends"] = e.sessionCPU(ctx, liveGeneratorApp)
	})
	stopSampling()
	f.sessionWaits = <-sampled
	if err != nil {
		return f, err
	}
	f.events, f.lateMax, f.cpu["generator"] = run.n, run.late, run.cpu
	f.held = liveHeld(rate, f.lateMax, f.backlog)
	if err := e.waitEvents(ctx, bus.js, warm.n+run.n); err != nil {
		return f, err
	}
	if err := e.waitFor(ctx, 15*time.Minute, "every event delivered", delivered(run.n)); err != nil {
		return f, err
	}
	for name, pr := range procs {
		f.cpu[name] = mustCPU(pr.Pid()) - cpu0[name]
	}
	f.cpu["postgres"] = e.postgresCPU(ctx) - pg0
	f.cpu["postgres: pipeline"] = e.sessionCPU(ctx, livePipelineApp) - pgPipe0
	if a1, o1, err := e.statementTimes(ctx); err == nil && stmtErr == nil {
		f.stmtAppends, f.stmtOther = a1-a0, o1-o0
	}
	f.load[1] = loadAvg()
	if rejected1, err := recv.rejected(); err == nil {
		f.rejected = rejected1 - rejected0
	}
	if ops != 0 {
		if c, err := bridgeCount(ops, "claim"); err == nil {
			f.claims = c - claims0
		}
		if h1, err := bridgeHistograms(ops); err == nil && hist0 != nil {
			f.bridgeHists = map[string]histogram{}
			for what, h := range h1 {
				f.bridgeHists[what] = h.since(hist0[what])
			}
		}
	}
	if st1, err := e.liveStatementsNow(ctx); err == nil && st0Err == nil {
		f.statements = statementsByKind(st0, st1)
	}
	f.stored, f.storedMsgs = map[string]int64{}, map[string]uint64{}
	for _, name := range liveStoredStreams {
		if sz, err := streamSizes(ctx, bus.js, dir, name); err == nil {
			f.stored[name], f.storedMsgs[name] = sz.sealed(), sz.msgs
		}
	}
	receipts := map[string]map[string]time.Time{}
	for _, s := range f.subs {
		if receipts[s], err = recv.receipts(s); err != nil {
			return f, err
		}
	}
	for _, name := range []string{"consumer", "bare pipeline", "bridge"} {
		if pr, ok := procs[name]; ok {
			if err := pr.Stop(20 * time.Second); err != nil {
				return f, fmt.Errorf("%s exit: %w", name, err)
			}
		}
	}
	if err := e.settleCounts(ctx, livePipelineApp); err != nil {
		return f, err
	}
	c1, err := e.liveCounters(ctx)
	if err != nil {
		return f, err
	}
	f.commits = c1.commits - c0.commits
	if x1, err := e.liveXactCounters(ctx); err == nil && xErr == nil {
		f.split = splitCommits(x0, x1, run.n)
		f.splitKnown = true
	}
	stored, err := liveStoredTimes(ctx, bus.js)
	if err != nil {
		return f, err
	}
	f.fillLatencies(run.commits, stored, receipts)
	return f, nil
}

// liveGenerated is what a generator child reported: events appended, its
// largest lateness, its CPU, and (for a run) each event's commit by ce-id.
type liveGenerated struct {
	n       int
	late    time.Duration
	cpu     time.Duration
	commits map[string]liveCommit
}

// generateLive runs the generator child with the Zipf exponent zipf until
// it has appended events (rate 0: the warm-up, one event on each of the
// first events streams); atEnd, when not nil, runs once it has, before
// it is stopped (its sessions still open).
func (e *env) generateLive(ctx context.Context, url, schema, dir, name string, events, rate int, zipf float64, atEnd func()) (liveGenerated, error) {
	var g liveGenerated
	self, err := os.Executable()
	if err != nil {
		return g, err
	}
	out := filepath.Join(dir, "generator-"+name)
	streams, dur := e.cfg.LivePipeStreams, time.Duration(float64(events)/float64(max(rate, 1))*float64(time.Second))
	if rate == 0 {
		streams = events
	}
	arg := fmt.Sprintf("%s %s %d %s %d %s %g", url, schema, rate, dur, streams, out, zipf)
	gp, err := e.procs.Start("generator", self, []string{"-live-generator-child", arg})
	if err != nil {
		return g, err
	}
	defer gp.Stop(20 * time.Second)
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
		return g, err
	}
	if atEnd != nil {
		atEnd()
	}
	g.cpu = mustCPU(gp.Pid())
	if len(got) != 2 {
		return g, fmt.Errorf("generator wrote %q", got)
	}
	late, err2 := strconv.ParseInt(got[1], 10, 64)
	g.n, err = strconv.Atoi(got[0])
	if err != nil || err2 != nil {
		return g, fmt.Errorf("generator wrote %q", got)
	}
	g.late = time.Duration(late) * time.Microsecond
	if rate == 0 {
		return g, nil
	}
	b, err := os.ReadFile(out + ".commits")
	if err != nil {
		return g, err
	}
	g.commits = make(map[string]liveCommit, g.n)
	for line := range strings.Lines(string(b)) {
		var id, stream, at int64
		if _, err := fmt.Sscan(line, &id, &stream, &at); err != nil {
			return g, fmt.Errorf("generator commits: line %q: %w", line, err)
		}
		g.commits[strconv.FormatInt(id, 10)] = liveCommit{stream: int(stream), at: time.UnixMicro(at)}
	}
	return g, nil
}
