// Package natsconn turns the NATS connection flags both binaries take
// (user/password, token, NKey seed file, credentials file, TLS, the
// JetStream domain or API prefix, and the nats CLI's saved contexts) into
// nats.go options and a JetStream context, in one place.
//
// Secrets (password, token, seed, credentials) never appear in what this
// package returns besides the options themselves: errors name the flag,
// the context and the file path, never a value read from them.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Flags are the NATS connection flags of both binaries (embedded in their
// command-line structs; kong reads the tags). The server URL(s) stay a flag
// of each binary, since their defaults differ. Environment fallbacks use
// the nats CLI's variable names where it has one, so a shell set up for
// `nats` sets up jsbridge too.
type Flags struct {
	Context  string `name:"context" env:"NATS_CONTEXT" placeholder:"NAME" help:"Read the NATS URL, credentials and TLS files from the nats CLI context NAME ($XDG_CONFIG_HOME/nats/context/NAME.json, by default ~/.config/nats/...) or from a context file given by path; --nats-url and the --nats-* flags override its values."`
	User     string `name:"nats-user" env:"NATS_USER" help:"NATS user name (with --nats-password)."`
	Password string `name:"nats-password" env:"NATS_PASSWORD" help:"NATS password of --nats-user; prefer the environment variable, a flag is visible in the process list."`
	Token    string `name:"nats-token" env:"NATS_TOKEN" help:"NATS authentication token; prefer the environment variable, a flag is visible in the process list."`
	NKey     string `name:"nats-nkey" env:"NATS_NKEY" placeholder:"FILE" help:"File holding the NATS user's NKey seed (SU...)."`
	Creds    string `name:"nats-creds" env:"NATS_CREDS" placeholder:"FILE" help:"NATS credentials file (user JWT and NKey seed, as nsc writes it)."`
	TLSCA    string `name:"nats-tls-ca" env:"NATS_CA" placeholder:"FILE" help:"PEM file of the CA certificate(s) that signed the NATS server's certificate (default: the system's roots)."`
	TLSCert  string `name:"nats-tls-cert" env:"NATS_CERT" placeholder:"FILE" help:"PEM client certificate for NATS servers that verify clients (with --nats-tls-key)."`
	TLSKey   string `name:"nats-tls-key" env:"NATS_KEY" placeholder:"FILE" help:"PEM private key of --nats-tls-cert."`
	TLSFirst bool   `name:"nats-tls-first" env:"JSBRIDGE_NATS_TLS_FIRST" help:"Start TLS before the NATS greeting (servers with handshake_first, e.g. behind a TLS proxy)."`
	// JetStream's API location: a domain (leaf nodes, hub and spoke) or
	// an API prefix (an account importing another's JetStream).
	JSDomain    string `name:"js-domain" env:"JSBRIDGE_JS_DOMAIN" placeholder:"DOMAIN" help:"JetStream domain whose streams to use ($JS.DOMAIN.API), e.g. a leaf node's or the hub's; overrides the --context's jetstream_domain (default: the local JetStream)."`
	JSAPIPrefix string `name:"js-api-prefix" env:"JSBRIDGE_JS_API_PREFIX" placeholder:"PREFIX" help:"Subject prefix of the JetStream API, for an account that imports another's JetStream (instead of $JS.API); overrides the --context's jetstream_api_prefix; not with --js-domain (default: $JS.API)."`
}

// Settings are resolved connection settings: where to connect and the
// nats.go options that authenticate and secure the connection.
type Settings struct {
	// URL is the server URL(s), comma-separated: --nats-url, else the
	// context's url, else "" (the caller applies its default).
	URL string
	// Auth names how the client authenticates, for the start-up log line:
	// "user/password", "token", "nkey", "creds" or "none". Never a secret.
	Auth string
	// TLS reports whether the connection uses TLS: a CA, a client
	// certificate or --nats-tls-first is set, or a URL is tls://. (A
	// server that requires TLS gets it from nats.go in any case.)
	TLS bool
	// JSDomain is the JetStream domain (--js-domain, else the context's
	// jetstream_domain); "" for the local JetStream.
	JSDomain string
	// JSAPIPrefix is the JetStream API prefix (--js-api-prefix, else the
	// context's jetstream_api_prefix); "" for $JS.API. Never set with
	// JSDomain.
	JSAPIPrefix string

	opts []nats.Option
}

// Options returns the nats.go options for s, to append to the caller's.
func (s Settings) Options() []nats.Option { return s.opts }

// JetStream returns the JetStream context of nc at s's domain or API
// prefix (the local JetStream when neither is set), with opts.
func (s Settings) JetStream(nc *nats.Conn, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	switch {
	case s.JSDomain != "":
		return jetstream.NewWithDomain(nc, s.JSDomain, opts...)
	case s.JSAPIPrefix != "":
		return jetstream.NewWithAPIPrefix(nc, s.JSAPIPrefix, opts...)
	}
	return jetstream.New(nc, opts...)
}

// JetStreamAPI names where s reaches JetStream, for the start-up log
// line: "$JS.<domain>.API", the API prefix, or "$JS.API".
func (s Settings) JetStreamAPI() string {
	switch {
	case s.JSDomain != "":
		return "$JS." + s.JSDomain + ".API"
	case s.JSAPIPrefix != "":
		return s.JSAPIPrefix
	}
	return "$JS.API"
}

// Given returns the flags (as --name) set on the command line or through
// their environment variables, for refusing them where they cannot apply.
func (f Flags) Given() []string {
	var given []string
	for _, v := range []struct {
		name string
		set  bool
	}{
		{"--context", f.Context != ""}, {"--nats-user", f.User != ""}, {"--nats-password", f.Password != ""},
		{"--nats-token", f.Token != ""}, {"--nats-nkey", f.NKey != ""}, {"--nats-creds", f.Creds != ""},
		{"--nats-tls-ca", f.TLSCA != ""}, {"--nats-tls-cert", f.TLSCert != ""}, {"--nats-tls-key", f.TLSKey != ""},
		{"--nats-tls-first", f.TLSFirst}, {"--js-domain", f.JSDomain != ""}, {"--js-api-prefix", f.JSAPIPrefix != ""},
	} {
		if v.set {
			given = append(given, v.name)
		}
	}
	return given
}

// value is one setting and where it came from ("--nats-creds" or
// `--context "prod" (path) field creds`), for error messages.
type value struct{ v, from string }

// Resolve merges the flags with the context named by --context (if any):
// urlFlag (the binary's --nats-url, "" when not given) and every --nats-*
// flag override the context's value; --js-domain or --js-api-prefix
// replaces the context's JetStream domain and API prefix both. Authentication is one method: when
// any of --nats-user, --nats-token, --nats-nkey or --nats-creds is given,
// the context's authentication is not used at all (--nats-password alone
// keeps the context's user).
//
// It reads and checks every file now, so that a missing, unreadable or
// malformed file stops the process at start with an error naming the flag
// (or context field) and the path. Errors never contain a secret.
func (f Flags) Resolve(urlFlag string) (Settings, error) {
	var c natsContext
	fromCtx := func(string) string { return "" }
	if f.Context != "" {
		lc, path, err := loadContext(f.Context)
		if err != nil {
			return Settings{}, err
		}
		c = *lc
		fromCtx = func(field string) string { return fmt.Sprintf("--context %q (%s) field %s", f.Context, path, field) }
	}
	pick := func(flagVal, flagName, ctxVal, field string) value {
		if flagVal != "" {
			return value{flagVal, flagName}
		}
		if ctxVal != "" {
			return value{ctxVal, fromCtx(field)}
		}
		return value{}
	}

	s := Settings{URL: strings.TrimSpace(urlFlag), Auth: "none"}
	if s.URL == "" {
		s.URL = strings.TrimSpace(c.URL)
	}

	// Authentication: the flags' method if any flag gives one, else the
	// context's.
	user, password := value{f.User, "--nats-user"}, value{f.Password, "--nats-password"}
	token, nkey, creds := value{f.Token, "--nats-token"}, value{f.NKey, "--nats-nkey"}, value{f.Creds, "--nats-creds"}
	switch {
	case f.User == "" && f.Password == "" && f.Token == "" && f.NKey == "" && f.Creds == "":
		user, password = value{c.User, fromCtx("user")}, value{c.Password, fromCtx("password")}
		token, nkey, creds = value{c.Token, fromCtx("token")}, value{c.NKey, fromCtx("nkey")}, value{c.Creds, fromCtx("creds")}
	case f.User == "" && f.Password != "" && c.User != "":
		// --nats-password alone replaces the context user's password.
		user = value{c.User, fromCtx("user")}
	}
	if err := s.addAuth(user, password, token, nkey, creds); err != nil {
		return Settings{}, err
	}

	ca := pick(f.TLSCA, "--nats-tls-ca", c.CA, "ca")
	cert := pick(f.TLSCert, "--nats-tls-cert", c.Cert, "cert")
	key := pick(f.TLSKey, "--nats-tls-key", c.Key, "key")
	if err := s.addTLS(ca, cert, key, f.TLSFirst || c.TLSFirst); err != nil {
		return Settings{}, err
	}
	for _, u := range strings.Split(s.URL, ",") {
		s.TLS = s.TLS || strings.HasPrefix(strings.ToLower(strings.TrimSpace(u)), "tls://")
	}
	// JetStream's API: the flags' if any is given, else the context's.
	domain := pick(f.JSDomain, "--js-domain", c.JSDomain, "jetstream_domain")
	prefix := pick(f.JSAPIPrefix, "--js-api-prefix", c.JSAPIPrefix, "jetstream_api_prefix")
	if f.JSDomain != "" || f.JSAPIPrefix != "" {
		domain, prefix = value{f.JSDomain, "--js-domain"}, value{f.JSAPIPrefix, "--js-api-prefix"}
	}
	if err := s.addJetStream(domain, prefix); err != nil {
		return Settings{}, err
	}
	if c.InboxPrefix != "" {
		s.opts = append(s.opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	return s, nil
}

// addJetStream sets the JetStream domain or API prefix given, refusing
// both at once and values that cannot be subject tokens.
func (s *Settings) addJetStream(domain, prefix value) error {
	domain.v, prefix.v = strings.TrimSpace(domain.v), strings.TrimSuffix(strings.TrimSpace(prefix.v), ".")
	if domain.v != "" && prefix.v != "" {
		return fmt.Errorf("%s and %s: give a JetStream domain or an API prefix, not both", domain.from, prefix.from)
	}
	if domain.v != "" && strings.ContainsAny(domain.v, ".*> \t") {
		return fmt.Errorf("%s %q: a JetStream domain is one subject token (no '.', '*', '>' or spaces)", domain.from, domain.v)
	}
	if prefix.v != "" && strings.ContainsAny(prefix.v, "*> \t") {
		return fmt.Errorf("%s %q: a JetStream API prefix is a subject without wildcards or spaces", prefix.from, prefix.v)
	}
	s.JSDomain, s.JSAPIPrefix = domain.v, prefix.v
	return nil
}

// addAuth adds the one authentication method given.
func (s *Settings) addAuth(user, password, token, nkey, creds value) error {
	var methods []string
	for _, v := range []value{user, token, nkey, creds} {
		if v.v != "" {
			methods = append(methods, v.from)
		}
	}
	if len(methods) > 1 {
		return fmt.Errorf("%s: give one way to authenticate to NATS, not several", strings.Join(methods, ", "))
	}
	switch {
	case password.v != "" && user.v == "":
		return fmt.Errorf("%s is set without a user name: give --nats-user (NATS_USER) too", password.from)
	case user.v != "":
		s.Auth = "user/password"
		s.opts = append(s.opts, nats.UserInfo(user.v, password.v))
	case token.v != "":
		s.Auth = "token"
		s.opts = append(s.opts, nats.Token(token.v))
	case nkey.v != "":
		if _, err := readFile(nkey); err != nil {
			return err
		}
		opt, err := nats.NkeyOptionFromSeed(nkey.v)
		if err != nil {
			return fmt.Errorf("%s %q: not an NKey seed file: %w", nkey.from, nkey.v, err)
		}
		s.Auth = "nkey"
		s.opts = append(s.opts, opt)
	case creds.v != "":
		data, err := readFile(creds)
		if err != nil {
			return err
		}
		token, err := nkeys.ParseDecoratedJWT(data)
		if err == nil {
			_, err = jwt.DecodeUserClaims(token)
		}
		if err != nil {
			return fmt.Errorf("%s %q: not a NATS credentials file: no user JWT in it", creds.from, creds.v)
		}
		if _, err := nkeys.ParseDecoratedNKey(data); err != nil {
			return fmt.Errorf("%s %q: not a NATS credentials file: no NKey seed in it", creds.from, creds.v)
		}
		// nats.go reads the file again on every (re)connect, so a renewed
		// JWT written over it is picked up without a restart.
		s.Auth = "creds"
		s.opts = append(s.opts, nats.UserCredentials(creds.v))
	}
	return nil
}

// addTLS adds the TLS configuration when any TLS setting is given.
func (s *Settings) addTLS(ca, cert, key value, first bool) error {
	if ca.v == "" && cert.v == "" && key.v == "" && !first {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca.v != "" {
		pem, err := readFile(ca)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s %q: no PEM certificate in it", ca.from, ca.v)
		}
		cfg.RootCAs = pool
	}
	switch {
	case cert.v != "" && key.v == "":
		return fmt.Errorf("%s is set without a private key: give --nats-tls-key (NATS_KEY) too", cert.from)
	case key.v != "" && cert.v == "":
		return fmt.Errorf("%s is set without a certificate: give --nats-tls-cert (NATS_CERT) too", key.from)
	case cert.v != "":
		certPEM, err := readFile(cert)
		if err != nil {
			return err
		}
		keyPEM, err := readFile(key)
		if err != nil {
			return err
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			// crypto/tls's messages name what is wrong, never key bytes.
			return fmt.Errorf("%s %q with %s %q: %w", cert.from, cert.v, key.from, key.v, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	s.TLS = true
	s.opts = append(s.opts, nats.Secure(cfg))
	if first {
		s.opts = append(s.opts, nats.TLSHandshakeFirst())
	}
	return nil
}

// readFile reads the file of v, with an error naming where the path came
// from and the path.
func readFile(v value) ([]byte, error) {
	data, err := os.ReadFile(v.v)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s %q: cannot read the file: %w", v.from, v.v, err)
	}
	return data, nil
}
