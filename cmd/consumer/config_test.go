package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
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
	certFile, keyFile := writeCert(t, dir)
	path := filepath.Join(dir, "subs.yaml")
	require.NoError(t, os.WriteFile(path, []byte(strings.NewReplacer(
		"/run/secrets/audit_webhook", secretFile,
		"/run/secrets/audit_client.crt", certFile,
		"/run/secrets/audit_client.key", keyFile,
		"/etc/jsbridge/audit-ca.pem", certFile,
	).Replace(string(raw))), 0o600))

	subs, bs, err := loadSubscriptions(path)
	require.NoError(t, err)
	require.Equal(t, breaker.Settings{ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20, Interval: time.Minute,
		OpenTimeout: 30 * time.Second, HalfOpenProbes: 1}, bs)
	require.Len(t, subs, 2)
	require.Equal(t, consumer.Subscription{
		Name: "billing", FilterSubjects: []string{"events.order.>", "events.*.*.InvoiceRequested"},
		URL: "https://billing.example.com/hooks/orders", Secrets: []string{secretA, secretB},
		Scheme: webhook.SchemeStandard, Body: consumer.BodyStructured,
		Headers: map[string]string{"X-Team": "billing", "Authorization": "Bearer t0ken"},
		Timeout: 10 * time.Second, MaxDeliver: 10,
		BackOff:     []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute},
		MaxInFlight: 64, MaxAckPending: 1000, Ordering: consumer.OrderingStream, OnDeadLetter: consumer.DeadLetterPark,
		Start: consumer.Start{Policy: consumer.StartNew},
	}, subs[0])
	require.Equal(t, consumer.StartAtTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)), subs[1].Start)
	require.Equal(t, []string{"audit-hmac-key"}, subs[1].Secrets)
	require.Equal(t, webhook.SchemeHMACSHA256, subs[1].Scheme)
	require.Equal(t, consumer.BodyBinary, subs[1].Body)
	require.Equal(t, consumer.TLSFiles{ClientCertFile: certFile, ClientKeyFile: keyFile, CAFile: certFile}, subs[1].TLS)
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

// ack_wait and --ack-wait are deprecated: accepted whatever the timeout
// (a file of an earlier release loads, its value handed on for
// consumer.New's warning), and --ack-wait ignored with one warning
// naming the flag.
func TestAckWaitIsAcceptedAndIgnored(t *testing.T) {
	t.Parallel()
	f := subscriptionFlags{Name: "w", URL: "https://h.example/", Filter: []string{"events.>"}, Secret: []string{secretA},
		Timeout: 3 * time.Second, AckWait: 5 * time.Second, MaxDeliver: 10, BackOff: []time.Duration{time.Second}}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg, err := f.config(&Globals{}, log, prometheus.NewRegistry(), 1, 0)
	require.NoError(t, err)
	require.Zero(t, cfg.Subscriptions[0].AckWait, "not handed on")
	require.Equal(t, 1, strings.Count(logs.String(), "--ack-wait (JSBRIDGE_ACK_WAIT) is deprecated and ignored"), logs.String())

	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(secret, []byte(secretA+"\n"), 0o600))
	path := filepath.Join(dir, "subs.yaml")
	require.NoError(t, os.WriteFile(path, []byte("subscriptions:\n  - name: a\n    url: https://h.example/\n    filter_subjects: [events.>]\n"+
		"    secrets_file: ["+secret+"]\n    ack_wait: 15s\n"), 0o600))
	subs, _, err := loadSubscriptions(path)
	require.NoError(t, err, "a timeout of 10s above half of ack_wait 15s is no longer refused")
	require.Equal(t, 15*time.Second, subs[0].AckWait, "handed on: consumer.New warns, naming the subscription")
}

// docs/subscriptions.md shows testdata/subscriptions.yaml as it is.
func TestSubscriptionsDocShowsTheCompleteFile(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../docs/subscriptions.md")
	require.NoError(t, err)
	file, err := os.ReadFile("testdata/subscriptions.yaml")
	require.NoError(t, err)
	require.Contains(t, string(readme), "```yaml\n"+string(file)+"```\n")
}

// writeCert writes a self-signed client certificate and its key (PEM) to
// dir; the certificate also serves as a CA bundle.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jsbridge-consumer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

// TLS files are read at start; a missing one is named by its YAML key and
// path, and a certificate without its key is refused.
func TestLoadSubscriptionsTLSErrorsNameKeyAndPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, _ := writeCert(t, dir)
	missing := filepath.Join(dir, "missing.key")
	for want, block := range map[string]string{
		"tls.client_key_file: open " + missing:                     "client_cert_file: " + certFile + "\n      client_key_file: " + missing,
		"tls.ca_file: open " + missing:                             "ca_file: " + missing,
		"tls.client_cert_file and tls.client_key_file go together": "client_cert_file: " + certFile,
	} {
		path := filepath.Join(t.TempDir(), "subs.yaml")
		doc := "subscriptions:\n  - name: a\n    url: https://h.example/\n    filter_subjects: [events.>]\n    tls:\n      " + block + "\n"
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
		_, _, err := loadSubscriptions(path)
		require.ErrorContains(t, err, want)
		require.ErrorContains(t, err, `subscriptions[0] ("a")`)
	}
}

// The flag-configured subscription takes the TLS files by flag, and names
// the flag and the path when one cannot be read.
func TestFlagsTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	f := subscriptionFlags{Name: "w", URL: "https://h.example/", Filter: []string{"events.>"}, Secret: []string{secretA},
		TLSClientCert: certFile, TLSClientKey: keyFile, TLSCA: certFile}
	subs, _, err := f.subscriptions()
	require.NoError(t, err)
	require.Equal(t, consumer.TLSFiles{ClientCertFile: certFile, ClientKeyFile: keyFile, CAFile: certFile}, subs[0].TLS)
	require.NoError(t, subs[0].Validate())

	f.TLSCA = filepath.Join(dir, "nope.pem")
	_, _, err = f.subscriptions()
	require.ErrorContains(t, err, "--tls-ca: open "+f.TLSCA)
	f.TLSCA, f.TLSClientKey = "", ""
	_, _, err = f.subscriptions()
	require.ErrorContains(t, err, "--tls-client-cert and --tls-client-key go together")
}

// whsk_ secret keys come through secrets_env like whsec_ secrets and sign
// v1a; a whpk_ public key cannot sign (refused when the file is loaded),
// and the error does not echo it.
func TestSubscriptionSecretKeys(t *testing.T) {
	sk, pk, err := webhook.GenerateKeyPair()
	require.NoError(t, err)
	t.Setenv("SIGNING_KEY", sk)
	t.Setenv("PUBLIC_KEY", pk)
	for env, ok := range map[string]bool{"SIGNING_KEY": true, "PUBLIC_KEY": false} {
		path := filepath.Join(t.TempDir(), "subs.yaml")
		require.NoError(t, os.WriteFile(path, []byte("subscriptions:\n  - name: a\n    url: https://h.example/\n    filter_subjects: [events.>]\n    secrets_env: ["+env+"]\n"), 0o600))
		subs, _, err := loadSubscriptions(path)
		if ok {
			require.NoError(t, err)
			require.NoError(t, subs[0].Validate())
			continue
		}
		// Refused when the file is loaded, naming the file's entry.
		require.ErrorContains(t, err, `subscriptions[0] ("a")`)
		require.ErrorIs(t, err, webhook.ErrInvalidSecret)
		require.ErrorContains(t, err, "whpk_ public key")
		require.NotContains(t, err.Error(), strings.TrimPrefix(pk, "whpk_"))
	}
}
