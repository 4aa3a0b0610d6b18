package bridge_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/store"
)

// retentionCase is one limit of EVENTS and how to make it remove the
// first events of stream order-1.
type retentionCase struct {
	name string
	cfg  bridge.Config
	// ageOut appends (or waits) until JetStream's limit has removed
	// order-1's events before version last (and last too, but for
	// MaxMsgsPerSubject).
	ageOut func(t *testing.T, bb bundle, last int64)
}

// A stream whose forwarded events the JetStream stream's own limits
// removed is not blocked: a bridge that takes it over (reconciling) and
// one that kept running both publish its next event after the watermark;
// Verify reports the removed events as aged out, none missing, and
// Repair publishes nothing.
func TestAgedOutStreamIsForwardedNotBlocked(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for JetStream to age messages out")
	}
	t.Parallel()
	for _, c := range []retentionCase{
		// The duplicate window may not exceed MaxAge.
		{name: "MaxAge", cfg: bridge.Config{MaxAge: 2 * time.Second, DuplicateWindow: time.Second},
			ageOut: func(t *testing.T, bb bundle, _ int64) {
				require.Eventually(t, func() bool { return jsCount(t, bb.js, bridge.DefaultStream) == 0 }, 30*time.Second, 100*time.Millisecond)
			}},
		{name: "MaxBytes", cfg: bridge.Config{MaxBytes: 4 << 10},
			ageOut: func(t *testing.T, bb bundle, _ int64) {
				// Another stream's events push order-1's out. All of them
				// are forwarded before ageOut returns: one published after
				// order-1's next event would push that one out too.
				var last int64
				for range 20 {
					evs, err := bb.store.Append(context.Background(), "filler-1", store.AnyVersion, store.NewEvent{Name: "Filled", Data: []byte(`{"pad":"` + strings.Repeat("x", 400) + `"}`)})
					require.NoError(t, err)
					last = evs[len(evs)-1].Version
				}
				waitWatermark(t, bb.store, "filler-1", last)
				require.Eventually(t, func() bool { return len(orderVersions(t, bb)) == 0 && jsCount(t, bb.js, bridge.DefaultStream) > 0 }, 30*time.Second, 50*time.Millisecond)
			}},
		{name: "MaxMsgsPerSubject", cfg: bridge.Config{MaxMsgsPerSubject: 1},
			ageOut: func(t *testing.T, bb bundle, last int64) {
				// Every version shares the last one's subject (event name):
				// only the last stays.
				require.Eventually(t, func() bool { return fmt.Sprint(orderVersions(t, bb)) == fmt.Sprint([]int64{last}) }, 30*time.Second, 50*time.Millisecond)
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testAgedOut(t, c)
		})
	}
}

func testAgedOut(t *testing.T, c retentionCase) {
	bb := setup(t)
	ctx := context.Background()
	cfg := c.cfg
	cfg.Schema, cfg.PollInterval, cfg.Logger = bb.schema, 50*time.Millisecond, quiet()
	// A lease the first bridge still holds when it stops (a cycle cut off
	// at Stop under load) keeps its stream from the second for the
	// lease: the default 30 s was the whole of ageOut's wait (one
	// fresh-clone CI run failed the MaxBytes case at 31 s).
	cfg.Lease = 3 * time.Second
	first, err := bridge.New(bb.pool, bb.js, cfg)
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	t.Cleanup(func() { _ = first.Stop(context.Background()) }) // a failure before its Stop below
	for v := range 3 {
		_, err := bb.store.Append(ctx, "order-1", int64(v-1), store.NewEvent{Name: "Updated", Data: fmt.Appendf(nil, `{"n":%d,"pad":"%s"}`, v, strings.Repeat("y", 300))})
		require.NoError(t, err)
	}
	waitWatermark(t, bb.store, "order-1", 2)
	c.ageOut(t, bb, 2)

	// The running bridge: its next publish expects a message that is gone.
	_, err = bb.store.Append(ctx, "order-1", 2, store.NewEvent{Name: "Updated", Data: []byte(`{"n":3}`)})
	require.NoError(t, err)
	waitWatermark(t, bb.store, "order-1", 3)
	require.NoError(t, first.Stop(ctx))

	// A bridge that takes the stream over reconciles with what is left.
	second, err := bridge.New(bb.pool, bb.js, cfg)
	require.NoError(t, err)
	require.NoError(t, second.Start(ctx))
	t.Cleanup(func() { _ = second.Stop(context.Background()) })
	c.ageOut(t, bb, 3) // and version 3 with them (MaxMsgsPerSubject: all but 3)
	_, err = bb.store.Append(ctx, "order-1", 3, store.NewEvent{Name: "Updated", Data: []byte(`{"n":4}`)})
	require.NoError(t, err)
	info := waitWatermark(t, bb.store, "order-1", 4)
	require.False(t, info.Blocked, info.Error)
	require.Contains(t, orderVersions(t, bb), int64(4), "published after the watermark")

	infos, err := bb.store.Streams(ctx, store.StreamFilter{Names: []string{"order-1"}})
	require.NoError(t, err)
	rep, err := bridge.Verify(ctx, bb.js, bb.store, infos, bridge.VerifyConfig{})
	require.NoError(t, err)
	counts, _ := rep.Counts()
	require.Zero(t, counts[bridge.ProblemMissing], "%+v", rep.Problems)
	require.Empty(t, rep.Problems)
	require.EqualValues(t, 5-len(orderVersions(t, bb)), rep.AgedOut, "every event JetStream no longer holds is aged out")
	before := jsCount(t, bb.js, bridge.DefaultStream)
	require.NoError(t, bridge.Repair(ctx, bb.js, &rep))
	require.Equal(t, before, jsCount(t, bb.js, bridge.DefaultStream), "repair publishes nothing")
}

// orderVersions returns the versions of order-1 JetStream holds, in
// stored order.
func orderVersions(t *testing.T, bb bundle) []int64 {
	t.Helper()
	versions, _ := jsEvents(t, bb.js, bridge.DefaultStream)
	return versions["order-1"]
}

// waitWatermark waits until stream's watermark reaches v (or it blocks:
// then it fails with the reason) and returns its info.
func waitWatermark(t *testing.T, st *store.Store, stream string, v int64) store.StreamInfo {
	t.Helper()
	var info store.StreamInfo
	require.Eventually(t, func() bool {
		infos, err := st.Streams(context.Background(), store.StreamFilter{Names: []string{stream}})
		require.NoError(t, err)
		require.Len(t, infos, 1)
		info = infos[0]
		require.False(t, info.Blocked, "stream %s blocked: %s", stream, info.Error)
		return info.Watermark >= v
	}, 30*time.Second, 20*time.Millisecond, "watermark of %s to reach %d", stream, v)
	return info
}
