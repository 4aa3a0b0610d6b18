package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// The live pipeline rows' figures (livePipeline, livepipe.go): what one
// run measured, the arithmetic and the lines printed from it, and the
// latencies joined from the generator's commits, EVENTS and the receipts.

// livePipeFigures are one live pipeline run's measurements.
type livePipeFigures struct {
	pipeline livePipeline
	rate     int
	dur      time.Duration
	events   int // appended by the generator
	lateMax  time.Duration
	subs     []string
	// backlog is, by subscription, the events appended but not yet
	// received when the generator finished; held says whether every
	// subscription kept up (liveHeld).
	backlog map[string]int
	held    bool
	// fromCommit and fromIntended are, by subscription and sorted, each
	// event's time from its append's commit (when store.Append returned
	// in the generator) and from its intended time (the open-loop
	// schedule's) to the receiver's first receipt of it.
	fromCommit, fromIntended map[string][]time.Duration
	// toEvents is, sorted, commit → stored in EVENTS; fromEvents, by
	// subscription, stored in EVENTS → received.
	toEvents   []time.Duration
	fromEvents map[string][]time.Duration
	// cpu is each process's CPU during the run, by name (liveProcs), and
	// Postgres's: all its processes ("postgres"), the generator's
	// sessions' backends ("postgres: appends") and the pipeline's
	// ("postgres: pipeline").
	cpu map[string]time.Duration
	// stmtAppends and stmtOther are pg_stat_statements' execution time
	// of the appends' INSERT and of every other statement (the bridge's,
	// and the bench's few); -1 where it is not loaded.
	stmtAppends, stmtOther time.Duration
	commits, claims        int64
	// split is the commits beyond the appends' told into those that
	// wrote and read-only ones (splitKnown: read); statements is
	// pg_stat_statements by kind (nil: not read); bridgeHists the
	// bridge's histograms during the run (nil: not read).
	split       liveCommitSplit
	splitKnown  bool
	statements  map[string]liveStatement
	bridgeHists map[string]histogram
	// waits is commit → stored in EVENTS by the stream's state at the
	// commit (streamWaits).
	waits liveWaits
	// sessionWaits is what the pipeline's and the generator's Postgres
	// sessions waited on while the generator ran (nil: not sampled).
	sessionWaits sessionWaits
	// stored is, by stream (liveStoredStreams), the disk it takes
	// (storageSizes.sealed) and its messages.
	stored     map[string]int64
	storedMsgs map[string]uint64
	// hot is the hottest stream's rank, hotShare its share of the run's
	// events, hotP99 its ordered (or bare) p99 from commit, hotGap the
	// median gap between two of its webhooks when the second, stored in
	// EVENTS before the first was received, had waited for it (0: none
	// waited).
	hot      int
	hotShare float64
	hotP99   time.Duration
	hotGap   time.Duration
	rejected int64
	load     [2]string
}

// The processes whose CPU a run reads, in the order the rows print them.
var liveProcs = []string{"generator", "bridge", "consumer", "bare pipeline", "server", "receiver", "postgres", "postgres: appends", "postgres: pipeline"}

// perEvent is d in µs per event appended.
func (f livePipeFigures) perEvent(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(max(f.events, 1))
}

// pipelineCPU is what the pipeline spent beyond the application and the
// receiver: bridge, consumer (or the bare process), server, and the
// pipeline's Postgres sessions.
func (f livePipeFigures) pipelineCPU() time.Duration {
	return f.cpu["bridge"] + f.cpu["consumer"] + f.cpu["bare pipeline"] + f.cpu["server"] + f.cpu["postgres: pipeline"]
}

// perWebhook is the pipeline's CPU per webhook delivered (µs): events ×
// subscriptions webhooks.
func (f livePipeFigures) perWebhook() float64 {
	return float64(f.pipelineCPU().Microseconds()) / float64(max(f.events*len(f.subs), 1))
}

// liveHeld reports whether a run kept up: the generator was never more
// than a second behind its schedule, and no subscription had more than a
// second's events (rate) left to deliver when it finished.
func liveHeld(rate int, lateMax time.Duration, backlog map[string]int) bool {
	if lateMax > time.Second {
		return false
	}
	for _, b := range backlog {
		if b > rate {
			return false
		}
	}
	return true
}

// liveRatio is a ÷ b with two decimals, "—" when b is 0.
func liveRatio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// livePercentiles prints p50, p99 and p99.9 of sorted d.
func livePercentiles(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %s p99 %s p99.9 %s", ms(quantile(d, 0.5)), ms(quantile(d, 0.99)), ms(quantile(d, 0.999)))
}

// cpuLine prints each process's CPU per event.
func (f livePipeFigures) cpuLine() string {
	var parts []string
	for _, name := range liveProcs {
		if d, ok := f.cpu[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", name, f.perEvent(d)))
		}
	}
	s := "CPU µs/event: " + strings.Join(parts, ", ")
	if f.stmtAppends >= 0 {
		s += fmt.Sprintf("; statement time µs/event (pg_stat_statements): appends %.0f, other %.0f",
			f.perEvent(f.stmtAppends), f.perEvent(f.stmtOther))
	}
	return s + fmt.Sprintf("; pipeline (%s) %.0f µs/webhook over %d subscription(s)",
		"bridge, consumer or bare process, server, the pipeline's Postgres sessions", f.perWebhook(), len(f.subs))
}

// latencyLine prints, by subscription, commit → webhook and intended →
// webhook.
func (f livePipeFigures) latencyLine() string {
	var parts []string
	for _, s := range f.subs {
		parts = append(parts, fmt.Sprintf("%s: from commit %s; from intended %s", s, livePercentiles(f.fromCommit[s]), livePercentiles(f.fromIntended[s])))
	}
	return strings.Join(parts, "; ")
}

// stageLine prints commit → EVENTS and EVENTS → received.
func (f livePipeFigures) stageLine() string {
	s := "commit → stored in EVENTS " + livePercentiles(f.toEvents)
	for _, sub := range f.subs {
		s += fmt.Sprintf("; EVENTS → %s received %s", sub, livePercentiles(f.fromEvents[sub]))
	}
	return s
}

// liveStoredStreams are the streams whose storage the live pipeline row
// counts: EVENTS, the attempts stream and the positions bucket
// (whichever exist).
var liveStoredStreams = []string{wire.DefaultEventsStream, wire.DefaultAttemptsStream, "KV_" + position.DefaultBucket}

// storageLine prints bytes stored per event, each stream against EVENTS'.
func (f livePipeFigures) storageLine() string {
	n := float64(max(f.storedMsgs[wire.DefaultEventsStream], 1))
	events := float64(f.stored[wire.DefaultEventsStream]) / n
	s := fmt.Sprintf("stored B/event: EVENTS %.0f", events)
	var all int64
	for _, name := range liveStoredStreams {
		b, ok := f.stored[name]
		if !ok {
			continue
		}
		all += b
		if name != wire.DefaultEventsStream {
			s += fmt.Sprintf(", %s %.0f (%d records)", name, float64(b)/n, f.storedMsgs[name])
		}
	}
	return s + fmt.Sprintf("; all %.0f, %s × EVENTS'", float64(all)/n, liveRatio(float64(all), float64(f.stored[wire.DefaultEventsStream])))
}

// commitsPerEvent is the database's commits beyond the appends' own.
func (f livePipeFigures) commitsPerEvent() float64 {
	return float64(f.commits-int64(f.events)) / float64(max(f.events, 1))
}

// summary is one run as printed.
func (f livePipeFigures) summary() string {
	claims := ""
	if f.claims >= 0 {
		claims = fmt.Sprintf(", claims %.3f/event", float64(f.claims)/float64(max(f.events, 1)))
	}
	return fmt.Sprintf("%d events at %d/s for %s (generator at most %s late; backlog when it finished %v: held %v); %s; by stage: %s; %s; %s%s; %s; %s; receiver refused %d; load %s → %s",
		f.events, f.rate, f.dur, ms(f.lateMax), f.backlog, f.held, f.latencyLine(), f.stageLine(), f.cpuLine(), f.commitsLine(), claims, f.bridgeLine(), f.storageLine(), f.rejected, f.load[0], f.load[1])
}

// liveCommit is one event the generator appended: its stream rank and
// when its append returned.
type liveCommit struct {
	stream int
	at     time.Time
}

// fillLatencies fills f's latencies and hottest stream from the
// generator's commits (by ce-id), EVENTS' store times (by ce-id, with
// each event's intended time) and each subscription's receipts.
func (f *livePipeFigures) fillLatencies(commits map[string]liveCommit, stored map[string]liveStored, receipts map[string]map[string]time.Time) {
	f.fromCommit, f.fromIntended, f.fromEvents = map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}
	ranks := make([]int, 0, len(commits))
	for id, c := range commits {
		ranks = append(ranks, c.stream)
		if s, ok := stored[id]; ok {
			f.toEvents = append(f.toEvents, s.at.Sub(c.at))
		}
	}
	f.hotShare, f.hot = hottestShare(ranks)
	f.waits = streamWaits(commits, stored)
	hotSub := f.subs[0] // ordered, or bare
	var hotLat []time.Duration
	// The hottest stream's events: stored in EVENTS, received.
	type hotEvent struct{ stored, received time.Time }
	var hotEvents []hotEvent
	for _, sub := range f.subs {
		for id, at := range receipts[sub] {
			c, ok := commits[id]
			if !ok {
				continue
			}
			f.fromCommit[sub] = append(f.fromCommit[sub], at.Sub(c.at))
			if s, ok := stored[id]; ok {
				f.fromIntended[sub] = append(f.fromIntended[sub], at.Sub(s.intended))
				f.fromEvents[sub] = append(f.fromEvents[sub], at.Sub(s.at))
			}
			if sub == hotSub && c.stream == f.hot {
				hotLat = append(hotLat, at.Sub(c.at))
				if s, ok := stored[id]; ok {
					hotEvents = append(hotEvents, hotEvent{s.at, at})
				}
			}
		}
		slices.Sort(f.fromCommit[sub])
		slices.Sort(f.fromIntended[sub])
		slices.Sort(f.fromEvents[sub])
	}
	slices.Sort(f.toEvents)
	slices.Sort(hotLat)
	f.hotP99 = quantile(hotLat, 0.99)
	slices.SortFunc(hotEvents, func(a, b hotEvent) int { return a.received.Compare(b.received) })
	storedAt, receivedAt := make([]time.Time, len(hotEvents)), make([]time.Time, len(hotEvents))
	for i, h := range hotEvents {
		storedAt[i], receivedAt[i] = h.stored, h.received
	}
	f.hotGap = waitingGap(storedAt, receivedAt)
}

// waitingGap is the median gap between two consecutive receipts of one
// stream's webhooks (received sorted, ready in the same order: when each
// was stored in EVENTS) where the second was ready before the first was
// received, so had to wait for it: one stream's ordered service time. 0
// when none waited.
func waitingGap(ready, received []time.Time) time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(received); i++ {
		if ready[i].Before(received[i-1]) {
			gaps = append(gaps, received[i].Sub(received[i-1]))
		}
	}
	if len(gaps) == 0 {
		return 0
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2]
}

// liveStored is one event's store time in EVENTS and its intended time.
type liveStored struct{ at, intended time.Time }

// liveStoredTimes reads EVENTS and returns, by ce-id, each generated
// event's store time and intended time; warm-up events are left out.
func liveStoredTimes(ctx context.Context, js jetstream.JetStream) (map[string]liveStored, error) {
	out := map[string]liveStored{}
	err := eachStored(ctx, js, wire.DefaultEventsStream, func(m jetstream.Msg) {
		intended, ok := liveIntended(m.Data())
		if md, err := m.Metadata(); ok && err == nil {
			out[m.Headers().Get(wire.HeaderID)] = liveStored{at: md.Timestamp, intended: intended}
		}
	})
	return out, err
}
