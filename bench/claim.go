package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// claimRow measures the p99 latency of one Claim (100 streams limit) with
// pendingStreams streams to claim among few, then among many idle streams.
func (e *env) claimRow(ctx context.Context) (row, error) {
	const pendingStreams = 50
	small, err := e.claimP99(ctx, "bench_claim_small", 100-pendingStreams, pendingStreams)
	if err != nil {
		return row{}, err
	}
	large, err := e.claimP99(ctx, "bench_claim_large", e.cfg.IdleStreams, pendingStreams)
	if err != nil {
		return row{}, err
	}
	ratio := float64(large) / float64(small)
	return row{
		Name:      fmt.Sprintf("claim latency p99 (%d pending streams)", pendingStreams),
		Ours:      fmt.Sprintf("%s with %d idle streams", ms(large), e.cfg.IdleStreams),
		Reference: fmt.Sprintf("%s with 100 streams", ms(small)),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≤ 2×",
		Met:       ratio <= 2,
	}, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func (e *env) claimP99(ctx context.Context, schema string, idle, pending int) (time.Duration, error) {
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return 0, err
	}
	// Idle streams: everything forwarded (watermark = head). Pending: one
	// event past the watermark.
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.streams (stream, watermark, head)
SELECT 'idle-' || g, 9, 9 FROM generate_series(1, %[2]d) g;
INSERT INTO %[1]s.streams (stream, watermark, head)
SELECT 'pending-' || g, 8, 9 FROM generate_series(1, %[3]d) g;
ANALYZE %[1]s.streams`, schema, idle, pending))
	if err != nil {
		return 0, err
	}
	lat := make([]time.Duration, 0, e.cfg.Claims)
	for i := 0; i < e.cfg.Claims+50; i++ {
		start := time.Now()
		claims, err := st.Claim(ctx, "bench", 100, 30*time.Second)
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		if len(claims) != pending {
			return 0, fmt.Errorf("%s: claimed %d streams, want %d", schema, len(claims), pending)
		}
		names := make([]string, len(claims))
		for j, c := range claims {
			names[j] = c.Stream
		}
		if err := st.Release(ctx, "bench", names); err != nil {
			return 0, err
		}
		if i >= 50 { // warm-up
			lat = append(lat, took)
		}
	}
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100]
	fmt.Printf("bench: claim: %s (%d idle, %d pending): p50 %s p99 %s\n", schema, idle, pending, ms(lat[len(lat)/2]), ms(p99))
	return p99, nil
}
