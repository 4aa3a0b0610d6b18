package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// The end-to-end row's per-stage breakdown: each delivered event's append
// (ce-time, Postgres's clock), its store time in the events stream
// (JetStream's timestamp, the same machine's clock) and its receipt give
// two stages per event; the bridge's own histograms split the first.

// stageTimes are one event's times along the path; a zero time was not
// seen.
type stageTimes struct {
	created, stored, received time.Time
}

// storeTimes reads every message of JetStream stream name (through js) with an ordered
// consumer and returns each event id's (Nats-Msg-Id) store time; a later
// copy of an id replaces an earlier one.
func storeTimes(ctx context.Context, js jetstream.JetStream, name string) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	err := eachStored(ctx, js, name, func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil {
			out[m.Headers().Get(wire.HeaderMsgID)] = md.Timestamp
		}
	})
	return out, err
}

// eachStored reads stream name from its first message to the last it
// held when called (an ordered consumer, batches of 1,000) and calls f
// with each; it stops early when a fetch returns nothing for 5 s.
func eachStored(ctx context.Context, js jetstream.JetStream, name string, f func(jetstream.Msg)) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			f(m)
		}
		if err := batch.Error(); err != nil {
			return err
		}
		if got == 0 {
			break
		}
		read += uint64(got)
	}
	return nil
}

// stageBreakdown prints the p50 and p99 of each stage over the events
// delivered (times by event id): append → stored in the events stream
// (the bridge: wake-up, claim, fetch, publish), → received (the
// consumer: read, sign, POST); and the bridge's mean claim, publish and
// ack durations from its metrics at bridgeOps. It returns the line it
// printed.
func (e *env) stageBreakdown(ctx context.Context, js jetstream.JetStream, times map[string]*stageTimes, bridgeOps int) string {
	stored, err := storeTimes(ctx, js, wire.DefaultEventsStream)
	if err != nil {
		return fmt.Sprintf("stages: events stream: %v", err)
	}
	var bridge, deliver []time.Duration
	for id, t := range times {
		t.stored = stored[id]
		if t.stored.IsZero() {
			continue
		}
		bridge = append(bridge, t.stored.Sub(t.created))
		deliver = append(deliver, t.received.Sub(t.stored))
	}
	if e.cfg.E2ETimes != "" {
		if err := writeStageTimes(e.cfg.E2ETimes, times); err != nil {
			fmt.Printf("bench: e2e: -e2e-times: %v\n", err)
		}
	}
	q := func(d []time.Duration) string {
		if len(d) == 0 {
			return "—"
		}
		slices.Sort(d)
		return fmt.Sprintf("p50 %s p99 %s", ms(d[len(d)/2]), ms(d[len(d)*99/100]))
	}
	line := fmt.Sprintf("append → in %s %s [bridge means: claim %s, publish %s, ack %s]; → received %s",
		wire.DefaultEventsStream, q(bridge), bridgeMean(bridgeOps, "claim"), bridgeMean(bridgeOps, "publish"), bridgeMean(bridgeOps, "ack"), q(deliver))
	fmt.Printf("bench: e2e: stages: %s\n", line)
	return line
}

// bridgeMean is the mean of the bridge's histogram
// jsbridge_bridge_<what>_duration_seconds, read from its ops port ("?"
// when unavailable).
func bridgeMean(ops int, what string) string {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", ops))
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	sum, count, err := histogramSumCount(resp.Body, "jsbridge_bridge_"+what+"_duration_seconds")
	if err != nil || count == 0 {
		return "?"
	}
	return ms(time.Duration(sum / count * float64(time.Second)))
}

// histogramSumCount adds up name's _sum and _count series in a Prometheus
// text exposition.
func histogramSumCount(r io.Reader, name string) (sum, count float64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var dst *float64
		switch {
		case strings.HasPrefix(line, name+"_sum"):
			dst = &sum
		case strings.HasPrefix(line, name+"_count"):
			dst = &count
		default:
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		*dst += v
	}
	return sum, count, sc.Err()
}

// commits is the database's count of committed transactions
// (pg_stat_database.xact_commit): the round trips that commit, whatever
// the machine's speed. The server publishes a backend's counts up to a
// second late, so a difference over a run of seconds is close, not exact.
func (e *env) commits(ctx context.Context) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// statements is the number of statements the database has run
// (pg_stat_statements: only where the server preloads it and the
// extension was created in the database, which the bench leaves to the
// operator; an error otherwise, and the row leaves the count out).
func (e *env) statements(ctx context.Context) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
	return n, err
}

// writeStageTimes writes each event's stage times to path as CSV: id,
// then append, stored and received in Unix microseconds (0: not seen),
// ordered by append time.
func writeStageTimes(path string, times map[string]*stageTimes) error {
	ids := slices.Collect(maps.Keys(times))
	slices.SortFunc(ids, func(a, b string) int { return times[a].created.Compare(times[b].created) })
	var b strings.Builder
	b.WriteString("id,created_us,stored_us,received_us\n")
	us := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixMicro()
	}
	for _, id := range ids {
		t := times[id]
		fmt.Fprintf(&b, "%s,%d,%d,%d\n", id, us(t.created), us(t.stored), us(t.received))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
