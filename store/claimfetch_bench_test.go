package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// BenchmarkClaimFetch is one claim and fetch as the live path has them
// at 1,000 events/s: 8 pending streams, one event each past the
// watermark (512 B of data and a meta). The 1µs lease expires at once,
// so every op claims the same streams and events again. Its allocations
// per op are the row scanning's (and pgx's).
func BenchmarkClaimFetch(b *testing.B) {
	_, s := benchStore(b)
	ctx := b.Context()
	data := []byte(`{"pad":"` + strings.Repeat("x", 480) + `"}`)
	for i := range 8 {
		if _, err := s.Append(ctx, fmt.Sprintf("live-%d", i), store.NoStream, store.NewEvent{Name: "E", Data: data, Meta: event.Meta{Correlation: "c-1"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		claims, events, err := s.ClaimFetch(ctx, "bench", 100, time.Microsecond, 500)
		if err != nil {
			b.Fatal(err)
		}
		if len(claims) != 8 || len(events) != 8 {
			b.Fatalf("claimed %d streams and %d events, want 8 and 8", len(claims), len(events))
		}
	}
}
