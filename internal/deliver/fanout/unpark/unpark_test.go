package unpark

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A request's key spells the stream in hex (an escaped stream token may
// hold '%', which a key may not), and reads back.
func TestARequestsKeyReadsBack(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ sub, stream string }{{"billing", "order.order-42"}, {"s_1", "a%2Eb.c"}} {
		k := Key(c.sub, c.stream)
		require.NotContains(t, k, "%")
		sub, stream, ok := parseKey(k)
		require.True(t, ok, k)
		require.Equal(t, c.sub, sub)
		require.Equal(t, c.stream, stream)
	}
	for _, k := range []string{"pos.p1", "op.", "op.s", "op.s.zz", "op..6162"} {
		_, _, ok := parseKey(k)
		require.False(t, ok, k)
	}
}

// A request Write refuses names the field and the value, and writes
// nothing (a nil bucket is never reached).
func TestABadRequestIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sub, stream string
		r           Request
		want        string
	}{
		{"a.b", "s", Request{Head: 1}, `subscription "a.b"`},
		{"a", "", Request{Head: 1}, "stream is empty"},
		{"a", "s", Request{}, "Head is 0"},
		{"a", "s", Request{Head: 1, Previous: -2}, "Previous -2"},
	} {
		err := Write(t.Context(), nil, c.sub, c.stream, c.r)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, c.want)
	}
}
