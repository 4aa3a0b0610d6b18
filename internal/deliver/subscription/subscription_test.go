package subscription_test

import (
	"encoding/base64"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

// secret is a valid Standard Webhooks secret (whsec_ and base64).
var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("subscription-test-secret-012345"))

// sub returns a valid subscription named name for url, allowed a private
// address.
func sub(name, url string) subscription.Subscription {
	return subscription.Subscription{
		Name:           name,
		FilterSubjects: []string{"events.order.>"},
		URL:            url,
		Secrets:        []string{secret},
		AllowPrivate:   true,
	}
}

func TestSubscriptionValidate(t *testing.T) {
	t.Parallel()
	valid := func() subscription.Subscription {
		s := sub("orders", "https://hooks.example/in")
		s.AllowPrivate = false
		return s
	}
	require.NoError(t, valid().Validate())
	withHTTP := valid()
	withHTTP.URL, withHTTP.AllowHTTP = "http://hooks.example/in", true
	require.NoError(t, withHTTP.Validate(), "AllowHTTP permits plain http to a public name")
	private := valid()
	private.URL, private.AllowPrivate = "http://169.254.169.254/", true
	require.NoError(t, private.Validate(), "AllowPrivate permits private addresses and plain http")

	for _, tc := range []struct {
		name   string
		mutate func(*subscription.Subscription)
		want   string
	}{
		{"name", func(s *subscription.Subscription) { s.Name = "a.b" }, `Name: "a.b" does not match`},
		{"empty name", func(s *subscription.Subscription) { s.Name = "" }, `Name: "" does not match`},
		{"no filter", func(s *subscription.Subscription) { s.FilterSubjects = nil }, "FilterSubjects: none given"},
		{"bad filter", func(s *subscription.Subscription) { s.FilterSubjects = []string{"events.order.>", "events..x"} }, `FilterSubjects[1]: "events..x"`},
		{"url scheme", func(s *subscription.Subscription) { s.URL = "ftp://h.example/x" }, `URL: "ftp://h.example/x" is not`},
		{"relative url", func(s *subscription.Subscription) { s.URL = "/hook" }, `URL: "/hook" is not`},
		{"scheme", func(s *subscription.Subscription) { s.Scheme = "md5" }, `Scheme: `},
		{"no secrets", func(s *subscription.Subscription) { s.Secrets = nil }, "Secrets: "},
		{"body", func(s *subscription.Subscription) { s.Body = "xml" }, `Body: "xml"`},
		{"reserved header", func(s *subscription.Subscription) { s.Headers = map[string]string{"Idempotency-Key": "x"} }, `Headers: "Idempotency-Key" is set by deliver`},
		{"ce header", func(s *subscription.Subscription) { s.Headers = map[string]string{"Ce-Type": "x"} }, `Headers: "Ce-Type" is set by deliver`},
		{"header name", func(s *subscription.Subscription) { s.Headers = map[string]string{"Bad Name": "x"} }, `Headers: "Bad Name" is not a valid header name`},
		{"timeout", func(s *subscription.Subscription) { s.Timeout = -time.Second }, "Timeout: -1s"},
		{"max deliver", func(s *subscription.Subscription) { s.MaxDeliver = -2 }, "MaxDeliver: -2"},
		{"backoff", func(s *subscription.Subscription) { s.BackOff = []time.Duration{time.Second, 0} }, "BackOff[1]: 0s"},
		{"max in flight", func(s *subscription.Subscription) { s.MaxInFlight = -1 }, "MaxInFlight: -1"},
		{"max ack pending", func(s *subscription.Subscription) { s.MaxInFlight = 100; s.MaxAckPending = 10 }, "MaxAckPending: 10 is below MaxInFlight 100"},
		{"plain http", func(s *subscription.Subscription) { s.URL = "http://hooks.example/in" }, `URL: "http://hooks.example/in" is plain http`},
		{"metadata address", func(s *subscription.Subscription) { s.URL = "https://169.254.169.254/latest" }, "169.254.169.254 is link-local"},
		{"loopback literal", func(s *subscription.Subscription) { s.URL = "https://[::1]:8443/in" }, "::1 is loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := valid()
			tc.mutate(&s)
			err := s.Validate()
			require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, `"`+s.Name+`"`, "names the subscription")
		})
	}
}

func TestSubscriptionValidateKeepsSecretsOut(t *testing.T) {
	t.Parallel()
	s := sub("orders", "https://user:hunter2@hooks.example/in?token=sesame")
	s.Secrets = []string{"whsec_!!not-base64-hunter2"}
	s.Headers = map[string]string{"Authorization": "Bearer hunter2\n"}
	err := s.Validate()
	require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
	require.NotContains(t, err.Error(), "hunter2")

	s.Secrets = []string{secret}
	err = s.Validate()
	require.ErrorContains(t, err, `Headers: value of "Authorization" contains CR, LF or NUL`)
	require.NotContains(t, err.Error(), "hunter2")

	s = sub("orders", "ftp://user:hunter2@hooks.example/in?token=sesame")
	err = s.Validate()
	require.ErrorContains(t, err, `URL: "ftp://hooks.example/in"`)
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "sesame")
}

func TestSubscriptionStandardNeedsWhsecSecret(t *testing.T) {
	t.Parallel()
	s := sub("orders", "https://hooks.example/in")
	s.Scheme = webhook.SchemeStandard
	s.Secrets = []string{"raw-secret"}
	require.ErrorIs(t, s.Validate(), webhook.ErrInvalidSecret)
	require.NotContains(t, s.Validate().Error(), "raw-secret")
}

// The fields the first table does not reach: the rate limit, the enums,
// TLS, and the sentinels the URL's errors wrap besides
// ErrInvalidSubscription.
func TestSubscriptionValidateMore(t *testing.T) {
	t.Parallel()
	valid := func() subscription.Subscription {
		s := sub("orders", "https://hooks.example/in")
		s.AllowPrivate = false
		return s
	}
	for _, tc := range []struct {
		name   string
		mutate func(*subscription.Subscription)
		want   string
		is     error
	}{
		{"negative rate", func(s *subscription.Subscription) { s.RateLimit = -1 }, "RateLimit: -1 (want requests per second", nil},
		{"NaN rate", func(s *subscription.Subscription) { s.RateLimit = math.NaN() }, "RateLimit: NaN", nil},
		{"infinite rate", func(s *subscription.Subscription) { s.RateLimit = math.Inf(1) }, "RateLimit: +Inf", nil},
		{"ordering", func(s *subscription.Subscription) { s.Ordering = "global" }, `Ordering: "global" (want "stream" or "none")`, nil},
		{"on dead letter", func(s *subscription.Subscription) { s.OnDeadLetter = "drop" }, `OnDeadLetter: "drop" (want "park" or "skip")`, nil},
		{"TLS on http", func(s *subscription.Subscription) {
			s.URL, s.AllowHTTP, s.TLS = "http://hooks.example/in", true, subscription.TLSFiles{CAFile: "ca.pem"}
		}, `TLS: set for "http://hooks.example/in", which is not https`, nil},
		{"TLS half a pair", func(s *subscription.Subscription) { s.TLS = subscription.TLSFiles{ClientCertFile: "c.pem"} }, "TLS.ClientCertFile and TLS.ClientKeyFile go together", nil},
		{"TLS missing file", func(s *subscription.Subscription) { s.TLS = subscription.TLSFiles{CAFile: "/nonexistent/ca.pem"} }, "TLS.CAFile", nil},
		{"plain http", func(s *subscription.Subscription) { s.URL = "http://hooks.example/in" }, "use https", subscription.ErrPlainHTTP},
		{"private literal", func(s *subscription.Subscription) { s.URL = "https://10.0.0.1/in" }, "10.0.0.1", subscription.ErrForbiddenAddress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := valid()
			tc.mutate(&s)
			err := s.Validate()
			require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, `"orders"`, "names the subscription")
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
		})
	}
	ok := valid()
	ok.RateLimit, ok.Ordering, ok.OnDeadLetter = 2.5, subscription.OrderingNone, subscription.DeadLetterSkip
	require.NoError(t, ok.Validate())
}

// WithDefaults fills every zero field with its default and keeps what is
// set; MaxAckPending is at least MaxInFlight.
func TestWithDefaults(t *testing.T) {
	t.Parallel()
	d := sub("orders", "https://hooks.example/in").WithDefaults()
	require.Equal(t, webhook.SchemeStandard, d.Scheme)
	require.Equal(t, subscription.BodyStructured, d.Body)
	require.Equal(t, subscription.DefaultTimeout, d.Timeout)
	require.Zero(t, d.AckWait, "AckWait is ignored: no default")
	require.Equal(t, subscription.DefaultMaxDeliver, d.MaxDeliver)
	require.Equal(t, subscription.DefaultBackOff(), d.BackOff)
	require.Equal(t, subscription.DefaultMaxInFlight, d.MaxInFlight)
	require.Equal(t, subscription.DefaultMaxAckPending, d.MaxAckPending)
	require.Equal(t, subscription.DefaultOrdering, d.Ordering)
	require.Equal(t, subscription.DeadLetterPark, d.OnDeadLetter)
	require.Zero(t, d.RateLimit, "no rate limit by default")
	require.Equal(t, subscription.Start{}, d.Start, "StartNew is the zero Start")

	set := subscription.Subscription{
		Scheme: webhook.SchemeHMACSHA256, Body: subscription.BodyBinary, Timeout: time.Second, AckWait: 3 * time.Second,
		MaxDeliver: -1, BackOff: []time.Duration{time.Millisecond}, MaxInFlight: 2000, Ordering: subscription.OrderingNone,
		OnDeadLetter: subscription.DeadLetterSkip,
	}
	got := set.WithDefaults()
	require.Equal(t, set.Scheme, got.Scheme)
	require.Equal(t, set.Body, got.Body)
	require.Equal(t, set.Timeout, got.Timeout)
	require.Equal(t, set.AckWait, got.AckWait)
	require.Equal(t, -1, got.MaxDeliver)
	require.Equal(t, set.BackOff, got.BackOff)
	require.Equal(t, 2000, got.MaxAckPending, "MaxAckPending defaults to MaxInFlight when that is larger")
	require.Equal(t, subscription.OrderingNone, got.Ordering)
	require.Equal(t, subscription.DeadLetterSkip, got.OnDeadLetter)

	// Each call returns a fresh default backoff: a caller changing it
	// changes no other subscription's.
	a := subscription.DefaultBackOff()
	a[0] = time.Hour
	require.Equal(t, []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute}, subscription.DefaultBackOff())
}

// Ordered: the default (no Ordering) and OrderingStream are ordered,
// OrderingNone is not.
func TestOrdered(t *testing.T) {
	t.Parallel()
	require.True(t, subscription.Subscription{}.Ordered())
	require.True(t, subscription.Subscription{Ordering: subscription.OrderingStream}.Ordered())
	require.False(t, subscription.Subscription{Ordering: subscription.OrderingNone}.Ordered())
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"orders", "Orders_2", "a-b", "0"} {
		require.True(t, subscription.ValidName(ok), ok)
	}
	for _, bad := range []string{"", "a.b", "a b", "a/b", "a*", "a>", "é"} {
		require.False(t, subscription.ValidName(bad), bad)
	}
}

// AckWait is deprecated and ignored: any value validates (a document of
// an earlier release loads, whatever its timeout), WithDefaults leaves it,
// and a change of it alone does not make a subscription another one.
func TestAckWaitIsIgnored(t *testing.T) {
	t.Parallel()
	for _, ackWait := range []time.Duration{-time.Second, time.Second, 30 * time.Second} {
		s := sub("orders", "https://hooks.example/in")
		s.Timeout, s.AckWait = 10*time.Second, ackWait
		require.NoError(t, s.WithDefaults().Validate(), "ack_wait %s", ackWait)
		require.Equal(t, ackWait, s.WithDefaults().AckWait)
		other := s
		other.AckWait = 0
		require.True(t, subscription.Equal(s.WithDefaults(), other.WithDefaults()), "ack_wait %s", ackWait)
	}
}
