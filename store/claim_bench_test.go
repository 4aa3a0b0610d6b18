package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// BenchmarkClaim measures one claim of up to 100 streams among 50 pending
// ones, next to 100 or 100,000 idle streams (every event forwarded). The
// pending index holds only streams with work, so the two should cost about
// the same. The 1µs lease expires at once, so every iteration claims the
// same pending streams again without a release.
func BenchmarkClaim(b *testing.B) {
	for _, idle := range []int{100, 100_000} {
		b.Run(fmt.Sprintf("idle=%d", idle), func(b *testing.B) {
			pool, s := benchStore(b)
			ctx := b.Context()
			const pending = 50
			if _, err := pool.Exec(ctx, `INSERT INTO `+s.Schema()+`.streams (stream, head, watermark)
SELECT 'idle-' || g, 9, 9 FROM generate_series(1, $1) g
UNION ALL SELECT 'pending-' || g, 9, 3 FROM generate_series(1, $2) g`, idle, pending); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "ANALYZE "+s.Schema()+".streams"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				claims, err := s.Claim(ctx, "bench", 100, time.Microsecond)
				if err != nil {
					b.Fatal(err)
				}
				if len(claims) != pending {
					b.Fatalf("claimed %d streams, want %d", len(claims), pending)
				}
			}
		})
	}
}

// BenchmarkAck measures one ack (the fenced watermark update) of a claimed
// stream; the claim before each ack is not timed.
func BenchmarkAck(b *testing.B) {
	pool, s := benchStore(b)
	ctx := b.Context()
	evs, err := s.Append(ctx, "ack-1", store.NoStream, store.NewEvent{Name: "E", Data: []byte(`{}`)})
	if err != nil {
		b.Fatal(err)
	}
	e := evs[0]
	for b.Loop() {
		b.StopTimer()
		// Move the watermark back so the stream is pending again.
		if _, err := pool.Exec(ctx, "UPDATE "+s.Schema()+".streams SET watermark = -1"); err != nil {
			b.Fatal(err)
		}
		if claims, err := s.Claim(ctx, "bench", 1, time.Minute); err != nil || len(claims) != 1 {
			b.Fatalf("claim: %v (%d claims)", err, len(claims))
		}
		b.StartTimer()
		if err := s.Ack(ctx, "bench", e.Stream, e.Version, e.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFetch measures one fetch of 5,000 events: 50 events of each of
// 100 claimed streams, data of 256 bytes, every other event with a
// correlation and causation id in its meta (the rest "{}"). It is the
// store's share of a drain cycle: the query, the scan and the meta decoding.
func BenchmarkFetch(b *testing.B) {
	pool, s := benchStore(b)
	ctx := b.Context()
	const streams, perStream = 100, 50
	if _, err := pool.Exec(ctx, `INSERT INTO `+s.Schema()+`.events (stream, version, name, data, meta)
SELECT 'fetch-' || (g % $1::int), g / $1::int, 'Happened', jsonb_build_object('pad', repeat('x', 243)),
    CASE WHEN g % 2 = 0 THEN '{"correlation": "c-1234", "causation": "e-5678"}'::jsonb ELSE '{}' END
FROM generate_series(0, $1::int * $2::int - 1) g ORDER BY g`, streams, perStream); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+s.Schema()+".events"); err != nil {
		b.Fatal(err)
	}
	claims, err := s.Claim(ctx, "bench", streams, time.Hour)
	if err != nil || len(claims) != streams {
		b.Fatalf("claim: %v (%d claims)", err, len(claims))
	}
	b.ReportAllocs()
	for b.Loop() {
		evs, err := s.Fetch(ctx, claims, perStream)
		if err != nil {
			b.Fatal(err)
		}
		if len(evs) != streams*perStream {
			b.Fatalf("fetched %d events, want %d", len(evs), streams*perStream)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*streams*perStream), "ns/event")
}

// benchStore returns a pool and a store migrated in a fresh schema.
func benchStore(b *testing.B) (*pgxpool.Pool, *store.Store) {
	b.Helper()
	pool := jsbridgetest.Pool(b)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(b, pool)))
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	return pool, s
}
