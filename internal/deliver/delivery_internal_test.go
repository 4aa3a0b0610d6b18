package deliver

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

func TestVerdict(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]verdict{
		200: verdictAck, 201: verdictAck, 204: verdictAck, 299: verdictAck,
		301: verdictRetry, 302: verdictRetry, 307: verdictRetry, 304: verdictRetry,
		400: verdictPermanent, 401: verdictPermanent, 404: verdictPermanent, 410: verdictGone, 422: verdictPermanent,
		408: verdictRetry, 429: verdictThrottle,
		500: verdictRetry, 502: verdictRetry, 503: verdictRetry, 504: verdictRetry,
		100: verdictRetry,
	} {
		r := response{status: status, retryAfter: -1}
		require.Equal(t, want, r.verdict(), "status %d", status)
		require.Equal(t, want == verdictRetry, errors.Is(r.breakerErr(), errEndpoint), "status %d counts as endpoint failure only when retried", status)
		require.Equal(t, want == verdictThrottle, errors.Is(r.breakerErr(), breaker.ErrExcluded), "status %d is not counted only when throttling", status)
	}
	// 503 with Retry-After throttles; without, it is a failure (above).
	r := response{status: http.StatusServiceUnavailable, retryAfter: time.Second}
	require.Equal(t, verdictThrottle, r.verdict())
	// An order gate's 409s: not permanent, not an endpoint failure.
	for order, want := range map[string]verdict{
		wire.OrderGap: verdictOrderWait, wire.OrderInProgress: verdictOrderWait, wire.OrderStaleEpoch: verdictStaleEpoch,
		"": verdictPermanent, wire.OrderDuplicate: verdictPermanent,
	} {
		r := response{status: http.StatusConflict, order: order, retryAfter: -1}
		require.Equal(t, want, r.verdict(), "409 %q", order)
		require.NoError(t, r.breakerErr(), "409 %q is no endpoint failure", order)
	}
	netErr := response{err: errors.New("connection refused"), retryAfter: -1}
	require.Equal(t, verdictRetry, netErr.verdict())
	require.Equal(t, ClassNetwork, netErr.class())
	timeout := response{err: errors.New("deadline"), timeout: true, retryAfter: -1}
	require.Equal(t, ClassTimeout, timeout.class())
	require.Equal(t, "4xx", response{status: 404}.class())

	// TLS failures: retried, class tls, found through the wrapping that
	// net/http adds (url.Error, net.OpError, joins).
	for _, err := range []error{
		&url.Error{Op: "Post", URL: "https://h.example", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}},
		fmt.Errorf("post: %w", &net.OpError{Op: "remote error", Err: tls.AlertError(116)}),
		errors.Join(errors.New("other"), x509.HostnameError{}),
		tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"},
	} {
		r := response{err: err, retryAfter: -1}
		require.Equal(t, verdictRetry, r.verdict(), "%v", err)
		require.Equal(t, ClassTLS, r.class(), "%v", err)
	}
	require.Equal(t, ClassNetwork, response{err: &url.Error{Op: "Post", URL: "https://h.example", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}}.class())
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":      -1,
		"1":     time.Second,
		" 120 ": 2 * time.Minute,
		"0":     0,
		"-5":    -1,
		"soon":  -1,
		"86400": MaxRetryAfter,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat):       0,
	} {
		require.Equal(t, want, parseRetryAfter(in, now), "Retry-After %q", in)
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	r := &sender{sub: subscription.Subscription{BackOff: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}}}
	require.Equal(t, time.Second, r.retryDelay(1, -1))
	require.Equal(t, 5*time.Second, r.retryDelay(2, -1))
	require.Equal(t, 30*time.Second, r.retryDelay(3, -1))
	require.Equal(t, 30*time.Second, r.retryDelay(9, -1), "the last entry repeats")
	require.Equal(t, 2*time.Second, r.retryDelay(1, 2*time.Second), "Retry-After wins")
	require.Equal(t, MaxRetryAfter, r.retryDelay(1, time.Hour), "Retry-After is capped")
}

// settlementOf is the one decision both settlers act on: ack a 2xx,
// dead-letter a permanent 4xx or a retryable failure on the last attempt,
// retry the rest after Retry-After or the backoff; an order gate's 409 gap
// or in-progress waits whatever the attempt, its stale-epoch stops.
func TestSettlementOf(t *testing.T) {
	backOff := []time.Duration{time.Second, 5 * time.Second}
	for _, tc := range []struct {
		name             string
		resp             response
		attempt, maxDlvr int
		want             settlement
	}{
		{"2xx acks", response{status: 204, retryAfter: -1}, 1, 3, settlement{act: actAck, outcome: OutcomeAck, class: "2xx"}},
		{"4xx dead-letters at once", response{status: 422, retryAfter: -1}, 1, 3,
			settlement{act: actDeadLetter, outcome: OutcomeTerm, class: "4xx", reason: "HTTP 422 Unprocessable Entity"}},
		{"5xx retries with the backoff", response{status: 503, retryAfter: -1}, 2, 3,
			settlement{act: actRetry, outcome: OutcomeRetry, class: "5xx", reason: "HTTP 503 Service Unavailable", delay: 5 * time.Second}},
		{"Retry-After wins", response{status: 500, retryAfter: 7 * time.Second}, 1, 3,
			settlement{act: actRetry, outcome: OutcomeRetry, class: "5xx", reason: "HTTP 500 Internal Server Error", delay: 7 * time.Second}},
		{"429 throttles in place, even on the last attempt", response{status: 429, retryAfter: 7 * time.Second}, 3, 3,
			settlement{act: actThrottle, outcome: OutcomeThrottled, class: "4xx", reason: "HTTP 429 Too Many Requests", delay: 7 * time.Second}},
		{"503 with Retry-After throttles", response{status: 503, retryAfter: 0}, 3, 3,
			settlement{act: actThrottle, outcome: OutcomeThrottled, class: "5xx", reason: "HTTP 503 Service Unavailable"}},
		{"410 disables, not dead-lettered", response{status: 410, retryAfter: -1}, 1, 3,
			settlement{act: actDisable, outcome: OutcomeDisabled, class: "4xx", reason: "HTTP 410 Gone"}},
		{"last attempt exhausts", response{status: 503, retryAfter: -1}, 3, 3,
			settlement{act: actDeadLetter, outcome: OutcomeExhausted, class: "5xx", reason: "HTTP 503 Service Unavailable (attempt 3 of MaxDeliver 3)"}},
		{"no limit", response{status: 503, retryAfter: -1}, 99, -1,
			settlement{act: actRetry, outcome: OutcomeRetry, class: "5xx", reason: "HTTP 503 Service Unavailable", delay: 5 * time.Second}},
		{"gate gap waits, never dead-lettered", response{status: 409, order: wire.OrderGap, retryAfter: time.Second}, 3, 3,
			settlement{act: actWait, outcome: OutcomeRetry, class: "4xx", reason: "HTTP 409 Conflict (order gate: gap)", delay: time.Second}},
		{"gate in-progress waits", response{status: 409, order: wire.OrderInProgress, retryAfter: -1}, 9, 3,
			settlement{act: actWait, outcome: OutcomeRetry, class: "4xx", reason: "HTTP 409 Conflict (order gate: in-progress)", delay: OrderWaitDelay}},
		{"gate Retry-After capped", response{status: 409, order: wire.OrderGap, retryAfter: time.Minute}, 1, 3,
			settlement{act: actWait, outcome: OutcomeRetry, class: "4xx", reason: "HTTP 409 Conflict (order gate: gap)", delay: MaxOrderWait}},
		{"gate stale-epoch stops", response{status: 409, order: wire.OrderStaleEpoch, retryAfter: time.Second}, 3, 3,
			settlement{act: actStale, outcome: OutcomeStaleEpoch, class: "4xx", reason: "HTTP 409 Conflict (order gate: stale-epoch)", delay: time.Second}},
		{"409 without the gate's header is permanent", response{status: 409, retryAfter: -1}, 1, 3,
			settlement{act: actDeadLetter, outcome: OutcomeTerm, class: "4xx", reason: "HTTP 409 Conflict"}},
		{"409 with an unknown order value is permanent", response{status: 409, order: "bogus", retryAfter: -1}, 1, 3,
			settlement{act: actDeadLetter, outcome: OutcomeTerm, class: "4xx", reason: "HTTP 409 Conflict (order gate: bogus)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, settlementOf(tc.resp, tc.attempt, tc.maxDlvr, backOff))
		})
	}
}
