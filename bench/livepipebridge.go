package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The bridge's share of commit → stored in EVENTS, from its own
// histograms (jsbridge_bridge_<what>_duration_seconds, read from its ops
// port before and after a run): the claim's statement (a claim alone, or
// the acks and the next claim in one transaction), each publish until its
// PubAck, and the ack's call. What the event waited before the claim
// that took it is the rest of the stage.

// liveBridgeHistograms are the bridge histograms a run reads.
var liveBridgeHistograms = []string{"claim", "publish", "ack"}

// histogram is a Prometheus histogram's cumulative bucket counts by
// upper bound (+Inf included), and its count.
type histogram struct {
	le    []float64 // upper bounds, ascending; the last is +Inf
	cum   []float64 // cumulative counts, one per bound
	count float64
}

// readHistogram reads the histogram name from a text exposition.
func readHistogram(r io.Reader, name string) (histogram, error) {
	var h histogram
	type bucket struct{ le, n float64 }
	var bs []bucket
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.Index(line[i+4:], `"`)
		if i < 0 || j < 0 {
			return h, fmt.Errorf("%s: %q", name, line)
		}
		le, err := strconv.ParseFloat(line[i+4:i+4+j], 64)
		if err != nil {
			return h, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		f := strings.Fields(line)
		n, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return h, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		bs = append(bs, bucket{le, n})
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	for _, b := range bs {
		h.le, h.cum = append(h.le, b.le), append(h.cum, b.n)
	}
	if len(bs) > 0 {
		h.count = bs[len(bs)-1].n
	}
	return h, sc.Err()
}

// since is h less before (the same buckets): what was observed between
// the two reads.
func (h histogram) since(before histogram) histogram {
	if len(before.cum) != len(h.cum) {
		return h
	}
	out := histogram{le: h.le, cum: make([]float64, len(h.cum)), count: h.count - before.count}
	for i := range h.cum {
		out.cum[i] = h.cum[i] - before.cum[i]
	}
	return out
}

// quantile is the q-quantile of h, interpolated linearly inside its
// bucket as Prometheus' histogram_quantile does (from 0 in the first
// bucket; the last finite bound when it falls in +Inf); 0 when empty.
func (h histogram) quantile(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	rank := q * h.count
	for i, c := range h.cum {
		if c < rank {
			continue
		}
		if math.IsInf(h.le[i], 1) {
			if i == 0 {
				return 0
			}
			return time.Duration(h.le[i-1] * float64(time.Second))
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = h.le[i-1], h.cum[i-1]
		}
		in := c - below
		frac := 1.0
		if in > 0 {
			frac = (rank - below) / in
		}
		return time.Duration((lo + (h.le[i]-lo)*frac) * float64(time.Second))
	}
	return 0
}

// bridgeHistograms reads liveBridgeHistograms from the bridge's ops port.
func bridgeHistograms(ops int) (map[string]histogram, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", ops))
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	out := map[string]histogram{}
	for _, what := range liveBridgeHistograms {
		h, err := readHistogram(bytes.NewReader(body), "jsbridge_bridge_"+what+"_duration_seconds")
		if err != nil {
			return nil, err
		}
		out[what] = h
	}
	return out, nil
}

// bridgeStagesLine prints, per histogram of the run, its count per event
// and its p50 and p99; "none" without them.
func bridgeStagesLine(hs map[string]histogram, events int) string {
	if hs == nil {
		return "none"
	}
	var parts []string
	for _, what := range liveBridgeHistograms {
		h := hs[what]
		parts = append(parts, fmt.Sprintf("%s %.3f/event p50 %s p99 %s", what, h.count/float64(max(events, 1)), ms(h.quantile(0.5)), ms(h.quantile(0.99))))
	}
	return "bridge histograms: " + strings.Join(parts, "; ")
}

// bridgeLine prints the bridge's histograms of the run, where read.
func (f livePipeFigures) bridgeLine() string {
	waits := f.waits.line() + "; " + f.waits.tailShare()
	if f.sessionWaits != nil {
		waits += fmt.Sprintf("; Postgres sessions sampled every %s while active: %s; %s", liveWaitSampleEvery, f.sessionWaits.line(livePipelineApp, "pipeline's"), f.sessionWaits.line(liveGeneratorApp, "appends'"))
	}
	if f.bridgeHists == nil {
		return "bridge histograms: none; " + waits
	}
	return bridgeStagesLine(f.bridgeHists, f.events) + "; " + waits
}

// liveBridgeStageRow is a rate's row of the bridge's stage: commit →
// stored in EVENTS beside the bridge's histograms and its statements by
// kind.
func liveBridgeStageRow(name string, ours livePipeFigures) row {
	return row{
		Name:      name + ": the bridge's stage, commit → stored in EVENTS, beside its histograms (claim: a claim, or acks and the next claim in one transaction; publish: until the PubAck; ack) and its statements by kind (pg_stat_statements)",
		Ours:      fmt.Sprintf("commit → stored in EVENTS %s; %s; statements %s", livePercentiles(ours.toEvents), ours.bridgeLine(), statementsLine(ours.statements, ours.events)),
		Reference: "—",
		Ratio:     "—",
		Target:    "printed",
		Met:       true,
	}
}

// Where an event's wait for the bridge comes from: each event of a
// stream, by its commit, against its stream's previous event (by commit
// time; one event a transaction, so appends to one stream commit in
// version order). An event committed while its stream's previous event
// was not yet stored in EVENTS waits behind that event's cycle: its
// stream is pending or leased, so its append notifies nobody and only the
// claim after that cycle's ack takes it. One committed soon after its
// previous event was stored (within liveAckWindow) may still find the
// stream leased, the ack not yet made. The others found their stream
// caught up and free.
const liveAckWindow = 20 * time.Millisecond

// liveWaitClass names the classes of liveWaits, in the order printed.
var liveWaitClass = []string{"behind its stream's previous event", "within 20 ms of its previous event's store", "stream free"}

// liveWaits is, by class (liveWaitClass's index), commit → stored in
// EVENTS of the events in it, sorted.
type liveWaits [3][]time.Duration

// streamWaits sorts the events both commits and stored have into the
// classes of liveWaitClass.
func streamWaits(commits map[string]liveCommit, stored map[string]liveStored) liveWaits {
	type ev struct{ commit, stored time.Time }
	byStream := map[int][]ev{}
	for id, c := range commits {
		if s, ok := stored[id]; ok {
			byStream[c.stream] = append(byStream[c.stream], ev{c.at, s.at})
		}
	}
	var w liveWaits
	for _, evs := range byStream {
		slices.SortFunc(evs, func(a, b ev) int { return a.commit.Compare(b.commit) })
		for i, e := range evs {
			class := 2
			if i > 0 {
				switch prev := evs[i-1].stored; {
				case prev.After(e.commit):
					class = 0
				case e.commit.Sub(prev) <= liveAckWindow:
					class = 1
				}
			}
			w[class] = append(w[class], e.stored.Sub(e.commit))
		}
	}
	for i := range w {
		slices.Sort(w[i])
	}
	return w
}

// line prints each class's share of the events and its percentiles.
func (w liveWaits) line() string {
	n := 0
	for _, c := range w {
		n += len(c)
	}
	parts := make([]string, len(w))
	for i, c := range w {
		parts[i] = fmt.Sprintf("%s %.1f %% (%s)", liveWaitClass[i], 100*float64(len(c))/float64(max(n, 1)), livePercentiles(c))
	}
	return "commit → stored in EVENTS by the stream's state at the commit: " + strings.Join(parts, "; ")
}

// tailShare is, of the events whose commit → stored in EVENTS is at or
// past the p99 of all, each class's share (in percent).
func (w liveWaits) tailShare() string {
	var all []time.Duration
	for _, c := range w {
		all = append(all, c...)
	}
	slices.Sort(all)
	p99 := quantile(all, 0.99)
	counts := make([]int, len(w))
	n := 0
	for i, c := range w {
		j, _ := slices.BinarySearch(c, p99)
		counts[i] = len(c) - j
		n += counts[i]
	}
	parts := make([]string, len(w))
	for i := range w {
		parts[i] = fmt.Sprintf("%.0f %%", 100*float64(counts[i])/float64(max(n, 1)))
	}
	return fmt.Sprintf("of the events at or past the p99 (%s): %s", ms(p99), strings.Join(parts, " / "))
}

// liveWaitSampleEvery is how often the row samples what the Postgres
// sessions of the pipeline and of the generator wait on while active.
const liveWaitSampleEvery = 5 * time.Millisecond

// The classes of a sampled session's wait event, in the order printed.
var liveWaitKinds = []string{"CPU", "WAL flush", "row lock", "other lock", "other"}

// waitKind names the class of a wait event type and name ("" for none:
// on the CPU, or waiting for one).
func waitKind(typ, name string) string {
	switch {
	case typ == "":
		return "CPU"
	case name == "WALWrite" || name == "WALSync" || name == "WALFlush":
		return "WAL flush"
	case typ == "Lock" && (name == "transactionid" || name == "tuple"):
		return "row lock"
	case typ == "Lock" || typ == "LWLock":
		return "other lock"
	}
	return "other"
}

// sessionWaits counts, by application_name and class (waitKind), the
// samples of active sessions.
type sessionWaits map[string]map[string]int

// sampleWaits samples pg_stat_activity every liveWaitSampleEvery until
// ctx ends, counting the active sessions of apps by what they wait on;
// a failed sample is skipped. Each query reads a fresh snapshot of the
// activity (one transaction a query). It samples from a connection to
// the database postgres (pg_stat_activity shows the whole server), so
// that its 200 queries a second stay out of the measured database's
// pg_stat_statements and xact_commit (the row's "other" statements and
// read-only commits); it falls back to the bench's pool when that
// database cannot be reached.
func (e *env) sampleWaits(ctx context.Context, apps ...string) sessionWaits {
	out := sessionWaits{}
	for _, a := range apps {
		out[a] = map[string]int{}
	}
	var q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	} = e.pool
	cfg := e.pool.Config().ConnConfig.Copy()
	cfg.Database = "postgres"
	if conn, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		defer conn.Close(context.WithoutCancel(ctx))
		q = conn
	}
	t := time.NewTicker(liveWaitSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		rows, err := q.Query(ctx, `SELECT application_name, coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND application_name = ANY($1)`, apps)
		if err != nil {
			continue
		}
		var app, typ, name string
		_, _ = pgx.ForEachRow(rows, []any{&app, &typ, &name}, func() error {
			out[app][waitKind(typ, name)]++
			return nil
		})
	}
}

// line prints, for app, its samples and each class's share of them.
func (w sessionWaits) line(app, label string) string {
	n := 0
	for _, c := range w[app] {
		n += c
	}
	parts := make([]string, 0, len(liveWaitKinds))
	for _, k := range liveWaitKinds {
		parts = append(parts, fmt.Sprintf("%s %.0f %%", k, 100*float64(w[app][k])/float64(max(n, 1))))
	}
	return fmt.Sprintf("%s %d active samples: %s", label, n, strings.Join(parts, ", "))
}
