// Package natsconntest starts JetStream servers that require one way of
// authenticating (user and password, token, NKey, credentials file, TLS
// client certificate), with natsconn flags that pass and flags the server
// refuses: for the tests of natsconn and of the binaries' NATS flags.
package natsconntest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/jsbridge/jsbridge/internal/natsconn"
)

// Secured is a running JetStream server that requires one way of
// authenticating, with client flags that pass and flags that the server
// refuses. Secrets lists what must never appear in a client's output
// (passwords, tokens, seeds, key material).
type Secured struct {
	URL     string
	Good    natsconn.Flags
	Bad     natsconn.Flags
	Secrets []string
}

// StartUserPassword starts a server requiring user "app" with a random
// password; Bad has the wrong password.
func StartUserPassword(t testing.TB) Secured {
	t.Helper()
	password := "pw-" + rand.Text()
	url := startSecured(t, func(o *server.Options) { o.Username, o.Password = "app", password })
	return Secured{
		URL:     url,
		Good:    natsconn.Flags{User: "app", Password: password},
		Bad:     natsconn.Flags{User: "app", Password: "wrong-" + password},
		Secrets: []string{password},
	}
}

// StartToken starts a server requiring a random token; Bad has another.
func StartToken(t testing.TB) Secured {
	t.Helper()
	token := "tok-" + rand.Text()
	url := startSecured(t, func(o *server.Options) { o.Authorization = token })
	return Secured{
		URL:     url,
		Good:    natsconn.Flags{Token: token},
		Bad:     natsconn.Flags{Token: "wrong-" + token},
		Secrets: []string{token},
	}
}

// StartNKey starts a server trusting one NKey user; Good names a file with
// its seed, Bad a file with another user's seed.
func StartNKey(t testing.TB) Secured {
	t.Helper()
	dir := t.TempDir()
	good, goodSeed := newSeedFile(t, filepath.Join(dir, "good.nk"))
	_, badSeed := newSeedFile(t, filepath.Join(dir, "bad.nk"))
	pub, err := good.PublicKey()
	must(t, err)
	url := startSecured(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	return Secured{
		URL:     url,
		Good:    natsconn.Flags{NKey: filepath.Join(dir, "good.nk")},
		Bad:     natsconn.Flags{NKey: filepath.Join(dir, "bad.nk")},
		Secrets: []string{goodSeed, badSeed},
	}
}

// StartCreds starts a server in operator mode (memory resolver) with one
// JetStream-enabled account; Good names a credentials file of a user of
// that account, Bad one signed by an account the server does not know.
func StartCreds(t testing.TB) Secured {
	t.Helper()
	dir := t.TempDir()
	op, err := nkeys.CreateOperator()
	must(t, err)
	opPub, err := op.PublicKey()
	must(t, err)
	// JetStream in operator mode needs a system account.
	_, sysPub, sysJWT := newAccount(t, op, false)
	opClaims := jwt.NewOperatorClaims(opPub)
	opClaims.SystemAccount = sysPub
	opJWT, err := opClaims.Encode(op)
	must(t, err)
	opClaims, err = jwt.DecodeOperatorClaims(opJWT)
	must(t, err)

	acc, accPub, accJWT := newAccount(t, op, true)
	stranger, _, _ := newAccount(t, op, true) // never stored: the server does not know its users

	resolver := &server.MemAccResolver{}
	must(t, resolver.Store(accPub, accJWT))
	must(t, resolver.Store(sysPub, sysJWT))
	url := startSecured(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{opClaims}
		o.AccountResolver = resolver
		o.SystemAccount = sysPub
	})
	goodSecret := writeCreds(t, acc, filepath.Join(dir, "good.creds"))
	badSecret := writeCreds(t, stranger, filepath.Join(dir, "bad.creds"))
	return Secured{
		URL:     url,
		Good:    natsconn.Flags{Creds: filepath.Join(dir, "good.creds")},
		Bad:     natsconn.Flags{Creds: filepath.Join(dir, "bad.creds")},
		Secrets: []string{goodSecret, badSecret},
	}
}

// StartTLS starts a server with TLS that verifies client certificates
// against its own CA. Good trusts that CA and presents a certificate it
// signed; Bad presents one signed by another CA.
func StartTLS(t testing.TB) Secured {
	t.Helper()
	return startTLS(t, false)
}

// StartTLSFirst is StartTLS with a server that expects the TLS handshake
// before its greeting (handshake_first); Good and Bad set TLSFirst.
func StartTLSFirst(t testing.TB) Secured {
	t.Helper()
	return startTLS(t, true)
}

func startTLS(t testing.TB, first bool) Secured {
	t.Helper()
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	ca, caKey := newCA(t, "jsbridge test CA", path("ca.pem"))
	other, otherKey := newCA(t, "another CA", path("other-ca.pem"))
	serverKeyPEM := newCert(t, ca, caKey, false, path("server.pem"), path("server-key.pem"))
	goodKeyPEM := newCert(t, ca, caKey, true, path("client.pem"), path("client-key.pem"))
	badKeyPEM := newCert(t, other, otherKey, true, path("bad.pem"), path("bad-key.pem"))

	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: path("server.pem"), KeyFile: path("server-key.pem"), CaFile: path("ca.pem"), Verify: true,
	})
	must(t, err)
	url := startSecured(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, true, cfg, 5
		o.TLSHandshakeFirst = first
	})
	return Secured{
		URL:     url,
		Good:    natsconn.Flags{TLSCA: path("ca.pem"), TLSCert: path("client.pem"), TLSKey: path("client-key.pem"), TLSFirst: first},
		Bad:     natsconn.Flags{TLSCA: path("ca.pem"), TLSCert: path("bad.pem"), TLSKey: path("bad-key.pem"), TLSFirst: first},
		Secrets: []string{serverKeyPEM, goodKeyPEM, badKeyPEM},
	}
}

// Args returns f as the binaries' command-line flags.
func Args(f natsconn.Flags) []string {
	var args []string
	for _, kv := range [][2]string{
		{"--context", f.Context}, {"--nats-user", f.User}, {"--nats-password", f.Password}, {"--nats-token", f.Token},
		{"--nats-nkey", f.NKey}, {"--nats-creds", f.Creds},
		{"--nats-tls-ca", f.TLSCA}, {"--nats-tls-cert", f.TLSCert}, {"--nats-tls-key", f.TLSKey},
	} {
		if kv[1] != "" {
			args = append(args, kv[0], kv[1])
		}
	}
	if f.TLSFirst {
		args = append(args, "--nats-tls-first")
	}
	return args
}

// startSecured starts a JetStream server on a random loopback port with
// secure applied to its options, shut down at cleanup; it returns the
// client URL.
func startSecured(t testing.TB, secure func(*server.Options)) string {
	t.Helper()
	opts := &server.Options{
		ServerName: "jsbridge-secured", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
	}
	secure(opts)
	srv, err := server.NewServer(opts)
	must(t, err)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("natsconntest: secured server not ready within 10s")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL()
}

func newSeedFile(t testing.TB, path string) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	must(t, err)
	seed, err := kp.Seed()
	must(t, err)
	must(t, os.WriteFile(path, append(seed, '\n'), 0o600))
	return kp, string(seed)
}

// newAccount returns an account key signed by op (with JetStream enabled
// without limits when js), its public key and JWT.
func newAccount(t testing.TB, op nkeys.KeyPair, js bool) (nkeys.KeyPair, string, string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	must(t, err)
	pub, err := kp.PublicKey()
	must(t, err)
	claims := jwt.NewAccountClaims(pub)
	if js {
		claims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	token, err := claims.Encode(op)
	must(t, err)
	return kp, pub, token
}

// writeCreds writes a credentials file of a new user of acc to path and
// returns the user's seed.
func writeCreds(t testing.TB, acc nkeys.KeyPair, path string) string {
	t.Helper()
	user, err := nkeys.CreateUser()
	must(t, err)
	pub, err := user.PublicKey()
	must(t, err)
	token, err := jwt.NewUserClaims(pub).Encode(acc)
	must(t, err)
	seed, err := user.Seed()
	must(t, err)
	creds, err := jwt.FormatUserConfig(token, seed)
	must(t, err)
	must(t, os.WriteFile(path, creds, 0o600))
	return string(seed)
}

func newCA(t testing.TB, name, certPath string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	must(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	return cert, key
}

// newCert writes a certificate signed by ca (a client certificate, or a
// server one for 127.0.0.1 and localhost) and its key; it returns the
// first line of the key's base64, to look for in output.
func newCert(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, client bool, certPath, keyPath string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "jsbridge test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	must(t, err)
	must(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	keyDER, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	must(t, os.WriteFile(keyPath, keyPEM, 0o600))
	_, err = tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM)
	must(t, err)
	return strings.Split(string(keyPEM), "\n")[1]
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("natsconntest: %v", err)
	}
}
