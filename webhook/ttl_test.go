package webhook_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
)

func TestMinSafeTTL(t *testing.T) {
	t.Parallel()
	s := time.Second
	for name, tc := range map[string]struct {
		p    webhook.RetryProfile
		want time.Duration
	}{
		// One attempt: only its own timeout, doubled.
		"single attempt": {webhook.RetryProfile{MaxDeliver: 1, Timeout: 10 * s}, 20 * s},
		// 3 attempts: 2 gaps of max(10,30)+backoff (1, then 5) + 10 = 76, ×2.
		"hand-over dominates": {webhook.RetryProfile{MaxDeliver: 3, Timeout: 10 * s, HandOver: 30 * s, BackOff: []time.Duration{s, 5 * s}}, 152 * s},
		// The last backoff repeats: gaps 10+1, 10+4, 10+4, 10+4; + 10 = 63, ×3.
		"last backoff repeats": {webhook.RetryProfile{MaxDeliver: 5, Timeout: 10 * s, BackOff: []time.Duration{s, 4 * s}, SafetyFactor: 3}, 189 * s},
		// Retry-After above the backoff replaces it: 2 gaps of 10+60, + 10 = 150, ×2.
		"retry-after dominates": {webhook.RetryProfile{MaxDeliver: 3, Timeout: 10 * s, BackOff: []time.Duration{s}, RetryAfter: time.Minute}, 300 * s},
		// Rounded up to a second after the factor; Replay added after.
		"rounding and replay": {webhook.RetryProfile{MaxDeliver: 1, Timeout: 1500 * time.Millisecond, SafetyFactor: 1.5, Replay: time.Hour}, 3*s + time.Hour},
		// jsbridge's default subscription, as documented on MinSafeTTL.
		"deliver defaults": {webhook.RetryProfile{MaxDeliver: 10, Timeout: 10 * s, HandOver: 20 * s,
			BackOff: []time.Duration{s, 5 * s, 30 * s, 2 * time.Minute, 5 * time.Minute}}, time.Hour + time.Minute + 32*s},
		// The same with Handler's lease as the longest Retry-After (README).
		"deliver defaults, handler lease": {webhook.RetryProfile{MaxDeliver: 10, Timeout: 10 * s, HandOver: 20 * s,
			BackOff: []time.Duration{s, 5 * s, 30 * s, 2 * time.Minute, 5 * time.Minute}, RetryAfter: webhook.DefaultLease}, time.Hour + 6*time.Minute + 20*s},
		// The deprecated AckWait still counts, as the larger of the two.
		"ack wait, deprecated": {webhook.RetryProfile{MaxDeliver: 3, Timeout: 10 * s, AckWait: 30 * s, HandOver: 20 * s, BackOff: []time.Duration{s, 5 * s}}, 152 * s},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := webhook.MinSafeTTL(tc.p)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestMinSafeTTLMonotone: more attempts, a longer timeout, hand-over (or AckWait) or
// backoff never shorten the TTL.
func TestMinSafeTTLMonotone(t *testing.T) {
	t.Parallel()
	base := webhook.RetryProfile{MaxDeliver: 4, Timeout: 5 * time.Second, HandOver: 10 * time.Second, BackOff: []time.Duration{time.Second, 10 * time.Second}}
	ttl := func(p webhook.RetryProfile) time.Duration {
		d, err := webhook.MinSafeTTL(p)
		require.NoError(t, err)
		return d
	}
	b := ttl(base)
	for name, mutate := range map[string]func(*webhook.RetryProfile){
		"MaxDeliver": func(p *webhook.RetryProfile) { p.MaxDeliver++ },
		"Timeout":    func(p *webhook.RetryProfile) { p.Timeout += 6 * time.Second },
		"HandOver":   func(p *webhook.RetryProfile) { p.HandOver += time.Second },
		"AckWait":    func(p *webhook.RetryProfile) { p.AckWait += 20 * time.Second },
		"BackOff":    func(p *webhook.RetryProfile) { p.BackOff = []time.Duration{time.Second, 11 * time.Second} },
		"RetryAfter": func(p *webhook.RetryProfile) { p.RetryAfter = 11 * time.Second },
		"Factor":     func(p *webhook.RetryProfile) { p.SafetyFactor = 2.5 },
	} {
		p := base
		mutate(&p)
		require.Greater(t, ttl(p), b, name)
	}
}

func TestMinSafeTTLRejectsBadProfile(t *testing.T) {
	t.Parallel()
	ok := webhook.RetryProfile{MaxDeliver: 3, Timeout: time.Second}
	for field, mutate := range map[string]func(*webhook.RetryProfile){
		"MaxDeliver -1":     func(p *webhook.RetryProfile) { p.MaxDeliver = -1 },
		"MaxDeliver 0":      func(p *webhook.RetryProfile) { p.MaxDeliver = 0 },
		"Timeout 0s":        func(p *webhook.RetryProfile) { p.Timeout = 0 },
		"HandOver -1s":      func(p *webhook.RetryProfile) { p.HandOver = -time.Second },
		"AckWait -1s":       func(p *webhook.RetryProfile) { p.AckWait = -time.Second },
		"RetryAfter -1s":    func(p *webhook.RetryProfile) { p.RetryAfter = -time.Second },
		"Replay -1s":        func(p *webhook.RetryProfile) { p.Replay = -time.Second },
		"SafetyFactor 0.5":  func(p *webhook.RetryProfile) { p.SafetyFactor = 0.5 },
		"SafetyFactor NaN":  func(p *webhook.RetryProfile) { p.SafetyFactor = math.NaN() },
		"SafetyFactor +Inf": func(p *webhook.RetryProfile) { p.SafetyFactor = math.Inf(1) },
		"BackOff[1] -1s":    func(p *webhook.RetryProfile) { p.BackOff = []time.Duration{time.Second, -time.Second} },
		"TTL overflows": func(p *webhook.RetryProfile) {
			p.MaxDeliver = math.MaxInt32
			p.BackOff = []time.Duration{time.Duration(math.MaxInt64 / 4)}
		},
		"TTL overflows time.Duration": func(p *webhook.RetryProfile) { p.BackOff = []time.Duration{math.MaxInt64} },
	} {
		p := ok
		mutate(&p)
		_, err := webhook.MinSafeTTL(p)
		require.ErrorIs(t, err, webhook.ErrInvalidRetryProfile, field)
		require.ErrorContains(t, err, field, "the error names the field and the value")
	}
}

func ExampleMinSafeTTL() {
	// The sender: a jsbridge subscription with its defaults; the receiver
	// also wants operator replays within a day deduplicated.
	ttl, err := webhook.MinSafeTTL(webhook.RetryProfile{
		MaxDeliver: 10,
		Timeout:    10 * time.Second,
		HandOver:   20 * time.Second,
		BackOff:    []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute},
		Replay:     24 * time.Hour,
	})
	fmt.Println(ttl, err)
	// Output: 25h1m32s <nil>
}
