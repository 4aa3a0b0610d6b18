package record

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// fullRecord is a record with every field set.
func fullRecord() Record {
	return Record{
		Owner: "replica-b", Claim: "9f3cTOKEN", Epoch: 118, Created: 1764370000123456789, Floor: 1048211,
		Streams: map[string]Entry{"order-42": {1048230, 17}, "order-7": {1048212, 0}},
		Ahead: map[string]map[string]Entry{
			"s12": {"order-42": {1048240, 18}, "user-1": {1048299, 3}},
			"s3":  {"order-9": {1048250, 2}},
		},
		Members:  map[string]uint64{"s12": 1048011, "s3": 0},
		Asides:   []Aside{{Sub: "s7", Stream: "order-9", From: 1047001, State: "parked"}},
		Retries:  []Retry{{Sub: "s7", Seq: 1047001, Attempts: 3}},
		Detached: []Detached{{From: 1047900, Subs: []string{"s40", "s41"}}},
	}
}

// benchRecord is a record of subs subscriptions each ahead of the shared
// entries on streams streams, the shared entries on every stream.
func benchRecord(subs, streams int) Record {
	r := Record{Owner: "replica-a", Claim: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Epoch: 40, Floor: 5_000_000,
		Streams: map[string]Entry{}, Ahead: map[string]map[string]Entry{}, Members: map[string]uint64{}}
	for k := range streams {
		r.Streams[fmt.Sprintf("order-%d", 1000+k)] = Entry{Seq: 5_000_100 + uint64(k), Version: 50 + uint64(k)}
	}
	for s := range subs {
		sub := fmt.Sprintf("subscription-%02d", s)
		r.Members[sub] = 4_990_000
		r.Ahead[sub] = map[string]Entry{}
		for k := range streams {
			r.Ahead[sub][fmt.Sprintf("order-%d", 1000+k)] = Entry{Seq: 5_000_300 + uint64(k), Version: 52 + uint64(k)}
		}
	}
	return r
}

// A record decodes to what was encoded, and encodes to the same bytes
// whatever its maps' order.
func TestARecordEncodesAndDecodesToItself(t *testing.T) {
	t.Parallel()
	r := fullRecord()
	b := r.Encode()
	got, err := decodeRecord(b)
	require.NoError(t, err)
	require.Equal(t, r, got)
	for range 20 {
		again := fullRecord()
		require.Equal(t, b, again.Encode(), "one record, one encoding")
	}
	c := Cursor{State: "behind", Floor: 900, Streams: map[string]Entry{"order-1": {950, 4}}, Above: []uint64{901, 905, 2000}}
	gotc, err := DecodeCursor(c.Encode())
	require.NoError(t, err)
	require.Equal(t, c, gotc)
}

// What the floor, a shared stream entry or a member entry covers is not
// written.
func TestTheEncodingDropsWhatTheFloorCovers(t *testing.T) {
	t.Parallel()
	r := Record{Floor: 100,
		Streams: map[string]Entry{"a": {90, 1}, "b": {120, 4}},
		Ahead:   map[string]map[string]Entry{"s1": {"a": {100, 2}, "b": {110, 3}, "c": {130, 1}}, "s2": {"c": {140, 9}}, "s3": {"d": {150, 1}}},
		Members: map[string]uint64{"s2": 145},
	}
	r.Normalise()
	got, err := decodeRecord(r.Encode())
	require.NoError(t, err)
	require.Equal(t, map[string]Entry{"b": {120, 4}}, got.Streams)
	require.Equal(t, map[string]map[string]Entry{"s1": {"c": {130, 1}}, "s3": {"d": {150, 1}}}, got.Ahead)
	require.True(t, got.Covers("s1", "b", 120), "the shared entry covers it")
	require.False(t, got.Covers("s1", "b", 121))
	require.True(t, got.Covers("s2", "c", 140), "the member entry covers it")
	require.False(t, got.Covers("s1", "c", 131))

	c := Cursor{Floor: 10, Streams: map[string]Entry{"a": {9, 1}, "b": {12, 2}}, Above: []uint64{15, 5, 11, 11}}
	c.Normalise()
	gotc, err := DecodeCursor(c.Encode())
	require.NoError(t, err)
	require.Equal(t, Cursor{Floor: 10, Streams: map[string]Entry{"b": {12, 2}}, Above: []uint64{11, 15}}, gotc)
	require.True(t, gotc.Covers("x", 15))
	require.False(t, gotc.Covers("x", 14))
}

// Bytes that are not a whole record (cut short, another kind, bytes
// left over, an index past the table) are refused with ErrCorrupt,
// never read as an empty record.
func TestACorruptRecordIsRefused(t *testing.T) {
	t.Parallel()
	full := fullRecord()
	b := full.Encode()
	for n := range len(b) {
		_, err := decodeRecord(b[:n])
		require.ErrorIs(t, err, ErrCorrupt, "cut at %d of %d bytes", n, len(b))
	}
	_, err := decodeRecord(append(append([]byte(nil), b...), 0))
	require.ErrorIs(t, err, ErrCorrupt, "a byte left over")
	c := Cursor{State: "behind", Floor: 1}
	_, err = decodeRecord(c.Encode())
	require.ErrorIs(t, err, ErrCorrupt, "a cursor is not a record")
	_, err = decodeRecord([]byte(`{"owner":"a"}`))
	require.ErrorIs(t, err, ErrCorrupt, "JSON")
	// A table of one name, then a shared entry naming the second.
	bad := Record{Streams: map[string]Entry{"a": {1, 1}}}
	bb := bad.Encode()
	i := len(bb) - 5 - 3 // the entry's name index: its 3 fields, then 5 counts of 0 (ahead … detached)
	require.Equal(t, []byte{0, 1, 1, 0, 0, 0, 0, 0}, bb[i:])
	bb[i] = 1
	_, err = decodeRecord(bb)
	require.ErrorIs(t, err, ErrCorrupt)
}

// The binary record is a fraction of the design's JSON: 16 subscriptions
// ahead on 100 streams each.
func TestTheEncodingIsSmallerThanJSON(t *testing.T) {
	t.Parallel()
	r := benchRecord(16, 100)
	b := r.Encode()
	j, err := json.Marshal(r)
	require.NoError(t, err)
	entries := 16*100 + 100
	t.Logf("16 subscriptions × 100 streams: %d bytes (%.1f an entry), JSON %d bytes", len(b), float64(len(b))/float64(entries), len(j))
	require.Less(t, len(b), len(j)/4)
	require.Less(t, len(b), (256<<10)/10, "a tenth of position.DefaultMaxSize")
}

func BenchmarkRecordEncode(b *testing.B) {
	r := benchRecord(16, 100)
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(r.Encode())
	}
	b.ReportMetric(float64(n), "bytes")
}

func BenchmarkRecordDecode(b *testing.B) {
	r := benchRecord(16, 100)
	enc := r.Encode()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRecord(enc); err != nil {
			b.Fatal(err)
		}
	}
}
