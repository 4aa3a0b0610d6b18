package bridgemetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/bridgemetrics"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// BenchmarkObserveEvent is what the metrics cost for one event at
// 1,000 events/s, one event a stream: its publish observed and its
// stream settled as acked.
func BenchmarkObserveEvent(b *testing.B) {
	pool := jsbridgetest.Pool(b)
	st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(b, pool)))
	if err != nil {
		b.Fatal(err)
	}
	m, err := bridgemetrics.New(prometheus.NewRegistry(), st.Backlog, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.Published(forward.Outcome{Status: forward.Stored}, time.Millisecond)
		m.Settled("live-1", drain.SettledAcked, 1, 2*time.Millisecond)
	}
}
