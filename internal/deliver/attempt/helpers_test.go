package attempt

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

// testSecret is the subscriptions' signing secret in these tests.
var testSecret = "whsec_" + strings.Repeat("MDEyMzQ1Njc4OWFiY2RlZg==", 1)

// newTestSender is the Sender of sub POSTing with client, with deps
// (Deliveries: a new unregistered counter when not given).
func newTestSender(tb testing.TB, sub subscription.Subscription, client *http.Client, deps Deps) *Sender {
	tb.Helper()
	signer, err := webhook.NewSigner(webhook.SchemeStandard, testSecret)
	if err != nil {
		tb.Fatal(err)
	}
	if deps.Metrics.Deliveries == nil {
		deps.Metrics.Deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deliveries_total"}, []string{"subscription", "outcome", "status_class"})
	}
	s, err := New(Config{Subscription: sub, Signer: signer, Client: client, UserAgent: "jsbridge-test"}, deps)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
