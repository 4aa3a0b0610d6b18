package deliver_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
)

// counterWith returns the value of counter name's series whose label
// label is value on reg, 0 when there is none yet.
func counterWith(reg *prometheus.Registry, name, label, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Attempt records JetStream refuses for lack of storage (max_file_store
// reached) are dropped and counted under reason "error", with one warning
// a minute at most; deliveries go on meanwhile, and records are written
// again once space is freed.
func TestAttemptRecordsRefusedForStorageAreDroppedAndDeliveryGoesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a JetStream store")
	}
	t.Parallel()
	b := setupSmallStore(t, 1<<20)
	reg := prometheus.NewRegistry()
	clock := clockwork.NewFakeClock()
	logs := &syncLog{}
	l, err := attemptlog.New(b.js, attemptlog.Config{
		Replica: "replica-a", MaxBytes: 64 << 10, Registerer: reg, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, l.Provision(b.ctx))
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	for id := int64(1); id <= 5; id++ {
		b.publish(t, id, "order-1", "OrderPlaced", `{}`)
	}
	filler := fillStore(t, b)

	rc := newReceiver(t, status(http.StatusNoContent))
	// Every attempt recorded: these succeed at once.
	b.run(t, deliver.Config{Attempts: l, AttemptsRecord: attemptlog.ModeAll}, sub("orders", rc.URL))

	// Every event is delivered and acked; none of its records is stored.
	rc.waitFor(t, 5)
	requireSettled(t, b, "orders", 5)
	dropped := func() float64 {
		return counterWith(reg, "jsbridge_consumer_attempt_records_dropped_total", "reason", "error")
	}
	require.Eventually(t, func() bool { return dropped() == 5 }, 15*time.Second, 20*time.Millisecond, "5 records dropped, reason error")
	require.Zero(t, counterWith(reg, "jsbridge_consumer_attempt_records_dropped_total", "reason", "full"))
	const warning = "attempt record not written; `consumer trace` will miss it"
	warnings := func() int { return strings.Count(logs.String(), warning) }
	require.Equal(t, 1, warnings(), "one warning for five refusals:\n%s", logs.String())
	require.Contains(t, logs.String(), "insufficient resources", "the warning gives JetStream's refusal")

	// A minute on the engine's clock, and the next refusal warns again;
	// not before.
	clock.Advance(time.Minute - time.Second)
	l.RecordAttempt(attemptlog.Attempt{Subscription: "orders", EventID: "100", Attempt: 1})
	require.Eventually(t, func() bool { return dropped() == 6 }, 15*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, warnings(), "no second warning within the minute")
	clock.Advance(time.Second)
	l.RecordAttempt(attemptlog.Attempt{Subscription: "orders", EventID: "101", Attempt: 1})
	require.Eventually(t, func() bool { return dropped() == 7 }, 15*time.Second, 20*time.Millisecond)
	require.Equal(t, 2, warnings(), "a warning a minute")

	// Space freed: the next delivery's record is written.
	require.NoError(t, filler.Purge(b.ctx))
	b.publish(t, 6, "order-1", "OrderPlaced", `{}`)
	rc.waitFor(t, 6)
	requireSettled(t, b, "orders", 6)
	require.Eventually(t, func() bool {
		tr, err := inspect.TraceEvent(b.ctx, b.js, "6", inspect.TraceConfig{})
		return err == nil && len(tr.Attempts) == 1
	}, 10*time.Second, 20*time.Millisecond, "the record of event 6 written")
	tr, err := inspect.TraceEvent(b.ctx, b.js, "1", inspect.TraceConfig{})
	require.NoError(t, err)
	require.Empty(t, tr.Attempts, "event 1's record was dropped, not written late")
	require.Equal(t, 7.0, dropped())
}
