package deliver

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// A Put that changes the signing alone is applied in place; any other
// change, the rate limit included, restarts the subscription (its
// throttle is built with the rate when it starts).
func TestOnlySigningChanged(t *testing.T) {
	t.Parallel()
	a := subscription.Subscription{Name: "orders", FilterSubjects: []string{"events.>"}, URL: "https://hooks.example/in", Secrets: []string{"whsec_a"}}
	b := a
	b.Secrets, b.Scheme = []string{"whsec_b"}, "hmac-sha256"
	require.True(t, onlySigningChanged(a, b))
	require.True(t, onlySigningChanged(a, a))
	c := b
	c.RateLimit = 5
	require.False(t, onlySigningChanged(a, c), "a new rate limit needs a restart")
	c = b
	c.MaxInFlight = 3
	require.False(t, onlySigningChanged(a, c))
}
