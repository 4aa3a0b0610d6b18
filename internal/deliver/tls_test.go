package deliver_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

// pki is a CA and what it signed, as parsed certificates and as PEM files.
type pki struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// certFile is the CA certificate in PEM.
	certFile string
}

// newCA makes a self-signed CA named cn and writes its certificate to dir.
func newCA(t *testing.T, dir, cn string) pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	path := filepath.Join(dir, cn+".pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return pki{cert: cert, key: key, certFile: path}
}

// issue signs a leaf certificate for cn (a server for 127.0.0.1 when
// server, else a client) and writes it and its key to dir.
func (ca pki) issue(t *testing.T, dir, cn string, server bool) (pair tls.Certificate, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	certFile, keyFile = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	return pair, certFile, keyFile
}

// mtls is an endpoint that requires a client certificate of clientCA, and
// the files a subscription needs to reach it.
type mtls struct {
	srv *httptest.Server
	// serverCA signs the endpoint's certificate; clientCA the client's.
	serverCA, clientCA pki
	// clientCert, clientKey are the files of a certificate clientCA signed.
	clientCert, clientKey string
	// otherCA signed nothing the endpoint uses.
	otherCA pki

	mu  sync.Mutex
	cns []string // client certificate common names of the requests
}

func newMTLS(t *testing.T) *mtls {
	t.Helper()
	dir := t.TempDir()
	m := &mtls{serverCA: newCA(t, dir, "server-ca"), clientCA: newCA(t, dir, "client-ca"), otherCA: newCA(t, dir, "other-ca")}
	serverPair, _, _ := m.serverCA.issue(t, dir, "endpoint", true)
	_, m.clientCert, m.clientKey = m.clientCA.issue(t, dir, "jsbridge-consumer", false)
	pool := x509.NewCertPool()
	pool.AddCert(m.clientCA.cert)
	m.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.cns = append(m.cns, r.TLS.PeerCertificates[0].Subject.CommonName)
		m.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	m.srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverPair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	// The refused handshakes are the point of some tests, not noise.
	m.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	m.srv.StartTLS()
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mtls) requests() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.cns...)
}

// TestMutualTLSDelivers: with the client certificate and the CA bundle of
// the endpoint's certificate, the delivery succeeds and the endpoint sees
// the client certificate.
func TestMutualTLSDelivers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newMTLS(t)
	s := sub("orders", m.srv.URL+"/hook")
	s.TLS = subscription.TLSFiles{ClientCertFile: m.clientCert, ClientKeyFile: m.clientKey, CAFile: m.serverCA.certFile}
	b.run(t, deliver.Config{}, s)

	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	requireSettled(t, b, "orders", 1)
	require.Equal(t, []string{"jsbridge-consumer"}, m.requests())
}

// TestTLSFailuresAreRetried: without a client certificate, or with a CA
// bundle that does not hold the endpoint's CA, the handshake fails; that
// is retried (status class tls), nothing reaches the endpoint, and the
// last attempt is dead-lettered.
func TestTLSFailuresAreRetried(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	for name, files := range map[string]subscription.TLSFiles{
		"no client certificate": {CAFile: m.serverCA.certFile},
		"wrong CA":              {ClientCertFile: m.clientCert, ClientKeyFile: m.clientKey, CAFile: m.otherCA.certFile},
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			reg := prometheus.NewRegistry()
			dl := &deadLetters{}
			s := sub("orders", m.srv.URL)
			s.TLS = files
			s.MaxDeliver = 2
			b.run(t, deliver.Config{Registerer: reg, DeadLetters: dl}, s)

			b.publish(t, 5, "order-5", "OrderPlaced", `{}`)
			requireSettled(t, b, "orders", 1)
			got := dl.list()
			require.Len(t, got, 1)
			require.Equal(t, 2, got[0].Attempt, "retried once, then dead-lettered")
			require.Zero(t, got[0].Status)
			require.Contains(t, got[0].Reason, "tls")
			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_consumer_deliveries_total Webhook delivery attempts by subscription, outcome (ack, retry, term, exhausted, breaker_open) and status class (2xx..5xx, timeout, network, tls, forbidden, none).
# TYPE jsbridge_consumer_deliveries_total counter
jsbridge_consumer_deliveries_total{outcome="exhausted",status_class="tls",subscription="orders"} 1
jsbridge_consumer_deliveries_total{outcome="retry",status_class="tls",subscription="orders"} 1
`), "jsbridge_consumer_deliveries_total"))
			require.Empty(t, m.requests(), "no request got through")
		})
	}
}

// TestTLSKeepsTheAddressCheck: TLS files give a subscription its own
// transport; without AllowPrivate it still refuses a loopback endpoint at
// dial time (a name, so Validate cannot see it), with no request sent.
func TestTLSKeepsTheAddressCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newMTLS(t)
	dl := &deadLetters{}
	s := sub("orders", strings.Replace(m.srv.URL, "127.0.0.1", "localhost", 1))
	s.AllowPrivate = false
	s.TLS = subscription.TLSFiles{ClientCertFile: m.clientCert, ClientKeyFile: m.clientKey, CAFile: m.serverCA.certFile}
	b.run(t, deliver.Config{DeadLetters: dl}, s)

	b.publish(t, 3, "order-3", "OrderPlaced", `{}`)
	requireSettled(t, b, "orders", 1)
	got := dl.list()
	require.Len(t, got, 1)
	require.Contains(t, got[0].Reason, "not allowed")
	require.Empty(t, m.requests())
}

// TestTLSFilesErrorsNameFieldAndPath: a missing or unusable file is an
// error at start naming the field and the path.
func TestTLSFilesErrorsNameFieldAndPath(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	for name, tc := range map[string]struct {
		files subscription.TLSFiles
		want  []string
	}{
		"cert without key": {subscription.TLSFiles{ClientCertFile: m.clientCert}, []string{"TLS.ClientCertFile and TLS.ClientKeyFile"}},
		"missing cert":     {subscription.TLSFiles{ClientCertFile: missing, ClientKeyFile: m.clientKey}, []string{"TLS.ClientCertFile", missing}},
		"missing key":      {subscription.TLSFiles{ClientCertFile: m.clientCert, ClientKeyFile: missing}, []string{"TLS.ClientKeyFile", missing}},
		"key of another":   {subscription.TLSFiles{ClientCertFile: m.clientCert, ClientKeyFile: m.otherKey(t)}, []string{"TLS.ClientCertFile", m.clientCert}},
		"missing CA":       {subscription.TLSFiles{CAFile: missing}, []string{"TLS.CAFile", missing}},
		"CA not PEM":       {subscription.TLSFiles{CAFile: notPEM}, []string{"TLS.CAFile", notPEM, "no PEM certificate"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := sub("orders", "https://hooks.example/in")
			s.TLS = tc.files
			err := s.Validate()
			require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	s := sub("orders", "http://hooks.example/in")
	s.TLS = subscription.TLSFiles{CAFile: m.serverCA.certFile}
	require.ErrorContains(t, s.Validate(), "TLS: set for")
}

// otherKey writes a key that belongs to no certificate of m.
func (m *mtls) otherKey(t *testing.T) string {
	t.Helper()
	_, _, keyFile := m.otherCA.issue(t, t.TempDir(), "stranger", false)
	return keyFile
}

// TestV1aSignedDelivery: a subscription whose secrets are a whsec_ secret
// and a whsk_ ed25519 key sends both a v1 and a v1a signature; a receiver
// holding only the whpk_ public key verifies it.
func TestV1aSignedDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusNoContent))
	sk, pk, err := webhook.GenerateKeyPair()
	require.NoError(t, err)
	s := sub("orders", rc.URL)
	s.Secrets = []string{secret, sk}
	b.run(t, deliver.Config{}, s)

	b.publish(t, 8, "order-8", "OrderPlaced", `{"total":1}`)
	got := rc.waitFor(t, 1)[0]
	requireSettled(t, b, "orders", 1)
	entries := strings.Fields(got.header.Get(webhook.HeaderWebhookSignature))
	require.Len(t, entries, 2)
	require.True(t, strings.HasPrefix(entries[1], "v1a,"), entries[1])
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{pk})
	require.NoError(t, err)
	require.NoError(t, v.Verify(got.header, got.body))
}
