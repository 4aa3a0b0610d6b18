package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/webhook"
)

// With --max-deliver -1, webhook.MinSafeTTL refuses, and its error gives
// the receiver a TTL to use instead: SafetyFactor × (the disable-after
// window + one longest retry gap) + Replay. The figure it quotes is the
// one the consumer's defaults give.
func TestMinSafeTTLAdviceForUnlimitedRetries(t *testing.T) {
	t.Parallel()
	_, err := webhook.MinSafeTTL(webhook.RetryProfile{MaxDeliver: -1, Timeout: consumer.DefaultTimeout, HandOver: consumer.DefaultHandOver})
	require.ErrorIs(t, err, webhook.ErrInvalidRetryProfile)
	require.ErrorContains(t, err, "MaxDeliver -1")
	require.ErrorContains(t, err, "finite max_deliver")

	backoff := consumer.DefaultBackOff()
	gap := max(consumer.DefaultTimeout, consumer.DefaultHandOver) + backoff[len(backoff)-1]
	advice := webhook.DefaultSafetyFactor * (consumer.DefaultDisableAfter + gap)
	require.Equal(t, "48h10m40s", advice.String(), "the figure in the error and in docs/receiver.md")
	require.ErrorContains(t, err, "48h10m40s with jsbridge's defaults")
}
