package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/store"
)

// TestStreamEventsPagesUpToThrough: a stream's events after..through, in
// version order, page by page, data as the drain fetches it; since keeps
// the newer ones.
func TestStreamEventsPagesUpToThrough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.appendN(t, "pg-1", 7)
	b.appendN(t, "other-1", 3)
	_, err := b.store.Append(ctx, "pg-1", store.AnyVersion, store.NewEvent{Name: "Spaced", Data: []byte(`{"b":  1,   "a": 2}`)})
	require.NoError(t, err)

	var versions []int64
	after := int64(-1)
	for {
		page, err := b.store.StreamEvents(ctx, "pg-1", after, 5, time.Time{}, 2)
		require.NoError(t, err)
		for _, e := range page {
			require.Equal(t, "pg-1", e.Stream)
			versions = append(versions, e.Version)
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Version
	}
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5}, versions, "up to through, in order, in pages of 2")

	fetched, err := b.store.StreamEvents(ctx, "pg-1", 6, 7, time.Time{}, 10)
	require.NoError(t, err)
	require.Len(t, fetched, 1)
	require.JSONEq(t, `{"a": 2, "b": 1}`, string(fetched[0].Data))
	require.Equal(t, `{"a": 2, "b": 1}`, string(fetched[0].Data), "jsonb's normalized text, as Fetch reads it")

	none, err := b.store.StreamEvents(ctx, "pg-1", -1, 7, time.Now().Add(time.Hour), 10)
	require.NoError(t, err)
	require.Empty(t, none, "nothing created since an hour from now")
	all, err := b.store.StreamEvents(ctx, "pg-1", -1, 7, time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.Len(t, all, 8)

	_, err = b.store.StreamEvents(ctx, "pg-1", -1, 7, time.Time{}, 0)
	require.True(t, errors.Is(err, store.ErrInvalidInput), fmt.Sprint(err))
}
