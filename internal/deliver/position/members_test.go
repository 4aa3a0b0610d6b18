package position

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// oldRecord is fullRecord as the version before members keys encoded it
// (format 1).
const oldRecord = "5001097265706c6963612d620939663363544f4b454e7695dadbadaca593be1893fd3f0a086f726465722d3432076f726465722d37076f726465722d39067061726b656403733132027333037334300373343102733706757365722d3102001311010100020402001d1209580305010227020204cbfb3f0500010802d9f33f030108d9f33f0301dcfa3f020607"

// A record written before members keys existed (the migration's, an
// earlier version's) decodes as it did, and a record without a members
// key is still written in those bytes.
func TestARecordOfTheFormerFormatStillDecodes(t *testing.T) {
	t.Parallel()
	b, err := hex.DecodeString(oldRecord)
	require.NoError(t, err)
	got, ref, err := decodeRecordRef(b)
	require.NoError(t, err)
	require.Empty(t, ref.key, "no members key")
	require.Equal(t, fullRecord(), got)
	r := fullRecord()
	require.Equal(t, b, r.encode())
}

// manyMembers is a record of n members live from below its floor, plus
// "above" live from above it.
func manyMembers(n int) Record {
	r := Record{Owner: "replica-a", Claim: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Epoch: 40, Floor: 5_000_000,
		Streams: map[string]Entry{"order-1": {5_000_010, 7}}, Members: map[string]uint64{"above": 5_000_020}}
	for i := range n {
		r.Members[fmt.Sprintf("subscription-%05d", i)] = 4_990_000 + uint64(i)
	}
	return r
}

// Against a members key, a member live from at or below the floor is
// left out of the record: the key says it is a member, and the floor
// says the rest. A member above the floor keeps its entry, one the key
// does not hold is listed, one gone from the key is listed as gone, and
// the record decodes to the same members (those at the floor from the
// floor, which covers the same events).
func TestAMemberAtTheFloorIsLeftOutOfTheRecord(t *testing.T) {
	t.Parallel()
	r := manyMembers(10_000)
	inline := r.encode()
	base := membersOf(&r, MembersKey(3, "TOKEN", 1))
	r.Members["new"] = 4_000_000 // joined after the key was written, below the floor
	delete(r.Members, "subscription-00007")
	rec := r.encodeOn(base)
	key := base.encode()
	t.Logf("10,000 members at the floor: %d bytes a commit inline, %d against the members key (written once: %d bytes)", len(inline), len(rec), len(key))
	require.Less(t, len(rec), 200)

	got, ref, err := decodeRecordRef(rec)
	require.NoError(t, err)
	require.Equal(t, baseRef{key: "mem.p3.TOKEN.1", count: 10_001, left: []string{"subscription-00007"}}, ref)
	require.Equal(t, map[string]uint64{"above": 5_000_020, "new": 4_000_000}, got.Members, "the record lists only what the key does not say")
	m, err := decodeMembers(ref.key, key)
	require.NoError(t, err)
	require.NoError(t, withBase(&got, ref, m))
	require.Len(t, got.Members, 10_001)
	require.Equal(t, uint64(5_000_000), got.Members["subscription-00001"], "at the floor")
	require.Equal(t, uint64(5_000_020), got.Members["above"], "above the floor: its own entry")
	require.NotContains(t, got.Members, "subscription-00007", "gone")
	for sub := range r.Members {
		for _, seq := range []uint64{4_999_999, 5_000_000, 5_000_001, 5_000_020, 5_000_021} {
			require.Equal(t, r.Covers(sub, "order-2", seq), got.Covers(sub, "order-2", seq), "%s at %d", sub, seq)
		}
	}

	_, err = decodeMembers(ref.key, key[:len(key)-1])
	require.ErrorIs(t, err, ErrCorrupt)
	short := *m
	short.names = map[string]struct{}{"above": {}}
	again, ref, err := decodeRecordRef(rec)
	require.NoError(t, err)
	require.ErrorIs(t, withBase(&again, ref, &short), ErrCorrupt, "not the key the record names")
	_, err = decodeRecord(rec)
	require.ErrorIs(t, err, ErrCorrupt, "a record read without its members key")
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
	_, ref, err := decodeRecordRef(e.Value())
	require.NoError(t, err)
	firstKey := ref.key
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
		_, ref, err := decodeRecordRef(e.Value())
		require.NoError(t, err)
		require.Equal(t, firstKey, ref.key)
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
	_, ref, err = decodeRecordRef(e.Value())
	require.NoError(t, err)
	require.NotEqual(t, firstKey, ref.key, "a new members key")
	require.Equal(t, uint64(9_301), ref.count)
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
	_, err = kv.Get(ctx, ref.key)
	require.NoError(t, err, "the key the record names stays")

	all, err := ReadAll(ctx, kv)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Len(t, all[0].Record.Members, 9_301, "status reads the members through the key")
}

// One commit's encoding with 10,000 members live at the floor: the whole
// record every time (inline, as before members keys), and against the
// members key.
func BenchmarkRecordEncodeManyMembers(b *testing.B) {
	r := manyMembers(10_000)
	base := membersOf(&r, MembersKey(0, "TOKEN", 1))
	for _, tc := range []struct {
		name string
		base *members
	}{{"inline", nil}, {"members-key", base}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				n = len(r.encodeOn(tc.base))
			}
			b.ReportMetric(float64(n), "bytes")
		})
	}
}

// The rest of one commit's work on the record with 10,000 members live
// at the floor: normalising it, encoding it against the members key, and
// the copy kept as what the commit stored.
func BenchmarkCommitManyMembers(b *testing.B) {
	st := state{rec: manyMembers(10_000), cursors: map[string]*cursorKey{}}
	st.base = membersOf(&st.rec, MembersKey(0, "TOKEN", 1))
	b.ReportAllocs()
	for b.Loop() {
		st.rec.Floor++
		f, err := st.fit(DefaultMaxSize, func() string { b.Fatal("a new members key"); return "" })
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(f.val)), "bytes")
	}
}
