package position

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadAllShowsRecordsAndCursorsAsCommitted: what a status view reads
// back is what the owners committed, partition by partition, with each
// partition's cursor keys, and it reads as JSON with named fields.
func TestReadAllShowsRecordsAndCursorsAsCommitted(t *testing.T) {
	ctx := context.Background()
	js, kv := setup(t)

	none, err := ReadAll(ctx, kv)
	require.NoError(t, err)
	require.Empty(t, none, "an empty bucket")

	p0, err := Claim(ctx, js, kv, Config{Partition: 0, Owner: "replica-a", Epoch: 7})
	require.NoError(t, err)
	run(t, p0)
	p0.Edit(func(r *Record) { r.Floor, r.Members["live"], r.Members["slow"] = 100, 0, 0 })
	p0.Settled("live", "order-42", Entry{Seq: 120, Version: 17})
	require.True(t, p0.Detach("slow", "paused"))
	require.NoError(t, p0.Wait(ctx, "live", "order-42", 120))

	p3, err := Claim(ctx, js, kv, Config{Partition: 3, Owner: "replica-b", Epoch: 9})
	require.NoError(t, err)
	run(t, p3)
	p3.Edit(func(r *Record) { r.Floor = 55 })
	p3.Settled("live", "user-7", Entry{Seq: 56, Version: 2})
	require.NoError(t, p3.Wait(ctx, "live", "user-7", 56))
	_, err = kv.Put(ctx, "partitions", []byte("16")) // another key of the bucket
	require.NoError(t, err)

	got, err := ReadAll(ctx, kv)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, 0, got[0].Partition)
	require.Equal(t, "replica-a", got[0].Record.Owner)
	require.Equal(t, uint64(7), got[0].Record.Epoch)
	require.Equal(t, uint64(100), got[0].Record.Floor)
	require.True(t, got[0].Record.Covers("live", "order-42", 120))
	require.NotContains(t, got[0].Record.Members, "slow", "the cursor's commit dropped it")
	require.Equal(t, "paused", got[0].Cursors["slow"].State)
	require.NotZero(t, got[0].Revision)
	require.False(t, got[0].Updated.IsZero())
	require.Equal(t, 3, got[1].Partition)
	require.Equal(t, "replica-b", got[1].Record.Owner)
	require.Equal(t, Entry{Seq: 56, Version: 2}, got[1].Record.Ahead["live"]["user-7"])
	require.Empty(t, got[1].Cursors)

	raw, err := json.Marshal(got[0])
	require.NoError(t, err)
	var view map[string]any
	require.NoError(t, json.Unmarshal(raw, &view))
	rec := view["record"].(map[string]any)
	require.Equal(t, "replica-a", rec["owner"])
	require.EqualValues(t, 100, rec["floor"])
	require.Equal(t, "paused", view["cursors"].(map[string]any)["slow"].(map[string]any)["state"])
}

func TestParseKey(t *testing.T) {
	for key, want := range map[string]struct {
		sub string
		p   int
		ok  bool
	}{
		"pos.p0":          {"", 0, true},
		"pos.p15":         {"", 15, true},
		"cur.orders.p3":   {"orders", 3, true},
		"cur..p3":         {},
		"pos.x1":          {},
		"pos.p-1":         {},
		"partitions":      {},
		"lease-epoch":     {},
		"cur.a.b.p1":      {},
		"skipped.a.order": {},
	} {
		sub, p, ok := parseKey(key)
		require.Equal(t, want.ok, ok, key)
		if ok {
			require.Equal(t, want.sub, sub, key)
			require.Equal(t, want.p, p, key)
		}
	}
}
