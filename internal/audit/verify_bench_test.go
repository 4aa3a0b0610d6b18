package audit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/audit"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// BenchmarkVerify100k verifies 100,000 forwarded events (1,000 streams of
// 100) against the embedded JetStream: every stream in one pass over the
// prefix. It reports events checked per second.
//
//	go test -run '^$' -bench Verify100k -benchtime 3x ./audit/
func BenchmarkVerify100k(b *testing.B) {
	ctx := context.Background()
	bd := setupB(b)
	_, err := jsbridgetest.Pool(b).Exec(ctx, fmt.Sprintf(`INSERT INTO %s (stream, version, name, data, meta)
SELECT 'bench-' || (g / 100), g %% 100, 'Happened', jsonb_build_object('n', g, 'pad', repeat('x', 100)), '{"correlation_id": "c"}'
FROM generate_series(0, 99999) g ORDER BY g`, bd.st.EventsTable()))
	require.NoError(b, err)
	fwd, err := forward.New(bd.js, forward.Config{Stream: "EVENTS"})
	require.NoError(b, err)
	d, err := drain.New(bd.st, fwd, drain.Config{Owner: "bench", Lease: time.Minute, ClaimLimit: 1000, FetchLimit: 100})
	require.NoError(b, err)
	for {
		appended, forwarded, err := bd.st.Totals(ctx)
		require.NoError(b, err)
		if appended == forwarded {
			break
		}
		_, err = d.Cycle(ctx)
		require.NoError(b, err)
	}
	streams := bd.streamsB(b)
	b.ResetTimer()
	var events int64
	var took, jsRead time.Duration
	for b.Loop() {
		rep, err := audit.Verify(ctx, bd.js, bd.st, streams, true, audit.Config{})
		require.NoError(b, err)
		require.Empty(b, rep.Problems)
		require.EqualValues(b, 100_000, rep.Events)
		events += rep.Events
		took += rep.Elapsed
		jsRead += rep.ReadJetStream
	}
	b.ReportMetric(float64(events)/took.Seconds(), "events/s")
	b.ReportMetric(jsRead.Seconds()/took.Seconds()*100, "%jetstream")
}
