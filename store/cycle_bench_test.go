package store_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// BenchmarkAckClaim measures the drain's steady cycle at a live rate: per
// iteration, k events are appended to k streams picked at random among
// 10,000 caught-up ones (markers: no drainer waits), untimed, and then one
// AckClaim acks the previous cycle's streams and folds, claims and fetches
// the new ones, timed: the cycle's one transaction. pg-µs/cycle is the
// bridge's backend's CPU (/proc/<pid>/schedstat), the marker table's
// vacuum included, which the folds start on the same connection.
func BenchmarkAckClaim(b *testing.B) {
	for _, k := range []int{8, 64} {
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
			if err := store.Fold(ctx, app); err != nil {
				b.Fatal(err)
			}
			for _, q := range []string{"UPDATE " + schema + ".streams SET watermark = head", "VACUUM ANALYZE " + schema + ".streams", "VACUUM ANALYZE " + schema + ".events", "VACUUM ANALYZE " + schema + ".appended"} {
				if _, err := appPool.Exec(ctx, q); err != nil {
					b.Fatal(err)
				}
			}
			pool, pids := appendCostPool(b, "cycle-bench", 1)
			s, err := store.New(pool, store.WithSchema(schema))
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var (
				acks []event.Progress
				cpu  time.Duration
			)
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
				before := cpuOf(pids)
				b.StartTimer()
				ackErrs, claims, events, _, err := s.AckClaim(ctx, "bench", acks, 1000, time.Minute, 100)
				b.StopTimer()
				cpu += cpuOf(pids) - before
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
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "pg-µs/cycle")
		})
	}
}
