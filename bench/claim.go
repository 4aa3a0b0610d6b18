package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jsbridge/jsbridge/store"
)

// claimRow measures the p99 latency of one Claim (100 streams limit) with
// pendingStreams streams to claim among few, then among many idle streams.
func (e *env) claimRow(ctx context.Context) (row, error) {
	const pendingStreams = 50
	small, err := e.claimSetup(ctx, "bench_claim_small", 100-pendingStreams, pendingStreams)
	if err != nil {
		return row{}, err
	}
	large, err := e.claimSetup(ctx, "bench_claim_large", e.cfg.IdleStreams, pendingStreams)
	if err != nil {
		return row{}, err
	}
	// Alternate the two cases, so the machine's noise (autovacuum after the
	// drain row, other processes) falls on both alike.
	var latSmall, latLarge []time.Duration
	for i := 0; i < e.cfg.Claims+50; i++ {
		for _, c := range []struct {
			st  *store.Store
			lat *[]time.Duration
		}{{small, &latSmall}, {large, &latLarge}} {
			took, err := claimOnce(ctx, c.st, pendingStreams)
			if err != nil {
				return row{}, err
			}
			if i >= 50 { // warm-up
				*c.lat = append(*c.lat, took)
			}
		}
	}
	p50s, p99s := percentiles(latSmall)
	p50l, p99l := percentiles(latLarge)
	fmt.Printf("bench: claim: 100 streams p50 %s p99 %s; %d idle streams p50 %s p99 %s\n", ms(p50s), ms(p99s), e.cfg.IdleStreams, ms(p50l), ms(p99l))
	ratio := float64(p99l) / float64(p99s)
	return row{
		Name:      fmt.Sprintf("claim latency p99 (%d pending streams)", pendingStreams),
		Ours:      fmt.Sprintf("%s with %d idle streams (p50 %s)", ms(p99l), e.cfg.IdleStreams, ms(p50l)),
		Reference: fmt.Sprintf("%s with 100 streams (p50 %s)", ms(p99s), ms(p50s)),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≤ 1.5×",
		Met:       ratio <= 1.5,
	}, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// claimSetup makes a schema with idle streams (everything forwarded:
// watermark = head) and pending ones (one event past the watermark).
func (e *env) claimSetup(ctx context.Context, schema string, idle, pending int) (*store.Store, error) {
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return nil, err
	}
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.streams (stream, watermark, head)
SELECT 'idle-' || g, 9, 9 FROM generate_series(1, %[2]d) g;
INSERT INTO %[1]s.streams (stream, watermark, head)
SELECT 'pending-' || g, 8, 9 FROM generate_series(1, %[3]d) g;
ANALYZE %[1]s.streams`, schema, idle, pending))
	return st, err
}

// claimOnce times one Claim of up to 100 streams and releases what it got.
func claimOnce(ctx context.Context, st *store.Store, pending int) (time.Duration, error) {
	start := time.Now()
	claims, err := st.Claim(ctx, "bench", 100, 30*time.Second)
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if len(claims) != pending {
		return 0, fmt.Errorf("%s: claimed %d streams, want %d", st.Schema(), len(claims), pending)
	}
	names := make([]string, len(claims))
	for j, c := range claims {
		names[j] = c.Stream
	}
	return took, st.Release(ctx, "bench", names)
}
