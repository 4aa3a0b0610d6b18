package deliver_test

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/wire"
)

// gaugeOf returns the value of gauge name's series whose label label is
// value on reg, and false when there is none yet.
func gaugeOf(reg *prometheus.Registry, name, label, value string) (float64, bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// copyConfig is a partitioned copy of EVENTS as an earlier version made
// it: no AllowDirect, no compression, the given MaxAge.
func copyConfig(partitions int, maxAge time.Duration) jetstream.StreamConfig {
	src, dest := wire.OrderedTransform(wire.DefaultEventsPrefix, partitions)
	return jetstream.StreamConfig{
		Name: wire.OrderedStream("EVENTS"), Storage: jetstream.FileStorage, MaxAge: maxAge,
		Sources: []*jetstream.StreamSource{{Name: "EVENTS", SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: src, Destination: dest}}}},
	}
}

// A new copy allows direct gets, is compressed (S2) and gets twice the
// events stream's retention; an existing one without AllowDirect is
// updated (logged), its retention and compression left as they are and
// reported.
func TestOrderedCopyAllowsDirectAndReportsItsRetention(t *testing.T) {
	t.Parallel()
	t.Run("new", func(t *testing.T) {
		t.Parallel()
		b := setupOrdered(t)
		_, err := b.js.UpdateStream(b.ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage,
			MaxAge: time.Hour, MaxBytes: 1 << 20})
		require.NoError(t, err)
		c, err := deliver.New(b.js, deliver.Config{Partitions: 4}, orderedSub("direct", "http://127.0.0.1:1"))
		require.NoError(t, err)
		require.NoError(t, c.Provision(b.ctx))
		s, err := b.js.Stream(b.ctx, wire.OrderedStream("EVENTS"))
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		require.True(t, cfg.AllowDirect, "AllowDirect")
		require.Equal(t, jetstream.S2Compression, cfg.Compression, "S2")
		require.Equal(t, jetstream.LimitsPolicy, cfg.Retention, "limits")
		require.Equal(t, 2*time.Hour, cfg.MaxAge, "twice the events stream's MaxAge")
		require.Equal(t, int64(2<<20), cfg.MaxBytes, "twice the events stream's MaxBytes")
	})
	t.Run("existing", func(t *testing.T) {
		t.Parallel()
		b := setupOrdered(t)
		_, err := b.js.UpdateStream(b.ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage, MaxAge: time.Hour})
		require.NoError(t, err)
		_, err = b.js.CreateStream(b.ctx, copyConfig(4, time.Hour))
		require.NoError(t, err)
		logs := &syncLog{}
		c, err := deliver.New(b.js, deliver.Config{Partitions: 4, Logger: slog.New(slog.NewTextHandler(logs, nil))}, orderedSub("direct", "http://127.0.0.1:1"))
		require.NoError(t, err)
		require.NoError(t, c.Provision(b.ctx))
		s, err := b.js.Stream(b.ctx, wire.OrderedStream("EVENTS"))
		require.NoError(t, err)
		require.True(t, s.CachedInfo().Config.AllowDirect, "AllowDirect turned on")
		require.Equal(t, jetstream.NoCompression, s.CachedInfo().Config.Compression, "compression left as it is")
		require.Contains(t, logs.String(), "the partitioned copy is not compressed; a new one is")
		require.Contains(t, logs.String(), "nats stream edit EVENTS_ORDERED --compression s2")
		require.Equal(t, time.Hour, s.CachedInfo().Config.MaxAge, "retention left as it is")
		require.Contains(t, logs.String(), "the partitioned copy had no AllowDirect; turned it on")
		require.Contains(t, logs.String(), "the partitioned copy keeps messages for less than twice the events stream's MaxAge")
		require.Contains(t, logs.String(), "nats stream edit EVENTS_ORDERED --max-age 2h0m0s")
	})
}

// The copy lag gauges and ReadStatus show the events the copy has not
// sourced yet while its sourcing is held back (the source removed from
// the copy), and go back to 0 once it caught up (the source put back).
func TestOrderedCopyLagMovesWhileSourcingIsHeldBack(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusNoContent })
	reg := prometheus.NewRegistry()
	b.runOrdered(t, deliver.Config{Registerer: reg}, orderedSub("lag", rc.URL))
	copyName := wire.OrderedStream("EVENTS")
	gauge := func(name string) float64 {
		v, _ := gaugeOf(reg, name, "stream", copyName)
		return v
	}
	b.publishStream(t, "order-1", 0, 3)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 3 }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		_, ok := gaugeOf(reg, "jsbridge_consumer_ordered_copy_lag_messages", "stream", copyName)
		return ok && gauge("jsbridge_consumer_ordered_copy_lag_messages") == 0
	}, 10*time.Second, 10*time.Millisecond, "caught up")

	s, err := b.js.Stream(b.ctx, copyName)
	require.NoError(t, err)
	held := s.CachedInfo().Config
	sources := held.Sources
	held.Sources = nil
	_, err = b.js.UpdateStream(b.ctx, held)
	require.NoError(t, err)
	b.publishStream(t, "order-1", 3, 8)
	require.Eventually(t, func() bool {
		return gauge("jsbridge_consumer_ordered_copy_lag_messages") == 5 && gauge("jsbridge_consumer_ordered_copy_lag_seconds") > 0
	}, 10*time.Second, 10*time.Millisecond, "5 events not sourced")
	st, err := inspect.ReadStatus(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, st.Copies, 1)
	require.Equal(t, copyName, st.Copies[0].Stream)
	require.Equal(t, uint64(3), st.Copies[0].Sourced)
	require.Equal(t, uint64(5), st.Copies[0].Messages)
	require.Positive(t, st.Copies[0].Age)

	held.Sources = sources
	_, err = b.js.UpdateStream(b.ctx, held)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return gauge("jsbridge_consumer_ordered_copy_lag_messages") == 0 && gauge("jsbridge_consumer_ordered_copy_lag_seconds") == 0
	}, 10*time.Second, 10*time.Millisecond, "caught up again")
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 8 }, 20*time.Second, 10*time.Millisecond)
	requireInOrder(t, rc.accepted(), []string{"order-1"}, 8)
}

// A partition consumer deleted while the subscription runs is created
// again and its partition's delivery resumes: every event is delivered,
// in order (a redelivered one at most repeats, at least once).
func TestOrderedPartitionConsumerDeletedAtRunTimeIsRecreated(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusNoContent })
	logs := &syncLog{}
	b.runOrdered(t, deliver.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, orderedSub("deleted", rc.URL))
	b.publishStream(t, "order-1", 0, 5)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 5 }, 20*time.Second, 10*time.Millisecond)
	durable := wire.PartitionDurable("deleted", wire.StreamPartition("order-1", 4))
	require.NoError(t, b.js.DeleteConsumer(b.ctx, wire.OrderedStream("EVENTS"), durable))
	b.publishStream(t, "order-1", 5, 10)
	// First arrivals, each version once among them.
	first := func() []int64 {
		var out []int64
		seen := map[int64]bool{}
		for _, v := range rc.accepted()["order-1"] {
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(first()) == 10 }, 20*time.Second, 10*time.Millisecond, "delivery resumed")
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, first(), "in order, none lost")
	_, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), durable)
	require.NoError(t, err, "the partition consumer exists again")
	require.Contains(t, logs.String(), "a partition consumer was deleted; created it again")
}

// A held event of a parked stream that outlives the copy's MaxAge (an
// existing copy made with 8 s) never ages out silently: the stream's park
// entry names the cause (the event, its time in the copy, the copy's
// MaxAge, what to do; TestRetentionRisk has the 3/4 stage) and the owner
// logs it. Meanwhile the copy lag gauges still move (sourcing held back
// while the stream is parked), and a replay delivers the head and the held
// events, in order, from the owner's memory.
func TestOrderedHeldEventPastTheCopysMaxAgeParksWithTheCause(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a held event to age past an 8 s MaxAge")
	}
	t.Parallel()
	b := setupOrdered(t)
	copyName := wire.OrderedStream("EVENTS")
	_, err := b.js.CreateStream(b.ctx, copyConfig(4, 8*time.Second))
	require.NoError(t, err)
	var fixed atomic.Bool
	rc := newOrderedReceiver(t, b, func(e orderedEvent, _ int) int {
		if e.stream == "order-1" && e.version == 1 && !fixed.Load() {
			return http.StatusUnprocessableEntity
		}
		return http.StatusNoContent
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	logs := &syncLog{}
	reg := prometheus.NewRegistry()
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	// A 2 s lease TTL keeps the partition with its owner under load (a
	// hand-over would lose the events the copy removed, as documented, and
	// the replay below could not deliver them), and the copy watcher reads
	// the lag every 2 s, well before the copy's messages all age out.
	c := b.runOrdered(t, deliver.Config{DeadLetters: q, Registerer: reg, LeaseTTL: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil))},
		orderedSub("aging", rc.URL))
	start := time.Now()
	b.publishStream(t, "order-1", 0, 4)
	held := publishedID(b, orderedEvent{"order-1", 2}) // the oldest held
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "aging")
		return err == nil && len(p) == 1 && p[0].Held == 2
	}, 20*time.Second, 20*time.Millisecond, "order-1 parked, versions 2 and 3 held")

	// The copy lag gauges move while the stream's events are held (read
	// before the copy's messages all age out: an empty copy names no
	// sourced sequence).
	gauge := func(name string) float64 {
		v, _ := gaugeOf(reg, name, "stream", copyName)
		return v
	}
	s, err := b.js.Stream(b.ctx, copyName)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	sources := cfg.Sources
	cfg.Sources = nil
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	b.publishStream(t, "order-2", 0, 3)
	require.Eventually(t, func() bool {
		return gauge("jsbridge_consumer_ordered_copy_lag_messages") == 3 && gauge("jsbridge_consumer_ordered_copy_lag_seconds") > 0
	}, 20*time.Second, 10*time.Millisecond, "3 events not sourced")
	cfg.Sources = sources
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return gauge("jsbridge_consumer_ordered_copy_lag_messages") == 0 }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-2"]) == 3 }, 20*time.Second, 10*time.Millisecond)

	var entry deadletter.ParkedStream
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "aging")
		if err != nil || len(p) != 1 {
			return false
		}
		entry = p[0]
		return strings.Contains(entry.Error, "past the partitioned copy "+copyName+"'s MaxAge 8s: the copy removed it")
	}, 20*time.Second, 20*time.Millisecond, "the park entry names the cause once the held event passed MaxAge")
	require.GreaterOrEqual(t, time.Since(start), 8*time.Second)
	require.Equal(t, held, entry.AtRiskEventID)
	require.Contains(t, entry.Error, "held event "+held+" is ")
	require.Equal(t, 8*time.Second, entry.CopyMaxAge)
	require.False(t, entry.AtRiskEventTime.IsZero())
	require.Contains(t, entry.Error, "nats stream edit "+copyName+" --max-age")
	require.Contains(t, logs.String(), "a parked stream's held event nears or passed the partitioned copy's MaxAge: held event "+held)
	// consumer status shows the cause on the stream's partition.
	st, err := inspect.ReadStatus(b.ctx, b.js)
	require.NoError(t, err)
	var atRisk []string
	for _, ss := range st.Subscriptions {
		for _, p := range ss.Partitions {
			if ss.Name == "aging" && p.Partition == entry.Partition {
				atRisk = p.AtRisk
			}
		}
	}
	require.Len(t, atRisk, 1)
	require.True(t, strings.HasPrefix(atRisk[0], "order-1: held event "+held), atRisk[0])
	require.Eventually(t, func() bool {
		_, err := s.GetMsg(b.ctx, 3)
		return errors.Is(err, jetstream.ErrMsgNotFound)
	}, 10*time.Second, 20*time.Millisecond, "the copy removed the held event (the server expires it on its own timer)")

	// The owner still holds the removed events: a replay delivers them.
	require.Equal(t, []int64{0}, rc.accepted()["order-1"], "versions 2 and 3 held behind the parked head")
	letters, err := q.List(b.ctx, "aging")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	fixed.Store(true)
	res := c.Replay(b.ctx, q, letters)
	require.NoError(t, res[0].Err)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 4 }, 20*time.Second, 10*time.Millisecond)
	requireInOrder(t, rc.accepted(), []string{"order-1"}, 4)
}

// publishedID returns the id of the event b published as e ("" when
// none).
func publishedID(b *orderedBundle, e orderedEvent) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, x := range b.events {
		if x == e {
			return id
		}
	}
	return ""
}
