package store_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

var (
	appendCostRate = flag.Int("append-cost-rate", 0,
		"BenchmarkAppendCost: appends per second over all writers (0: as fast as they go)")
	appendCostLinger = flag.Duration("append-cost-linger", 0,
		"BenchmarkAppendCost: the drain's Linger in table=drained")
	appendCostStreams = flag.Int("append-cost-streams", 1000,
		"BenchmarkAppendCost: streams appended to (spread evenly over the writers)")
	appendCostSample = flag.Duration("append-cost-sample", 0,
		"BenchmarkAppendCost: in table=drained, print to stderr the marker and streams tables' size, dead rows, autovacuums and the fold's and claim's cost at this interval (0: never)")
)

// appendCostWriters is how many connections append at once.
const appendCostWriters = 16

// BenchmarkAppendCost measures what an append into the bridge's events
// table costs Postgres against the same insert into a table of the same
// layout without the bridge's trigger. 16 writers (one connection each)
// append b.N events of 512 bytes of data, each its own transaction
// (store.Append), to -append-cost-streams streams (default 1,000; each
// writer has its own, so no append waits for another's row), at
// -append-cost-rate appends a second in total (default 0: as fast as they
// go), the drain lingering -append-cost-linger (default 0). A LISTEN
// connection counts the notifications, as a bridge's would.
//
// Sub-benchmarks: table=plain (no trigger), table=bridge (no drain: every
// stream stays pending), table=drained (the bridge's table, a drain acking every batch
// at once keeps the streams caught up, so most appends move a stream from
// caught up to pending). Metrics, from the server rather than the clock
// (the machine is shared, wall-clock throughput is noisy):
//
//   - pg-µs/append: CPU of the writers' backends (/proc/<pid>/schedstat)
//     per append;
//   - server-µs/append: CPU of every process of the server (writers, the
//     listener, the drain's backends, background workers) per append;
//   - notify/append: notifications the listener received per append;
//   - hot-%: HOT updates of the streams table in percent of its updates
//     (pg_stat_user_tables);
//   - upd/append: updates of the streams table (the appends', the
//     drain's) per append;
//   - bridge-commits/append: the drain's commits (pg_stat_database
//     xact_commit, less the appends' own) per append;
//   - lag-p50-ms, lag-p99-ms: in table=drained, how old the events were
//     when the drain's handler got them (the streams' first events, made
//     before the drain starts, left out).
//
// With -append-cost-sample (table=drained) it prints to stderr, at that
// interval, the heap of the marker table (appended) and of streams
// (pg_relation_size), their live and dead rows and autovacuums
// (pg_stat_user_tables), the fold's calls, mean execution time, buffers
// read per call and time in all in the interval (pg_stat_statements, when
// the server preloads it) and the drain's claims and their mean time
// (fold included, as the drain's Observer sees them): a soak of the queue
// table under steady appends, e.g. 10 minutes at 1,000/s over 10,000
// streams:
//
//	go test ./store/ -run '^$' -bench 'AppendCost/table=drained$' -benchtime 600000x \
//	    -append-cost-rate 1000 -append-cost-streams 10000 -append-cost-sample 30s -timeout 30m
//
// Run it alone (it reads the CPU of the whole server), against a server
// on this machine:
//
//	go test ./store/ -run '^$' -bench AppendCost -benchtime 20000x -append-cost-rate 1000
func BenchmarkAppendCost(b *testing.B) {
	for _, mode := range []string{"plain", "bridge", "drained"} {
		b.Run("table="+mode, func(b *testing.B) { benchAppendCost(b, mode) })
	}
}

func benchAppendCost(b *testing.B, mode string) {
	ctx := b.Context()
	admin := jsbridgetest.Pool(b)
	schema := jsbridgetest.Schema(b, admin)
	s, err := store.New(admin, store.WithSchema(schema))
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	table := schema + ".events"
	if mode == "plain" {
		// The same layout, indexes and identity, no trigger.
		table = schema + ".plain_events"
		if _, err := admin.Exec(ctx, "CREATE TABLE "+table+" (LIKE "+schema+".events INCLUDING ALL)"); err != nil {
			b.Fatal(err)
		}
	}
	writers, writerPIDs := appendCostPool(b, "appendcost-writer", appendCostWriters)
	ws := s
	if mode == "plain" {
		if ws, err = store.New(writers, store.WithSchema(schema), store.WithEventsTable(table)); err != nil {
			b.Fatal(err)
		}
	} else if ws, err = store.New(writers, store.WithSchema(schema)); err != nil {
		b.Fatal(err)
	}

	streams := max(*appendCostStreams, appendCostWriters)
	data := []byte(`{"pad":"` + strings.Repeat("x", 502) + `"}`)
	appendTo := func(stream string) error {
		_, err := ws.Append(ctx, stream, store.AnyVersion, store.NewEvent{Name: "Happened", Data: data})
		return err
	}
	// Every stream has its first event (and its streams row) before the
	// measurement: the steady state is appends to known streams.
	for i := range streams {
		if err := appendTo(fmt.Sprintf("s-%d-%d", i%appendCostWriters, i/appendCostWriters)); err != nil {
			b.Fatal(err)
		}
	}

	var notes atomic.Int64
	listenCtx, stopListen := context.WithCancel(ctx)
	listening := appendCostListen(b, listenCtx, schema, &notes)

	caughtUp, stopDrain := func() {}, func() {}
	if mode == "drained" {
		caughtUp, stopDrain = appendCostDrain(b, schema)
	}

	if _, err := admin.Exec(ctx, "ANALYZE "+table); err != nil {
		b.Fatal(err)
	}
	pm := appendCostPostmaster(b, writerPIDs[0])
	flushStats(b, writers, appendCostWriters)
	before := appendCostCounters(b, admin, schema)
	writersCPU0, serverCPU0 := cpuOf(writerPIDs), cpuOf(childrenOf(pm))
	notes.Store(0)

	b.ResetTimer()
	var wg sync.WaitGroup
	var next atomic.Int64
	var failed atomic.Value
	start := time.Now()
	for w := range appendCostWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 33))
			own := streams / appendCostWriters
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				if *appendCostRate > 0 {
					due := start.Add(time.Duration(n) * time.Second / time.Duration(*appendCostRate))
					time.Sleep(time.Until(due))
				}
				if err := appendTo(fmt.Sprintf("s-%d-%d", w, rng.IntN(own))); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	caughtUp() // the drain's work counts too
	writersCPU := cpuOf(writerPIDs) - writersCPU0
	serverCPU := cpuOf(childrenOf(pm)) - serverCPU0
	stopDrain()
	stopListen()
	<-listening
	// The backends flush their statistics when they exit.
	writers.Close()
	after := appendCostCounters(b, admin, schema, "appendcost-")

	n := float64(b.N)
	b.ReportMetric(float64(writersCPU.Microseconds())/n, "pg-µs/append")
	b.ReportMetric(float64(serverCPU.Microseconds())/n, "server-µs/append")
	b.ReportMetric(float64(notes.Load())/n, "notify/append")
	if upd := after.upd - before.upd; upd > 0 {
		b.ReportMetric(100*float64(after.hot-before.hot)/float64(upd), "hot-%")
		b.ReportMetric(float64(upd)/n, "upd/append")
	}
	if mode == "drained" {
		// The database's commits less the appends' own (one each) and
		// the harness listener's: a listening backend reads each batch
		// of notifications in a transaction of its own, about one per
		// notification at these rates (the drain's listener does the
		// same, and counts).
		b.ReportMetric((float64(after.commits-before.commits)-n-float64(notes.Load()))/n, "bridge-commits/append")
	}
	b.ReportMetric(n/time.Since(start).Seconds(), "appends/s")
}

// appendCostPool opens n connections named app and returns them with
// their backends' process ids.
func appendCostPool(b *testing.B, app string, n int) (*pgxpool.Pool, []int) {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(jsbridgetest.DatabaseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = int32(n), int32(n)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var conns []*pgxpool.Conn
	var pids []int
	for range n {
		c, err := pool.Acquire(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		pids = append(pids, int(c.Conn().PgConn().PID()))
	}
	for _, c := range conns {
		c.Release()
	}
	return pool, pids
}

// appendCostListen counts the notifications on schema's channel until ctx
// is done; the returned channel is closed then.
func appendCostListen(b *testing.B, ctx context.Context, schema string, notes *atomic.Int64) <-chan struct{} {
	b.Helper()
	conn, err := pgx.Connect(ctx, jsbridgetest.DatabaseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+schema); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			notes.Add(1)
		}
	}()
	return done
}

// appendCostDrain runs a drain on its own connections whose handler acks
// every batch at once. caughtUp waits until every stream is caught up;
// stop stops the drain and closes its connections.
func appendCostDrain(b *testing.B, schema string) (caughtUp, stop func()) {
	b.Helper()
	pool, _ := appendCostPool(b, "appendcost-drain", 4)
	s, err := store.New(pool, store.WithSchema(schema))
	if err != nil {
		b.Fatal(err)
	}
	// The age of each event when the handler gets it (from its created
	// time, the start of its append's transaction; one machine, one
	// clock), but the streams' first events, appended before the drain
	// started.
	var lagMu sync.Mutex
	var lags []time.Duration
	h := drain.HandlerFunc(func(_ context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		now := time.Now()
		lagMu.Lock()
		for i, bt := range batches {
			for _, e := range bt.Events {
				if e.Version > 0 {
					lags = append(lags, now.Sub(e.Created))
				}
			}
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		lagMu.Unlock()
		return out
	})
	obs := &claimCounter{}
	stopSampling := func() {}
	if *appendCostSample > 0 {
		stopSampling = appendCostSampler(b, schema, obs, *appendCostSample)
	}
	d, err := drain.New(s, h, drain.Config{Notifier: s, Linger: *appendCostLinger, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = d.Run(ctx) }()
	caughtUp = func() {
		for deadline := time.Now().Add(time.Minute); ; {
			var pending int
			if err := pool.QueryRow(context.Background(),
				"SELECT count(*) FROM "+schema+".streams WHERE head > watermark").Scan(&pending); err != nil {
				b.Fatal(err)
			}
			if pending == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d streams still pending a minute after the appends", pending)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	stop = func() {
		stopSampling()
		b.Logf("claims %d (%d empty)", obs.claims.Load(), obs.empty.Load())
		cancel()
		<-ran
		lagMu.Lock()
		slices.Sort(lags)
		if n := len(lags); n > 0 {
			b.ReportMetric(float64(lags[n/2].Microseconds())/1e3, "lag-p50-ms")
			b.ReportMetric(float64(lags[n*99/100].Microseconds())/1e3, "lag-p99-ms")
		}
		lagMu.Unlock()
		pool.Close()
	}
	return caughtUp, stop
}

// flushStats makes the n connections of pool report their statistics
// now rather than within the next 10 s.
func flushStats(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		// Flushed when the backend goes idle after this transaction.
		if _, err := c.Exec(b.Context(), "SELECT pg_stat_force_next_flush()"); err != nil {
			b.Fatal(err)
		}
	}
}

type appendCostStats struct{ commits, upd, hot int64 }

// appendCostCounters reads the database's commits and the streams table's
// updates, after waiting for the backends named with prefix (if any) to
// have exited and so flushed their statistics.
func appendCostCounters(b *testing.B, pool *pgxpool.Pool, schema string, gone ...string) appendCostStats {
	b.Helper()
	ctx := b.Context()
	for _, app := range gone {
		for deadline := time.Now().Add(10 * time.Second); ; {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 || '%'", app).Scan(&n); err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d backends %s* still there", n, app)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	flushStats(b, pool, 1)
	var st appendCostStats
	// A transaction of its own: statistics are read once per transaction.
	err := pool.QueryRow(ctx, `SELECT
    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
    coalesce((SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'streams'), 0),
    coalesce((SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'streams'), 0)`,
		schema).Scan(&st.commits, &st.upd, &st.hot)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// appendCostPostmaster returns the parent process of the backend pid.
func appendCostPostmaster(b *testing.B, pid int) int {
	b.Helper()
	ppid, ok := procPPID(pid)
	if !ok {
		b.Fatalf("cannot read /proc/%d/stat: the benchmark needs a Postgres server on this machine", pid)
	}
	return ppid
}

// procPPID is the parent of pid, from /proc/<pid>/stat.
func procPPID(pid int) (int, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command is in parentheses and may hold spaces: fields follow
	// the last ')'. Field 4 (the parent) is the second after it.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// childrenOf returns pid and the processes whose parent it is.
func childrenOf(pid int) []int {
	out := []int{pid}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := procPPID(p); ok && pp == pid {
			out = append(out, p)
		}
	}
	return out
}

// cpuOf sums the time the processes spent on a CPU (the first field of
// /proc/<pid>/schedstat, in nanoseconds); a process gone counts 0.
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		raw, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw))
		if len(f) == 0 {
			continue
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		sum += time.Duration(ns)
	}
	return sum
}

// claimCounter counts the drain's claims and sums their time.
type claimCounter struct{ claims, empty, nanos atomic.Int64 }

func (c *claimCounter) Claimed(streams int, took time.Duration, _ error) {
	c.claims.Add(1)
	c.nanos.Add(int64(took))
	if streams == 0 {
		c.empty.Add(1)
	}
}

func (c *claimCounter) Settled(string, string, int, time.Duration) {}

// appendCostSampler prints to stderr, every interval until stop is
// called, what -append-cost-sample describes, on a connection of its own.
// Stderr rather than b.Logf: a benchmark's log is printed at its end and
// cut after a few lines.
func appendCostSampler(b *testing.B, schema string, obs *claimCounter, every time.Duration) (stop func()) {
	b.Helper()
	conn, err := pgx.Connect(b.Context(), jsbridgetest.DatabaseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	type folds struct {
		calls, blocks int64
		ms            float64
	}
	foldsNow := func() (folds, bool) {
		var f folds
		err := conn.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint,
    coalesce(sum(total_exec_time), 0)
FROM pg_stat_statements WHERE query LIKE '%FROM ' || $1 || '.appended a%LIMIT%'`, schema).Scan(&f.calls, &f.blocks, &f.ms)
		return f, err == nil
	}
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		start := time.Now()
		f0, statements := foldsNow()
		c0, n0 := obs.claims.Load(), obs.nanos.Load()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var line strings.Builder
			for _, rel := range []string{"appended", "streams"} {
				var size, live, dead, autovacuums int64
				var last *time.Time
				err := conn.QueryRow(ctx, `SELECT pg_relation_size(c.oid), s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.last_autovacuum
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE s.schemaname = $1 AND s.relname = $2`,
					schema, rel).Scan(&size, &live, &dead, &autovacuums, &last)
				if err != nil {
					if ctx.Err() == nil {
						fmt.Fprintf(os.Stderr, "sample %s: %v\n", rel, err)
					}
					return
				}
				ago := "never"
				if last != nil {
					ago = time.Since(*last).Round(time.Second).String() + " ago"
				}
				fmt.Fprintf(&line, " %s %d kB live %d dead %d autovacuums %d (last %s);", rel, size/1024, live, dead, autovacuums, ago)
			}
			if f, ok := foldsNow(); ok && statements {
				if calls := f.calls - f0.calls; calls > 0 {
					fmt.Fprintf(&line, " folds %d mean %.3f ms %.0f blocks, in all %.2f s;",
						calls, (f.ms-f0.ms)/float64(calls), float64(f.blocks-f0.blocks)/float64(calls), (f.ms-f0.ms)/1e3)
				}
				f0 = f
			}
			c, n := obs.claims.Load(), obs.nanos.Load()
			if c > c0 {
				fmt.Fprintf(&line, " claims %d mean %.3f ms", c-c0, float64(n-n0)/float64(c-c0)/1e6)
			}
			c0, n0 = c, n
			var load string
			if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
				load = strings.Fields(string(raw))[0]
			}
			fmt.Fprintf(os.Stderr, "t=%s load %s:%s\n", time.Since(start).Round(time.Second), load, line.String())
		}
	}()
	return func() { cancel(); <-done }
}
