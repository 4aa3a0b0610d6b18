package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// bridge streams points from a blocked stream to unblock (and reset), and
// from a stream backing off to what it will do by itself; with more
// streams than it names, to --all or --match.
func TestStreamsOutputPointsToTheNextStep(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(t.Context()))
	ctx := t.Context()
	for _, s := range []string{"order-7", "payment-3", "order-8"} {
		_, err := st.Append(ctx, s, store.AnyVersion, store.NewEvent{Name: "Happened", Data: []byte(`{}`)})
		require.NoError(t, err)
	}
	_, err = st.Claim(ctx, "bridge-a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, st.Block(ctx, "bridge-a", "order-7", -1, 0, "event 1 (version 0, Happened): data is not JSON"))
	require.NoError(t, st.Retry(ctx, "bridge-a", "payment-3", -1, 0, time.Hour, "publish: nats: timeout"))
	require.NoError(t, st.Release(ctx, "bridge-a", []string{"order-8"}))

	list := func(blocked bool) string {
		infos, err := st.Streams(ctx, store.StreamFilter{Blocked: blocked})
		require.NoError(t, err)
		var out bytes.Buffer
		require.NoError(t, printStreams(&out, infos, blocked))
		return out.String()
	}
	all := list(false)
	require.Contains(t, all, "1 blocked: nothing of theirs is forwarded until an operator acts")
	require.Contains(t, all, "\n  bridge unblock order-7\n")
	require.Contains(t, all, "bridge reset STREAM --yes")
	require.Contains(t, all, "1 retrying after failures (RETRY > 0)")
	require.Contains(t, all, "`bridge unblock payment-3` tries now")
	require.NotContains(t, all, "order-8\n", "a healthy stream is named in no command")
	t.Logf("bridge streams:\n%s", all)

	blocked := list(true)
	require.Contains(t, blocked, "bridge unblock order-7")
	require.NotContains(t, blocked, "retrying")

	_, err = st.Unblock(ctx, []string{"order-7"})
	require.NoError(t, err)
	require.Equal(t, "no blocked streams\n", list(true))

	var many []store.StreamInfo
	for k := range nextNamed + 1 {
		many = append(many, store.StreamInfo{Stream: fmt.Sprintf("order-%d", k), Blocked: true})
	}
	require.Contains(t, streamsNext(many, nil), "  bridge unblock --all (or --match REGEX)\n")
}
