package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/deliver"
	"github.com/jsbridge/jsbridge/webhook"
)

const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24="
)

// The complete file the README shows loads into these subscriptions.
func TestLoadCompleteSubscriptionsFile(t *testing.T) {
	t.Setenv("BILLING_SECRET", secretA)
	t.Setenv("BILLING_SECRET_NEXT", secretB)
	t.Setenv("BILLING_AUTH", "Bearer t0ken")
	raw, err := os.ReadFile("testdata/subscriptions.yaml")
	require.NoError(t, err)
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "audit_webhook")
	require.NoError(t, os.WriteFile(secretFile, []byte("audit-hmac-key\n"), 0o600))
	path := filepath.Join(dir, "subs.yaml")
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(string(raw), "/run/secrets/audit_webhook", secretFile)), 0o600))

	subs, bs, err := loadSubscriptions(path)
	require.NoError(t, err)
	require.Equal(t, breaker.Settings{ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20, Interval: time.Minute,
		OpenTimeout: 30 * time.Second, HalfOpenProbes: 1}, bs)
	require.Len(t, subs, 2)
	require.Equal(t, deliver.Subscription{
		Name: "billing", FilterSubjects: []string{"events.order.>", "events.*.*.InvoiceRequested"},
		URL: "https://billing.example.com/hooks/orders", Secrets: []string{secretA, secretB},
		Scheme: webhook.SchemeStandard, Body: deliver.BodyStructured,
		Headers: map[string]string{"X-Team": "billing", "Authorization": "Bearer t0ken"},
		Timeout: 10 * time.Second, AckWait: 30 * time.Second, MaxDeliver: 10,
		BackOff:     []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute},
		MaxInFlight: 64, MaxAckPending: 1000,
	}, subs[0])
	require.Equal(t, []string{"audit-hmac-key"}, subs[1].Secrets)
	require.Equal(t, webhook.SchemeHMACSHA256, subs[1].Scheme)
	require.Equal(t, deliver.BodyBinary, subs[1].Body)
	for _, s := range subs {
		require.NoError(t, s.Validate())
	}
}

func TestLoadSubscriptionsRejectsUnknownFieldsByName(t *testing.T) {
	t.Parallel()
	for field, doc := range map[string]string{
		"alow_private": "subscriptions:\n  - name: a\n    url: https://h.example/\n    filter_subjects: [events.>]\n    alow_private: true\n",
		"open_timout":  "breaker:\n  open_timout: 1s\nsubscriptions:\n  - name: a\n    url: https://h.example/\n",
	} {
		path := filepath.Join(t.TempDir(), "subs.yaml")
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
		_, _, err := loadSubscriptions(path)
		require.ErrorContains(t, err, field)
	}
}

func TestLoadSubscriptionsNamesEmptySecretEnvWithoutValue(t *testing.T) {
	t.Setenv("EMPTY_SECRET", "")
	path := filepath.Join(t.TempDir(), "subs.yaml")
	require.NoError(t, os.WriteFile(path, []byte("subscriptions:\n  - name: a\n    url: https://h.example/\n    secrets_env: [EMPTY_SECRET]\n"), 0o600))
	_, _, err := loadSubscriptions(path)
	require.ErrorContains(t, err, "secrets_env: environment variable EMPTY_SECRET is empty")
}

// The README shows testdata/subscriptions.yaml as it is.
func TestREADMEShowsTheCompleteFile(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	file, err := os.ReadFile("testdata/subscriptions.yaml")
	require.NoError(t, err)
	require.Contains(t, string(readme), "```yaml\n"+string(file)+"```\n")
}
