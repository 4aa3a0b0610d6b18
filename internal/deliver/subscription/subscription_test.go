package deliver_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

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
		{"ack wait", func(s *subscription.Subscription) { s.AckWait = -time.Second }, "AckWait: -1s"},
		{"timeout at half ack wait", func(s *subscription.Subscription) { s.Timeout, s.AckWait = 3*time.Second, 6*time.Second }, "Timeout: 3s must be below half of AckWait 6s"},
		{"timeout over half ack wait", func(s *subscription.Subscription) { s.Timeout, s.AckWait = 3*time.Second, 5*time.Second }, "Timeout: 3s must be below half of AckWait 5s"},
		{"default timeout, short ack wait", func(s *subscription.Subscription) { s.AckWait = 8 * time.Second }, "Timeout: 10s must be below half of AckWait 8s"},
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
