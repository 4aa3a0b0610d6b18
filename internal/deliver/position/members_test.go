package position

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// manyMembers is a record of n members live from below its floor, plus
// "above" live from above it.
func manyMembers(n int) Record {
	r := Record{Owner: "replica-a", Claim: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Epoch: 40, Floor: 5_000_000,
		Streams: map[string]Entry{"order-1": {Seq: 5_000_010, Version: 7}}, Members: map[string]uint64{"above": 5_000_020}}
	for i := range n {
		r.Members[fmt.Sprintf("subscription-%05d", i)] = 4_990_000 + uint64(i)
	}
	return r
}

// A commit writes a members key once enough members joined or left since
// the last one, and otherwise a record listing only the members the key
// does not say: with 10,000 members live at the floor, the commits after
// the first stay small. A new owner reads every member back, and the
// keys no record names are dropped.
func TestCommitsAfterTheMembersKeyWriteOnlyWhatItDoesNotSay(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	first := claim(t, js, kv, "replica-a", 1, clock)
	run(t, first)
	want := manyMembers(10_000)
	first.Edit(func(r *Record) { r.Floor, r.Members = want.Floor, want.Members })
	require.NoError(t, first.Flush(ctx))
	e, err := kv.Get(ctx, Key(0))
	require.NoError(t, err)
	t.Logf("the commit that wrote the members key: record %d bytes", len(e.Value()))
	require.Less(t, len(e.Value()), 200)
	_, ref, err := record.DecodeRecordRef(e.Value())
	require.NoError(t, err)
	firstKey := ref.Key
	mk, err := kv.Get(ctx, firstKey)
	require.NoError(t, err)
	t.Logf("the members key: %d bytes for 10,001 names", len(mk.Value()))

	for i := range 10 { // the floor rises, a few settle: small commits, the same key
		first.Edit(func(r *Record) { r.Floor += 100 })
		first.Settled("above", "order-9", Entry{Seq: want.Floor + 1000 + uint64(i), Version: uint64(i)})
		require.NoError(t, first.Flush(ctx))
		e, err := kv.Get(ctx, Key(0))
		require.NoError(t, err)
		require.Less(t, len(e.Value()), 200, "commit %d", i)
		_, ref, err := record.DecodeRecordRef(e.Value())
		require.NoError(t, err)
		require.Equal(t, firstKey, ref.Key)
	}

	// 700 leave (over 64 + 10,001/16): the next commit writes a new key
	// and drops the first.
	first.Edit(func(r *Record) {
		for i := range 700 {
			delete(r.Members, fmt.Sprintf("subscription-%05d", i))
		}
	})
	require.NoError(t, first.Flush(ctx))
	e, err = kv.Get(ctx, Key(0))
	require.NoError(t, err)
	_, ref, err = record.DecodeRecordRef(e.Value())
	require.NoError(t, err)
	require.NotEqual(t, firstKey, ref.Key, "a new members key")
	require.Equal(t, uint64(9_301), ref.Count)
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, firstKey)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 10*time.Second, 5*time.Millisecond, "the former key is dropped once the record naming the new one landed")

	// A key no record names (a commit whose record never landed) is
	// dropped by the next owner's Run; the new owner reads every member.
	_, err = kv.Put(ctx, MembersKey(0, "FORMER", 9), []byte("M\x01\x00"))
	require.NoError(t, err)
	want = first.Record()
	second := claim(t, js, kv, "replica-b", 2, clock)
	got := second.Record()
	require.Len(t, got.Members, 9_301)
	for sub, from := range want.Members {
		g, ok := got.Members[sub]
		if !ok || max(from, want.Floor) != max(g, got.Floor) {
			t.Fatalf("member %s: %d (ok %t) read back, %d committed, floor %d", sub, g, ok, from, want.Floor)
		}
	}
	run(t, second)
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, MembersKey(0, "FORMER", 9))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 10*time.Second, 5*time.Millisecond, "the stray key is dropped as the new owner's commits start")
	_, err = kv.Get(ctx, ref.Key)
	require.NoError(t, err, "the key the record names stays")

	all, err := ReadAll(ctx, kv)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Len(t, all[0].Record.Members, 9_301, "status reads the members through the key")
}

// The rest of one commit's work on the record with 10,000 members live
// at the floor: normalising it, encoding it against the members key, and
// the copy kept as what the commit stored.
func BenchmarkCommitManyMembers(b *testing.B) {
	st := state{rec: manyMembers(10_000), cursors: map[string]*cursorKey{}}
	st.base = record.MembersOf(&st.rec, MembersKey(0, "TOKEN", 1))
	b.ReportAllocs()
	for b.Loop() {
		st.rec.Floor++
		f, err := st.fit(defaultMaxSize, func() string { b.Fatal("a new members key"); return "" })
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(f.val)), "bytes")
	}
}
