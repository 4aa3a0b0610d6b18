package store_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

var ackClaimVacuumEvery = flag.Int64("ack-claim-vacuum-every", 0, "BenchmarkAckClaim: markers folded between two vacuums of the marker table (0: the store's default)")

// BenchmarkAckClaim measures the drain's steady cycle at a live rate: per
// iteration, k events are appended to k streams picked at random among
// 10,000 caught-up ones (markers: no drainer waits), untimed, and then one
// AckClaim acks the previous cycle's streams and folds, claims and fetches
// the new ones, timed: the cycle's one transaction. pg-µs/cycle is the
// bridge's backend's CPU (/proc/<pid>/schedstat) over the whole run, the
// marker table's vacuums included, which the folds start on the same
// connection (its only one).
func BenchmarkAckClaim(b *testing.B) {
	for _, k := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("streams=%d", k), func(b *testing.B) {
			appPool := jsbridgetest.Pool(b)
			schema := jsbridgetest.Schema(b, appPool)
			app, err := store.New(appPool, store.WithSchema(schema))
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			if err := app.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			const streams = 10_000
			if _, err := appPool.Exec(ctx, `INSERT INTO `+schema+`.events (stream, version, name, data)
SELECT 'cycle-' || g, 0, 'E', '{}' FROM generate_series(1, $1) g`, streams); err != nil {
				b.Fatal(err)
			}
			// Caught up, and no marker left: the setup's own fold would
			// weigh on the statistics of the folds measured.
			for _, q := range []string{
				"INSERT INTO " + schema + ".streams (stream, head, watermark) SELECT stream, 0, 0 FROM " + schema + ".appended",
				"TRUNCATE " + schema + ".appended",
				"VACUUM ANALYZE " + schema + ".streams", "VACUUM ANALYZE " + schema + ".events",
			} {
				if _, err := appPool.Exec(ctx, q); err != nil {
					b.Fatal(err)
				}
			}
			pool, pids := appendCostPool(b, "cycle-bench", 1)
			s, err := store.New(pool, store.WithSchema(schema))
			if err != nil {
				b.Fatal(err)
			}
			if *ackClaimVacuumEvery > 0 {
				store.SetMarkerVacuumEvery(s, *ackClaimVacuumEvery)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var acks []event.Progress
			start := cpuOf(pids)
			for b.Loop() {
				b.StopTimer()
				picked := map[int]bool{}
				for len(picked) < k {
					picked[rng.IntN(streams)+1] = true
				}
				for n := range picked {
					if _, err := app.Append(ctx, fmt.Sprintf("cycle-%d", n), store.AnyVersion, store.NewEvent{Name: "E", Data: []byte(`{}`)}); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				ackErrs, claims, events, _, err := s.AckClaim(ctx, "bench", acks, 1000, time.Minute, 100)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				for _, e := range ackErrs {
					if e != nil {
						b.Fatal(e)
					}
				}
				if len(claims) != k {
					b.Fatalf("claimed %d streams, want %d", len(claims), k)
				}
				last := map[string]event.Event{}
				for _, e := range events {
					last[e.Stream] = e
				}
				acks = acks[:0]
				for _, e := range last {
					acks = append(acks, event.Progress{Stream: e.Stream, Version: e.Version, ID: e.ID})
				}
				b.StartTimer()
			}
			b.ReportMetric(float64((cpuOf(pids)-start).Microseconds())/float64(b.N), "pg-µs/cycle")
			var vacuums int64
			if err := appPool.QueryRow(ctx, `SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'appended'`, schema).Scan(&vacuums); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(vacuums), "vacuums")
		})
	}
}
