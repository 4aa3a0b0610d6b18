package startup

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSOptions are the connection options both binaries use: the client
// name, reconnecting forever at run time (a restarted or re-elected server
// is waited for, never fatal), also after an authorization error on
// reconnect (credentials can be fixed on the server side; /readyz shows the
// error meanwhile), and a log line when the connection drops and comes
// back. log nil: discard.
func NATSOptions(log *slog.Logger, name string) []nats.Option {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.IgnoreAuthErrorAbort(),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS connection lost; reconnecting", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", "nats_url", RedactURL(nc.ConnectedUrl()))
		}),
	}
}

// ConnectNATS connects to the NATS server(s) at urls (comma-separated),
// waiting with w until one answers. An authorization failure or a TLS
// misconfiguration is permanent; a server that is down, refusing or slow
// is waited for. ctx ending (SIGTERM) stops the wait.
//
// The wait is ours rather than nats.go's RetryOnFailedConnect: that option
// returns a connection at once and reports the refused credentials only
// through callbacks after two attempts, while start-up needs to tell "not
// up yet" (wait, log each attempt) from "refused" (exit, say why).
func ConnectNATS(ctx context.Context, w *Waiter, urls string, opts ...nats.Option) (*nats.Conn, error) {
	var nc *nats.Conn
	err := w.For(ctx, "NATS at "+RedactURL(urls), func(ctx context.Context) error {
		c, err := connect(ctx, urls, opts)
		if err != nil {
			if NATSPermanent(err) {
				return Permanent(fmt.Errorf("connect to NATS at %s: %w (the server refused this client: %s)", RedactURL(urls), err, refusedHint(err)))
			}
			return err
		}
		if err := CheckServerVersion(c.ConnectedServerVersion()); err != nil {
			c.Close()
			return Permanent(fmt.Errorf("connect to NATS at %s: %w", RedactURL(urls), err))
		}
		nc = c
		return nil
	})
	return nc, err
}

// MinServerMajor and MinServerMinor are the oldest nats-server release
// both binaries accept, 2.14: the bridge publishes fast batches (a stream
// with allow_batched, new in 2.14), and the ordered consumer updates its
// partition consumers' priority groups (pinned_client) in place, which
// 2.14's consumer update takes.
const (
	MinServerMajor = 2
	MinServerMinor = 14
)

// ErrServerTooOld is wrapped by CheckServerVersion's error for a server
// older than MinServerMajor.MinServerMinor.
var ErrServerTooOld = errors.New("nats-server too old")

// CheckServerVersion returns nil when version (a server's INFO version,
// "2.15.2", "v2.14.0-RC.1") is MinServerMajor.MinServerMinor or later,
// and otherwise an error wrapping ErrServerTooOld that names the server's
// version and the required one. A version that cannot be read is an error
// too: the server is not one jsbridge knows to work with.
func CheckServerVersion(version string) error {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	ma, mi := -1, -1
	if len(parts) >= 2 {
		var err1, err2 error
		ma, err1 = strconv.Atoi(parts[0])
		mi, err2 = strconv.Atoi(parts[1])
		if err1 != nil || err2 != nil {
			ma, mi = -1, -1
		}
	}
	if ma > MinServerMajor || ma == MinServerMajor && mi >= MinServerMinor {
		return nil
	}
	return fmt.Errorf("%w: the server runs nats-server %q; jsbridge needs %d.%d or later "+
		"(fast batch publishing, priority groups updated in place): upgrade the server",
		ErrServerTooOld, version, MinServerMajor, MinServerMinor)
}

// refusedHint says which settings to check for a permanent connect error.
func refusedHint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	var badCert x509.CertificateInvalidError
	var opErr *net.OpError
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &badHost), errors.As(err, &badCert):
		return "its certificate is not trusted: check --nats-tls-ca and the host name in the URL"
	case errors.Is(err, nats.ErrTLS), errors.As(err, &opErr) && opErr.Op == "remote error":
		return "it did not accept the TLS connection: check --nats-tls-cert and --nats-tls-key (a client certificate it trusts), --nats-tls-ca and --nats-tls-first"
	case errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted):
		return "TLS is required on one side only: check the URL scheme (tls://) and the --nats-tls-* flags"
	}
	return "check the credentials: --nats-user/--nats-password, --nats-token, --nats-nkey, --nats-creds, the --context, or user:password@ in --nats-url"
}

// connect is nats.Connect that gives up when ctx ends (it has no context of
// its own; one attempt is bounded by its dial timeout per server).
func connect(ctx context.Context, urls string, opts []nats.Option) (*nats.Conn, error) {
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(urls, opts...)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		return r.nc, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// NATSPermanent reports whether err, from connecting to NATS or from a
// request over the connection, is one waiting cannot fix: the server
// refused the credentials (authorization violation, expired or revoked),
// denied a subject by permissions, or the TLS configuration does not match
// the server's (certificate not trusted, TLS required or unavailable, or
// the TLS handshake failed: nats.ErrTLS, or a TLS alert from the server;
// a server that rejects the client certificate shows as either). A TLS
// handshake that timed out is transient.
func NATSPermanent(err error) bool {
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	var badCert x509.CertificateInvalidError
	var netErr net.Error
	if errors.Is(err, nats.ErrTLS) && !(errors.As(err, &netErr) && netErr.Timeout()) {
		return true
	}
	// crypto/tls reports a TLS alert from the server (certificate
	// required, bad certificate, unknown CA, ...) as an OpError with this
	// Op; with TLS 1.3 it can arrive after the handshake, unwrapped.
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "remote error" {
		return true
	}
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		errors.Is(err, nats.ErrPermissionViolation) ||
		errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted) ||
		errors.As(err, &unknownCA) || errors.As(err, &badHost) || errors.As(err, &badCert)
}

// transient400 are the JetStream API errors with status 400 that a cluster
// still forming (or changing) answers and that go away by themselves.
var transient400 = map[jetstream.ErrorCode]bool{
	10005: true, // no suitable peers for placement (peers not up yet)
	10040: true, // peer not a member
	10044: true, // server is not a member of the cluster
	10124: true, // stream move already in progress
	10202: true, // cluster member change is in progress
	10226: true, // stream reconfiguration already in progress
}

// JetStreamPermanent reports whether err, from creating or looking up a
// JetStream stream or consumer, is one waiting cannot fix: a NATS
// permanent error (NATSPermanent), or a JetStream API error for a request
// the server will refuse again (status 400, such as "subjects overlap with
// an existing stream", "stream name already in use with a different
// configuration", an invalid consumer configuration, an account limit;
// 10052 invalid stream configuration; 10074 replicas > 1 on a server that
// is not clustered), except the 400s of a cluster still forming. A stream
// not found, JetStream not enabled or not available yet (no responders, no
// meta leader, 503), a timeout or a lost connection are transient.
func JetStreamPermanent(err error) bool {
	if NATSPermanent(err) {
		return true
	}
	var api *jetstream.APIError
	if !errors.As(err, &api) || api == nil {
		return false
	}
	switch {
	case api.Code == 400:
		return !transient400[api.ErrorCode]
	case api.ErrorCode == 10052, api.ErrorCode == 10074:
		return true
	}
	return false
}

// RedactURL returns urls (comma-separated) without their userinfo
// (user:password@ or token@), for logs and errors.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		u, err := url.Parse(p)
		if err != nil || u.Host == "" {
			if at := strings.LastIndex(p, "@"); at >= 0 {
				p = p[at+1:]
			}
			parts[i] = p
			continue
		}
		u.User = nil
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// JetStreamErr returns err marked Permanent when JetStreamPermanent says
// waiting cannot fix it, else err unchanged (nil stays nil): for the
// JetStream steps run by Waiter.For.
func JetStreamErr(err error) error {
	if err != nil && JetStreamPermanent(err) {
		return Permanent(err)
	}
	return err
}

// JetStreamRef holds a binary's JetStream context once it is connected, so
// that readiness checks registered before (the ops port starts first) can
// use it. The zero value holds none.
type JetStreamRef struct {
	mu sync.Mutex
	js jetstream.JetStream
}

// Set stores js.
func (r *JetStreamRef) Set(js jetstream.JetStream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.js = js
}

// StreamCheck returns a readiness check (an ops.Check) that the JetStream
// stream exists: "not connected to NATS yet" before Set, else the error of
// looking the stream up (nil when it exists).
func (r *JetStreamRef) StreamCheck(stream string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		r.mu.Lock()
		js := r.js
		r.mu.Unlock()
		if js == nil {
			return errors.New("not connected to NATS yet")
		}
		_, err := js.Stream(ctx, stream)
		return err
	}
}
