package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// fairRow measures how evenly the bridge serves streams under a sustained
// backlog. The bench keeps about FairPending streams pending (events past
// their watermark) out of FairStreams: every 20 ms it counts the pending
// streams and appends one event to each of that many random streams as are
// missing, in one INSERT, so it appends at the rate the bridge drains and the
// backlog stays. After FairWindow it stops appending, waits for the drain
// to finish and reads back every event appended while the bridge ran:
// append time is the event's `created` (Postgres's clock: the start of the
// appending transaction), stored time the JetStream message timestamp (the
// server's clock when it stored the message; same machine). With claims in
// arbitrary order some streams wait many times longer than the rest; served
// oldest first every event waits about as long as the backlog ahead of it.
//
// With bridges above 1, that many bridge processes compete for the same
// streams (the claim's SKIP LOCKED shares them out); the claim mean is the
// first bridge's.
func (e *env) fairRow(ctx context.Context, bridges int) (row, error) {
	const schema = "bench_fair"
	streams, target, dur := e.cfg.FairStreams, e.cfg.FairPending, e.cfg.FairWindow
	if err := e.quiesce(ctx, schema); err != nil {
		return row{}, err
	}
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return row{}, err
	}
	if err := e.freshEventsStream(ctx); err != nil {
		return row{}, err
	}

	rng := rand.New(rand.NewPCG(1, 2))
	next := make([]int64, streams) // next version per stream: the bench is the only writer
	insert := fmt.Sprintf(`INSERT INTO %s.events (stream, version, name, data)
SELECT s, v, 'BenchEvent', $3::jsonb FROM unnest($1::text[], $2::bigint[]) AS t(s, v)`, schema)
	appendEvents := func(n int) error {
		names, versions := make([]string, n), make([]int64, n)
		for i := range n {
			k := rng.IntN(streams)
			names[i], versions[i] = "fair-"+strconv.Itoa(k), next[k]
			next[k]++
		}
		_, err := e.pool.Exec(ctx, insert, names, versions, string(payload))
		return err
	}
	// The streams pending: those the streams table says (pending AND NOT
	// blocked is the claim index's predicate, streams_claimable_idx) and
	// those with markers not yet folded (migration 009: with no bridge
	// waiting an append writes a marker, no streams row, so the table
	// alone read 0 before the bridge started and the fill below never
	// ended). A read: it folds nothing, which would take the bridge's
	// work and lock its rows.
	countPending := fmt.Sprintf(`SELECT count(*) FROM (
    SELECT stream FROM %[1]s.streams WHERE pending AND NOT blocked
    UNION SELECT stream FROM %[1]s.appended) p`, schema)
	pending := func() (int, error) {
		var n int
		err := e.pool.QueryRow(ctx, countPending).Scan(&n)
		return n, err
	}

	// The backlog before the bridge starts; its events are not measured
	// (their wait includes the bridge's start-up).
	for {
		p, err := pending()
		if err != nil {
			return row{}, err
		}
		if p >= target {
			break
		}
		if err := appendEvents(target - p); err != nil {
			return row{}, fmt.Errorf("append: %w", err)
		}
	}
	var fillMax int64
	if err := e.pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM "+schema+".events").Scan(&fillMax); err != nil {
		return row{}, err
	}
	if _, err := e.pool.Exec(ctx, "ANALYZE "+schema+".events; ANALYZE "+schema+".streams"); err != nil {
		return row{}, err
	}
	fmt.Printf("bench: fair: %d streams pending out of %d; appending at the drain rate for %s\n", target, streams, dur)

	bridge, ops, err := e.startBridgeOps(ctx, schema)
	if err != nil {
		return row{}, err
	}
	defer bridge.Stop(20 * time.Second)
	others := make([]*proc.Process, 0, bridges-1)
	for range bridges - 1 {
		b, err := e.startBridge(ctx, schema)
		if err != nil {
			return row{}, err
		}
		defer b.Stop(20 * time.Second)
		others = append(others, b)
	}
	claims0, err := claimTotals(ctx, ops)
	if err != nil {
		return row{}, err
	}

	var appended, ticks, pendingSum int64
	minPending := target
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for time.Since(start) < dur {
		select {
		case <-ctx.Done():
			return row{}, ctx.Err()
		case <-tick.C:
		}
		p, err := pending()
		if err != nil {
			return row{}, err
		}
		if time.Since(start) > time.Second { // past the bridge's first cycles
			ticks++
			pendingSum += int64(p)
			minPending = min(minPending, p)
		}
		if p < target {
			if err := appendEvents(target - p); err != nil {
				return row{}, fmt.Errorf("append: %w", err)
			}
			appended += int64(target - p)
		}
		if err := e.procs.AnyExited(); err != nil {
			return row{}, err
		}
	}
	rate := float64(appended) / time.Since(start).Seconds()
	claims1, err := claimTotals(ctx, ops)
	if err != nil {
		return row{}, err
	}
	claimMean := time.Duration(float64(time.Second) * (claims1.sum - claims0.sum) / max(claims1.count-claims0.count, 1))
	err = e.waitFor(ctx, 5*time.Minute, "fair: drain the rest", func() (bool, error) {
		head, fwd, err := st.Totals(ctx)
		return fwd >= head, err
	})
	if err != nil {
		return row{}, err
	}
	if err := bridge.Stop(20 * time.Second); err != nil {
		return row{}, err
	}
	for _, b := range others {
		if err := b.Stop(20 * time.Second); err != nil {
			return row{}, err
		}
	}

	samples, err := e.appendToStored(ctx, schema, fillMax)
	if err != nil {
		return row{}, err
	}
	if int64(len(samples)) != appended {
		return row{}, fmt.Errorf("fair: measured %d events, appended %d", len(samples), appended)
	}
	lat := make([]time.Duration, len(samples))
	for i, s := range samples {
		lat[i] = s.lat
	}
	slices.Sort(lat)
	p50, p99, worst := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	over := len(lat) - sortIndexAbove(lat, 3*p50)
	ratio := float64(worst) / float64(max(p50, time.Microsecond))
	meanPending := float64(pendingSum) / float64(max(ticks, 1))
	sec, secRatio := worstSecond(samples)
	fmt.Printf("bench: fair (%d bridges): %d events at %.0f/s, pending streams mean %.0f min %d, claim mean %s: p50 %s p99 %s max %s (max/p50 %.2f); %d events over 3×p50; worst second of appends (%ds in) max/p50 %.2f\n",
		bridges, len(lat), rate, meanPending, minPending, ms(claimMean), secs(p50), secs(p99), secs(worst), ratio, over, sec, secRatio)
	return row{
		Name: fmt.Sprintf("fairness under a backlog, %d bridge(s): ~%d of %d streams pending, appends at the drain rate for %s; append (Postgres created) → stored (JetStream timestamp)",
			bridges, target, streams, dur),
		Ours: fmt.Sprintf("p50 %s, p99 %s, max %s (%d events, %.0f events/s; within the worst second of appends max ÷ p50 = %.2f)",
			secs(p50), secs(p99), secs(worst), len(lat), rate, secRatio),
		Reference: "—",
		Ratio:     fmt.Sprintf("max ÷ p50 = %.2f", ratio),
		Target:    "max ÷ p50 ≤ 2",
		Met:       ratio <= 2,
	}, nil
}

func secs(d time.Duration) string {
	if d < time.Second {
		return ms(d)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// sortIndexAbove returns the index of the first element of sorted lat
// greater than d.
func sortIndexAbove(lat []time.Duration, d time.Duration) int {
	i, _ := slices.BinarySearchFunc(lat, d, func(x, t time.Duration) int {
		if x <= t {
			return -1
		}
		return 1
	})
	return i
}

// sample is one event's append time and its wait until stored.
type sample struct {
	at  time.Time
	lat time.Duration
}

// worstSecond groups samples by the second (since the first) they were
// appended in and returns the second whose max ÷ p50 is highest, with that
// ratio (seconds with fewer than 100 events are left out). Under a backlog
// the drain rate, and with it every wait, moves with the machine's load;
// within one second of appends that cancels out, and what spread is left is
// the claim order's.
func worstSecond(samples []sample) (int, float64) {
	if len(samples) == 0 {
		return 0, 0
	}
	first := samples[0].at
	for _, s := range samples {
		if s.at.Before(first) {
			first = s.at
		}
	}
	bySec := map[int][]time.Duration{}
	for _, s := range samples {
		k := int(s.at.Sub(first) / time.Second)
		bySec[k] = append(bySec[k], s.lat)
	}
	worst, ratio := 0, 0.0
	for k, l := range bySec {
		if len(l) < 100 {
			continue
		}
		slices.Sort(l)
		if r := float64(l[len(l)-1]) / float64(max(l[len(l)/2], time.Microsecond)); r > ratio {
			worst, ratio = k, r
		}
	}
	return worst, ratio
}

// claimTotals reads the bridge's claim duration histogram (sum in seconds,
// count) from its ops port.
func claimTotals(ctx context.Context, ops int) (struct{ sum, count float64 }, error) {
	var t struct{ sum, count float64 }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", ops), nil)
	if err != nil {
		return t, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return t, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return t, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		switch name {
		case "jsbridge_bridge_claim_duration_seconds_sum":
			t.sum, err = strconv.ParseFloat(v, 64)
		case "jsbridge_bridge_claim_duration_seconds_count":
			t.count, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return t, fmt.Errorf("bridge metrics: %s: %w", name, err)
		}
	}
	return t, nil
}

// appendToStored returns, for every event of schema with an id above
// after, its created time and the time from it to the timestamp of its
// message in the JetStream stream (read back with an ordered consumer).
func (e *env) appendToStored(ctx context.Context, schema string, after int64) ([]sample, error) {
	rows, err := e.pool.Query(ctx, "SELECT id, created FROM "+schema+".events WHERE id > $1", after)
	if err != nil {
		return nil, err
	}
	created := map[int64]time.Time{}
	var id int64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { created[id] = at; return nil }); err != nil {
		return nil, fmt.Errorf("read created: %w", err)
	}

	s, err := e.js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	cons, err := e.js.OrderedConsumer(ctx, wire.DefaultEventsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	out := make([]sample, 0, len(created))

	for n := uint64(0); n < info.State.Msgs; n++ {
		msg, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("read back message %d of %d: %w", n+1, info.State.Msgs, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return nil, err
		}
		id, err := strconv.ParseInt(msg.Headers().Get(wire.HeaderMsgID), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("message %d: Nats-Msg-Id: %w", md.Sequence.Stream, err)
		}
		if c, ok := created[id]; ok {
			out = append(out, sample{at: c, lat: md.Timestamp.Sub(c)})
			delete(created, id)
		}
	}
	if len(created) > 0 {
		return nil, fmt.Errorf("fair: %d events missing from the JetStream stream", len(created))
	}
	return out, nil
}
