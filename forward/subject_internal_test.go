package forward

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSubjectCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		filter, sub string
		want        bool
	}{
		{">", "events.>", true},
		{"events.>", "events.>", true},
		{"*.>", "events.>", true},
		{"events.*.>", "events.>", false}, // misses events.x
		{"events.*", "events.>", false},
		{"events.order.>", "events.>", false},
		{"other.>", "events.>", false},
		{"events", "events.>", false},
		{"acme.>", "acme.shop.>", true},
		{"acme.*.>", "acme.shop.>", true},
		{"acme.shop", "acme.shop.>", false},
		{"acme.*", "acme.shop", true},
		{"acme.shop", "acme.*", false},
		{"a.b.c", "a.b.c", true},
	} {
		require.Equal(t, tc.want, subjectCovers(tc.filter, tc.sub), "%q covers %q", tc.filter, tc.sub)
	}
}
