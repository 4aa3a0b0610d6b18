package attempt

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
	"github.com/jsbridge/jsbridge/wire"
)

func TestVerdict(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]Verdict{
		200: VerdictAck, 201: VerdictAck, 204: VerdictAck, 299: VerdictAck,
		301: VerdictRetry, 302: VerdictRetry, 307: VerdictRetry, 304: VerdictRetry,
		400: VerdictPermanent, 401: VerdictPermanent, 404: VerdictPermanent, 410: VerdictGone, 422: VerdictPermanent,
		408: VerdictRetry, 429: VerdictThrottle,
		500: VerdictRetry, 502: VerdictRetry, 503: VerdictRetry, 504: VerdictRetry,
		100: VerdictRetry,
	} {
		r := Response{Status: status, RetryAfter: -1}
		require.Equal(t, want, r.Verdict(), "status %d", status)
		require.Equal(t, want == VerdictRetry, errors.Is(r.breakerErr(), errEndpoint), "status %d counts as endpoint failure only when retried", status)
		require.Equal(t, want == VerdictThrottle, errors.Is(r.breakerErr(), breaker.ErrExcluded), "status %d is not counted only when throttling", status)
	}
	// 503 with Retry-After throttles; without, it is a failure (above).
	r := Response{Status: http.StatusServiceUnavailable, RetryAfter: time.Second}
	require.Equal(t, VerdictThrottle, r.Verdict())
	// An order gate's 409s: not permanent, not an endpoint failure.
	for order, want := range map[string]Verdict{
		wire.OrderGap: VerdictOrderWait, wire.OrderInProgress: VerdictOrderWait, wire.OrderStaleEpoch: VerdictStaleEpoch,
		"": VerdictPermanent, wire.OrderDuplicate: VerdictPermanent,
	} {
		r := Response{Status: http.StatusConflict, Order: order, RetryAfter: -1}
		require.Equal(t, want, r.Verdict(), "409 %q", order)
		require.NoError(t, r.breakerErr(), "409 %q is no endpoint failure", order)
	}
	netErr := Response{Err: errors.New("connection refused"), RetryAfter: -1}
	require.Equal(t, VerdictRetry, netErr.Verdict())
	require.Equal(t, ClassNetwork, netErr.Class())
	timeout := Response{Err: errors.New("deadline"), Timeout: true, RetryAfter: -1}
	require.Equal(t, ClassTimeout, timeout.Class())
	require.Equal(t, "4xx", Response{Status: 404}.Class())

	// TLS failures: retried, class tls, found through the wrapping that
	// net/http adds (url.Error, net.OpError, joins).
	for _, err := range []error{
		&url.Error{Op: "Post", URL: "https://h.example", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}},
		fmt.Errorf("post: %w", &net.OpError{Op: "remote error", Err: tls.AlertError(116)}),
		errors.Join(errors.New("other"), x509.HostnameError{}),
		tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"},
	} {
		r := Response{Err: err, RetryAfter: -1}
		require.Equal(t, VerdictRetry, r.Verdict(), "%v", err)
		require.Equal(t, ClassTLS, r.Class(), "%v", err)
	}
	require.Equal(t, ClassNetwork, Response{Err: &url.Error{Op: "Post", URL: "https://h.example", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}}.Class())
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
		require.Equal(t, want, ParseRetryAfter(in, now), "Retry-After %q", in)
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	backOff := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
	require.Equal(t, time.Second, retryDelay(backOff, 1, -1))
	require.Equal(t, 5*time.Second, retryDelay(backOff, 2, -1))
	require.Equal(t, 30*time.Second, retryDelay(backOff, 3, -1))
	require.Equal(t, 30*time.Second, retryDelay(backOff, 9, -1), "the last entry repeats")
	require.Equal(t, 2*time.Second, retryDelay(backOff, 1, 2*time.Second), "Retry-After wins")
	require.Equal(t, MaxRetryAfter, retryDelay(backOff, 1, time.Hour), "Retry-After is capped")
}

// SettlementOf is the one decision both settlers act on: ack a 2xx,
// dead-letter a permanent 4xx or a retryable failure on the last attempt,
// retry the rest after Retry-After or the backoff; an order gate's 409 gap
// or in-progress waits whatever the attempt, its stale-epoch stops.
func TestSettlementOf(t *testing.T) {
	backOff := []time.Duration{time.Second, 5 * time.Second}
	for _, tc := range []struct {
		name             string
		resp             Response
		attempt, maxDlvr int
		want             Settlement
	}{
		{"2xx acks", Response{Status: 204, RetryAfter: -1}, 1, 3, Settlement{Act: ActAck, Outcome: OutcomeAck, Class: "2xx"}},
		{"4xx dead-letters at once", Response{Status: 422, RetryAfter: -1}, 1, 3,
			Settlement{Act: ActDeadLetter, Outcome: OutcomeTerm, Class: "4xx", Reason: "HTTP 422 Unprocessable Entity"}},
		{"5xx retries with the backoff", Response{Status: 503, RetryAfter: -1}, 2, 3,
			Settlement{Act: ActRetry, Outcome: OutcomeRetry, Class: "5xx", Reason: "HTTP 503 Service Unavailable", Delay: 5 * time.Second}},
		{"Retry-After wins", Response{Status: 500, RetryAfter: 7 * time.Second}, 1, 3,
			Settlement{Act: ActRetry, Outcome: OutcomeRetry, Class: "5xx", Reason: "HTTP 500 Internal Server Error", Delay: 7 * time.Second}},
		{"429 throttles in place, even on the last attempt", Response{Status: 429, RetryAfter: 7 * time.Second}, 3, 3,
			Settlement{Act: ActThrottle, Outcome: OutcomeThrottled, Class: "4xx", Reason: "HTTP 429 Too Many Requests", Delay: 7 * time.Second}},
		{"503 with Retry-After throttles", Response{Status: 503, RetryAfter: 0}, 3, 3,
			Settlement{Act: ActThrottle, Outcome: OutcomeThrottled, Class: "5xx", Reason: "HTTP 503 Service Unavailable"}},
		{"410 disables, not dead-lettered", Response{Status: 410, RetryAfter: -1}, 1, 3,
			Settlement{Act: ActDisable, Outcome: OutcomeDisabled, Class: "4xx", Reason: "HTTP 410 Gone"}},
		{"last attempt exhausts", Response{Status: 503, RetryAfter: -1}, 3, 3,
			Settlement{Act: ActDeadLetter, Outcome: OutcomeExhausted, Class: "5xx", Reason: "HTTP 503 Service Unavailable (attempt 3 of MaxDeliver 3)"}},
		{"no limit", Response{Status: 503, RetryAfter: -1}, 99, -1,
			Settlement{Act: ActRetry, Outcome: OutcomeRetry, Class: "5xx", Reason: "HTTP 503 Service Unavailable", Delay: 5 * time.Second}},
		{"gate gap waits, never dead-lettered", Response{Status: 409, Order: wire.OrderGap, RetryAfter: time.Second}, 3, 3,
			Settlement{Act: ActWait, Outcome: OutcomeRetry, Class: "4xx", Reason: "HTTP 409 Conflict (order gate: gap)", Delay: time.Second}},
		{"gate in-progress waits", Response{Status: 409, Order: wire.OrderInProgress, RetryAfter: -1}, 9, 3,
			Settlement{Act: ActWait, Outcome: OutcomeRetry, Class: "4xx", Reason: "HTTP 409 Conflict (order gate: in-progress)", Delay: OrderWaitDelay}},
		{"gate Retry-After capped", Response{Status: 409, Order: wire.OrderGap, RetryAfter: time.Minute}, 1, 3,
			Settlement{Act: ActWait, Outcome: OutcomeRetry, Class: "4xx", Reason: "HTTP 409 Conflict (order gate: gap)", Delay: MaxOrderWait}},
		{"gate stale-epoch stops", Response{Status: 409, Order: wire.OrderStaleEpoch, RetryAfter: time.Second}, 3, 3,
			Settlement{Act: ActStale, Outcome: OutcomeStaleEpoch, Class: "4xx", Reason: "HTTP 409 Conflict (order gate: stale-epoch)", Delay: time.Second}},
		{"409 without the gate's header is permanent", Response{Status: 409, RetryAfter: -1}, 1, 3,
			Settlement{Act: ActDeadLetter, Outcome: OutcomeTerm, Class: "4xx", Reason: "HTTP 409 Conflict"}},
		{"409 with an unknown order value is permanent", Response{Status: 409, Order: "bogus", RetryAfter: -1}, 1, 3,
			Settlement{Act: ActDeadLetter, Outcome: OutcomeTerm, Class: "4xx", Reason: "HTTP 409 Conflict (order gate: bogus)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, SettlementOf(tc.resp, tc.attempt, tc.maxDlvr, backOff))
		})
	}
}
