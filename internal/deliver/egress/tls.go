package egress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
)

// TLSFiles configures the client side of a subscription's TLS connections:
// a client certificate for endpoints that require one (mutual TLS) and the
// CAs that verify the endpoint's certificate. The files are PEM and are
// read once, when the subscription is validated and when its client is built; a later change needs a
// restart. The zero value uses no client certificate and the system roots.
type TLSFiles struct {
	// ClientCertFile is the client certificate chain presented to the
	// endpoint, leaf first. Set with ClientKeyFile or not at all.
	ClientCertFile string
	// ClientKeyFile is the private key of ClientCertFile (PKCS #1, PKCS #8
	// or SEC 1).
	ClientKeyFile string
	// CAFile is a bundle of CA certificates that verify the endpoint's
	// certificate, in place of the system roots. Default "": system roots.
	CAFile string
}

// IsZero reports whether f configures nothing.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// Load reads the files into a TLS client configuration: nil when f is
// zero. Errors name the field (as the subscription's Go field, TLS.…) and
// the path, never key material.
func (f TLSFiles) Load() (*tls.Config, error) {
	if f.IsZero() {
		return nil, nil
	}
	if (f.ClientCertFile == "") != (f.ClientKeyFile == "") {
		return nil, errors.New("TLS.ClientCertFile and TLS.ClientKeyFile go together: set both or neither")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ClientCertFile != "" {
		certPEM, err := os.ReadFile(f.ClientCertFile)
		if err != nil {
			return nil, fmt.Errorf("TLS.ClientCertFile: %w", err)
		}
		keyPEM, err := os.ReadFile(f.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS.ClientKeyFile: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("TLS.ClientCertFile %q with TLS.ClientKeyFile %q: %w", f.ClientCertFile, f.ClientKeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if f.CAFile != "" {
		caPEM, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS.CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("TLS.CAFile %q: no PEM certificate in it", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// WithTLS returns a copy of c whose transport uses cfg's client
// certificates and roots (over the transport's own TLS settings). It needs
// an *http.Transport (nil: a clone of http.DefaultTransport). The copy has
// its own connection pool, so connections with a client certificate are
// never shared with another subscription's.
func WithTLS(c *http.Client, cfg *tls.Config) (*http.Client, error) {
	t, err := transportOf(c, "TLS files cannot be applied")
	if err != nil {
		return nil, err
	}
	tc := t.TLSClientConfig.Clone()
	if tc == nil {
		tc = &tls.Config{}
	}
	tc.MinVersion = max(tc.MinVersion, cfg.MinVersion)
	if cfg.Certificates != nil {
		tc.Certificates = cfg.Certificates
	}
	if cfg.RootCAs != nil {
		tc.RootCAs = cfg.RootCAs
	}
	t.TLSClientConfig = tc
	out := *c
	out.Transport = t
	return &out, nil
}

// IsTLSError reports whether err comes from the TLS layer: a handshake the
// endpoint refused (an alert, e.g. no or an unknown client certificate), a
// certificate this side could not verify (unknown authority, wrong name,
// expired), or a peer that does not speak TLS. crypto/tls reports a remote
// alert as an unexported type inside a *net.OpError, so the chain is
// searched for any error type of packages crypto/tls and crypto/x509.
func IsTLSError(err error) bool {
	for err != nil {
		t := reflect.TypeOf(err)
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if p := t.PkgPath(); p == "crypto/tls" || p == "crypto/x509" {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if IsTLSError(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
