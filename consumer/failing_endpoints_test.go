package consumer_test

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// docs/failing-endpoints.md gives the time a failing endpoint has before
// its event is dead-lettered, by the defaults; the figures are these sums
// of the code's defaults, so changing a default changes the page.
func TestFailingEndpointsPageFigures(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/failing-endpoints.md")
	require.NoError(t, err)
	page := string(raw)

	backoff := consumer.DefaultBackOff()
	retries := consumer.DefaultMaxDeliver - 1
	var waits time.Duration // the delays before retries 1 … MaxDeliver-1, the last entry repeating
	for n := 1; n <= retries; n++ {
		waits += backoff[min(n-1, len(backoff)-1)]
	}
	fast := waits                                                                         // every attempt fails at once
	timeouts := waits + time.Duration(consumer.DefaultMaxDeliver)*consumer.DefaultTimeout // every attempt times out
	worst := waits + time.Duration(retries)*max(consumer.DefaultTimeout, consumer.DefaultHandOver) + consumer.DefaultTimeout

	for _, want := range []string{
		"**" + fast.String() + "** (the backoff alone)",
		"**" + timeouts.String() + "** (the backoff plus 10 × 10 s)",
		"**" + worst.String() + "** (9 × (a hand-over, 20 s, + the delay)",
		"= **" + fast.String() + "** of\nwaiting over the 9 retries",
		"at the\nearliest " + fast.String(),
	} {
		require.Contains(t, page, want)
	}
	var parts []string
	for _, d := range backoff {
		s := d.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		parts = append(parts, s)
	}
	require.Contains(t, page, "(`"+strings.Join(parts, ", ")+"`)", "the page spells the default backoff")
	require.Equal(t, 10, consumer.DefaultMaxDeliver, "the page says 10 attempts")
}

// docs/embedding.md's table of consumer.Config lists every field.
func TestEmbeddingPageListsEveryConfigField(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/embedding.md")
	require.NoError(t, err)
	typ := reflect.TypeFor[consumer.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		require.Regexp(t, "(?m)^\\| (`[A-Za-z]+`, )*`"+f.Name+"`", string(raw), "docs/embedding.md's consumer.Config table lacks %s", f.Name)
	}
}
