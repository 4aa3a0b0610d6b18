package record

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A cursor's Top is the highest sequence it says settled, whichever of
// its floor, Above or stream entries holds it.
func TestACursorsTopIsTheHighestSequenceItSettled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    Cursor
		want uint64
	}{
		{"empty", Cursor{}, 0},
		{"floor", Cursor{Floor: 40}, 40},
		{"above, unsorted", Cursor{Floor: 40, Above: []uint64{52, 61, 45}}, 61},
		{"stream entries", Cursor{Floor: 40, Streams: map[string]Entry{"a": {Seq: 48, Version: 2}, "b": {Seq: 44}}}, 48},
	} {
		require.Equal(t, tc.want, tc.c.Top(), tc.name)
	}
}

// decodeRecord reads a record from b that names no members key (format
// 1); one that does is refused.
func decodeRecord(b []byte) (Record, error) {
	r, ref, err := DecodeRecordRef(b)
	if err == nil && ref.Key != "" {
		err = fmt.Errorf("%w: the record names members key %q", ErrCorrupt, ref.Key)
	}
	return r, err
}
