package bridge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/internal/audit"
	"github.com/jsbridge/jsbridge/store"
)

// Events the watermark counts as forwarded but JetStream does not hold (a
// server that lost its last writes) are reported as a missing tail,
// re-published by Repair in order, and gone from the next Verify.
func TestVerifyFindsAMissingTailAndRepairPutsItBack(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	ctx := context.Background()
	evs, err := bb.store.Append(ctx, "order-1", store.NoStream,
		store.NewEvent{Name: "Placed", Data: []byte(`{"n":0}`)},
		store.NewEvent{Name: "Paid", Data: []byte(`{"n":1}`)},
		store.NewEvent{Name: "Shipped", Data: []byte(`{"n":2}`)})
	require.NoError(t, err)
	// The stream exists, empty; the watermark says all three went out.
	b, err := bridge.New(bb.pool, bb.js, bridge.Config{Schema: bb.schema, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, b.Provision(ctx))
	claims, err := bb.store.Claim(ctx, "lost", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.NoError(t, bb.store.Ack(ctx, "lost", "order-1", evs[2].Version, evs[2].ID))

	infos, err := bb.store.Streams(ctx, store.StreamFilter{})
	require.NoError(t, err)
	rep, err := bridge.Verify(ctx, bb.js, bb.store, infos, bridge.VerifyConfig{All: true})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Streams)
	require.EqualValues(t, 3, rep.Events)
	require.Len(t, rep.Problems, 3)
	for i, p := range rep.Problems {
		require.Equal(t, bridge.ProblemMissing, p.Kind, fmt.Sprint(p))
		require.True(t, p.Tail, "version %d is after every stored message", p.Version)
		require.Equal(t, evs[i].ID, p.EventID)
	}
	counts, repaired := rep.Counts()
	require.Equal(t, 3, counts[bridge.ProblemMissing])
	require.Zero(t, repaired)

	require.NoError(t, bridge.Repair(ctx, bb.js, &rep))
	require.Zero(t, rep.Unresolved(), "%+v", rep.Problems)
	for _, p := range rep.Problems {
		require.True(t, p.Repaired)
		require.Positive(t, p.Sequence)
	}
	versions, _ := jsEvents(t, bb.js, bridge.DefaultStream)
	require.Equal(t, map[string][]int64{"order-1": {0, 1, 2}}, versions, "re-published in order")

	rep, err = bridge.Verify(ctx, bb.js, bb.store, infos, bridge.VerifyConfig{})
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
}

func TestVerifyConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := bridge.Verify(context.Background(), nil, nil, nil, bridge.VerifyConfig{PageSize: -1})
	require.ErrorIs(t, err, bridge.ErrInvalidConfig)
	require.ErrorContains(t, err, "VerifyConfig.PageSize -1")
	_, err = bridge.Verify(context.Background(), nil, nil, nil, bridge.VerifyConfig{SubjectPrefix: "a.>"})
	require.ErrorIs(t, err, bridge.ErrInvalidConfig)
	require.ErrorContains(t, err, `SubjectPrefix "a.>"`)
}

// The front door's kinds are spelled as the engine's: Report.fill converts
// one into the other by its string.
func TestProblemKindsMatchTheAudit(t *testing.T) {
	t.Parallel()
	require.EqualValues(t, audit.Missing, bridge.ProblemMissing)
	require.EqualValues(t, audit.Duplicate, bridge.ProblemDuplicate)
	require.EqualValues(t, audit.OutOfOrder, bridge.ProblemOutOfOrder)
	require.EqualValues(t, audit.ContentDiffers, bridge.ProblemContentDiffers)
	require.Equal(t, audit.DefaultPageSize, bridge.DefaultVerifyPageSize)
}

func TestVerifyWithoutTheStream(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	infos := []store.StreamInfo{{Stream: "order-1", Watermark: 0}}
	_, err := bridge.Verify(context.Background(), bb.js, bb.store, infos, bridge.VerifyConfig{})
	require.ErrorIs(t, err, bridge.ErrNoStream)
	require.ErrorContains(t, err, `"EVENTS"`)
}
