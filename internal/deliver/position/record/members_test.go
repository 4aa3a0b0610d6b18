package record

import (
	"encoding/hex"
	"fmt"
	"testing"

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
	got, ref, err := DecodeRecordRef(b)
	require.NoError(t, err)
	require.Empty(t, ref.Key, "no members key")
	require.Equal(t, fullRecord(), got)
	r := fullRecord()
	require.Equal(t, b, r.Encode())
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
	inline := r.Encode()
	base := MembersOf(&r, "mem.p3.TOKEN.1")
	r.Members["new"] = 4_000_000 // joined after the key was written, below the floor
	delete(r.Members, "subscription-00007")
	rec := r.EncodeOn(base)
	key := base.Encode()
	t.Logf("10,000 members at the floor: %d bytes a commit inline, %d against the members key (written once: %d bytes)", len(inline), len(rec), len(key))
	require.Less(t, len(rec), 200)

	got, ref, err := DecodeRecordRef(rec)
	require.NoError(t, err)
	require.Equal(t, BaseRef{Key: "mem.p3.TOKEN.1", Count: 10_001, Left: []string{"subscription-00007"}}, ref)
	require.Equal(t, map[string]uint64{"above": 5_000_020, "new": 4_000_000}, got.Members, "the record lists only what the key does not say")
	m, err := DecodeMembers(ref.Key, key)
	require.NoError(t, err)
	require.NoError(t, WithBase(&got, ref, m))
	require.Len(t, got.Members, 10_001)
	require.Equal(t, uint64(5_000_000), got.Members["subscription-00001"], "at the floor")
	require.Equal(t, uint64(5_000_020), got.Members["above"], "above the floor: its own entry")
	require.NotContains(t, got.Members, "subscription-00007", "gone")
	for sub := range r.Members {
		for _, seq := range []uint64{4_999_999, 5_000_000, 5_000_001, 5_000_020, 5_000_021} {
			require.Equal(t, r.Covers(sub, "order-2", seq), got.Covers(sub, "order-2", seq), "%s at %d", sub, seq)
		}
	}

	_, err = DecodeMembers(ref.Key, key[:len(key)-1])
	require.ErrorIs(t, err, ErrCorrupt)
	short := *m
	short.Names = map[string]struct{}{"above": {}}
	again, ref, err := DecodeRecordRef(rec)
	require.NoError(t, err)
	require.ErrorIs(t, WithBase(&again, ref, &short), ErrCorrupt, "not the key the record names")
	_, err = decodeRecord(rec)
	require.ErrorIs(t, err, ErrCorrupt, "a record read without its members key")
}

// One commit's encoding with 10,000 members live at the floor: the whole
// record every time (inline, as before members keys), and against the
// members key.
func BenchmarkRecordEncodeManyMembers(b *testing.B) {
	r := manyMembers(10_000)
	base := MembersOf(&r, "mem.p0.TOKEN.1")
	for _, tc := range []struct {
		name string
		base *Members
	}{{"inline", nil}, {"members-key", base}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				n = len(r.EncodeOn(tc.base))
			}
			b.ReportMetric(float64(n), "bytes")
		})
	}
}
