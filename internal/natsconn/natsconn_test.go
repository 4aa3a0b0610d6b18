package natsconn_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/natsconn"
	"github.com/jsbridge/jsbridge/internal/natsconn/natsconntest"
	"github.com/jsbridge/jsbridge/internal/startup"
)

// connect resolves f and connects as the binaries do (startup.ConnectNATS
// with the shared options), giving up after 10 s.
func connect(t *testing.T, url string, f natsconn.Flags) (*nats.Conn, error) {
	t.Helper()
	s, err := f.Resolve(url)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := append(startup.NATSOptions(nil, "natsconn-test"), s.Options()...)
	nc, err := startup.ConnectNATS(ctx, startup.New(nil, 10*time.Second), s.URL, opts...)
	if nc != nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

func TestConnectsToSecuredServers(t *testing.T) {
	t.Parallel()
	credentials, tlsCert := "check the credentials", "check --nats-tls-cert and --nats-tls-key"
	for name, tc := range map[string]struct {
		start func(testing.TB) natsconntest.Secured
		hint  string // what the refusal says to check
	}{
		"user/password": {natsconntest.StartUserPassword, credentials},
		"token":         {natsconntest.StartToken, credentials},
		"nkey":          {natsconntest.StartNKey, credentials},
		"creds":         {natsconntest.StartCreds, credentials},
		"tls":           {natsconntest.StartTLS, tlsCert},
		"tls first":     {natsconntest.StartTLSFirst, tlsCert},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := tc.start(t)

			nc, err := connect(t, srv.URL, srv.Good)
			require.NoError(t, err)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = js.AccountInfo(ctx)
			require.NoError(t, err, "JetStream must be usable over the secured connection")

			// Refused credentials are permanent: ConnectNATS returns at
			// once instead of waiting out its 10 s.
			began := time.Now()
			_, err = connect(t, srv.URL, srv.Bad)
			require.Error(t, err)
			require.True(t, startup.IsPermanent(err), "refused credentials must be permanent: %v", err)
			require.Less(t, time.Since(began), 5*time.Second)
			require.Contains(t, err.Error(), tc.hint)
			for _, secret := range srv.Secrets {
				require.NotContains(t, err.Error(), secret)
			}
		})
	}
}

func TestTLSServerNotTrustedIsPermanent(t *testing.T) {
	t.Parallel()
	srv := natsconntest.StartTLS(t)
	f := srv.Good
	f.TLSCA = filepath.Join(filepath.Dir(f.TLSCA), "other-ca.pem") // not the server's CA
	_, err := connect(t, srv.URL, f)
	require.Error(t, err)
	require.True(t, startup.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "certificate signed by unknown authority")
	require.Contains(t, err.Error(), "check --nats-tls-ca")

	// Without --nats-tls-first a handshake_first server is not reached:
	// each waits for the other to speak first (the server's TLS timeout is
	// longer than this wait).
	first := natsconntest.StartTLSFirst(t)
	f = first.Good
	f.TLSFirst = false
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := f.Resolve(first.URL)
	require.NoError(t, err)
	_, err = startup.ConnectNATS(ctx, startup.New(nil, 0), s.URL, s.Options()...)
	require.Error(t, err)
}

func TestWithoutCredentialsTheServerRefuses(t *testing.T) {
	t.Parallel()
	srv := natsconntest.StartUserPassword(t)
	_, err := connect(t, srv.URL, natsconn.Flags{})
	require.Error(t, err)
	require.True(t, startup.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "--nats-user")
}

// writeContext writes a nats CLI context file NAME.json under
// dir/nats/context.
func writeContext(t *testing.T, dir, name, body string) string {
	t.Helper()
	ctxDir := filepath.Join(dir, "nats", "context")
	require.NoError(t, os.MkdirAll(ctxDir, 0o700))
	path := filepath.Join(ctxDir, name+".json")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

func TestContextGivesURLAndCredentials(t *testing.T) {
	srv := natsconntest.StartUserPassword(t)
	good := srv.Good
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	writeContext(t, config, "prod", `{"description": "test", "url": "`+srv.URL+`", "user": "`+good.User+`", "password": "`+good.Password+`"}`)

	s, err := natsconn.Flags{Context: "prod"}.Resolve("")
	require.NoError(t, err)
	require.Equal(t, srv.URL, s.URL)
	require.Equal(t, "user/password", s.Auth)
	_, err = connect(t, "", natsconn.Flags{Context: "prod"})
	require.NoError(t, err)

	// --nats-url and --nats-password override the context's.
	writeContext(t, config, "stale", `{"url": "nats://127.0.0.1:1", "user": "app", "password": "stale"}`)
	_, err = connect(t, srv.URL, natsconn.Flags{Context: "stale", Password: good.Password})
	require.NoError(t, err, "--nats-password alone keeps the context's user")

	// An authentication flag replaces the context's method as a whole.
	s, err = natsconn.Flags{Context: "stale", Token: "t0ken"}.Resolve("")
	require.NoError(t, err)
	require.Equal(t, "token", s.Auth)
	require.Equal(t, "nats://127.0.0.1:1", s.URL)
}

func TestContextUnderHomeWithoutXDG(t *testing.T) {
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("HOME", home)
	writeContext(t, filepath.Join(home, ".config"), "dev", `{"url": "nats://10.0.0.1:4222", "token": "s3cret"}`)
	s, err := natsconn.Flags{Context: "dev"}.Resolve("")
	require.NoError(t, err)
	require.Equal(t, "nats://10.0.0.1:4222", s.URL)
	require.Equal(t, "token", s.Auth)

	// A path is read as it is.
	path := writeContext(t, t.TempDir(), "elsewhere", `{"url": "nats://10.0.0.2:4222"}`)
	s, err = natsconn.Flags{Context: path}.Resolve("")
	require.NoError(t, err)
	require.Equal(t, "nats://10.0.0.2:4222", s.URL)
	require.Equal(t, "none", s.Auth)
	require.False(t, s.TLS)

	s, err = natsconn.Flags{}.Resolve("nats://a:4222, tls://b:4222")
	require.NoError(t, err)
	require.True(t, s.TLS, "a tls:// URL is TLS")
}

func TestResolveErrorsNameTheProblemNotTheSecret(t *testing.T) {
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte("SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU not a creds file"), 0o600))
	missing := filepath.Join(dir, "missing.pem")
	badJSONPath := writeContext(t, config, "badjson", `{"password": "hunter2-secret", "url": }`)
	unsupported := writeContext(t, config, "socks", `{"url": "nats://x:4222", "socks_proxy": "127.0.0.1:1080"}`)
	writeContext(t, config, "both", `{"url": "nats://x:4222", "jetstream_domain": "hub", "jetstream_api_prefix": "JS.hub.API"}`)

	for _, tc := range []struct {
		name  string
		flags natsconn.Flags
		want  []string
	}{
		{"missing context", natsconn.Flags{Context: "nope"}, []string{`--context "nope"`, filepath.Join(config, "nats", "context", "nope.json"), "does not exist"}},
		{"context not JSON", natsconn.Flags{Context: "badjson"}, []string{`--context "badjson"`, badJSONPath, "not valid JSON"}},
		{"unsupported context field", natsconn.Flags{Context: "socks"}, []string{unsupported, "socks_proxy", "does not support"}},
		{"domain and API prefix", natsconn.Flags{Context: "both"}, []string{"field jetstream_domain", "field jetstream_api_prefix", "not both"}},
		{"domain and API prefix flags", natsconn.Flags{JSDomain: "leaf", JSAPIPrefix: "JS.x.API"}, []string{"--js-domain", "--js-api-prefix", "not both"}},
		{"domain with a dot", natsconn.Flags{JSDomain: "hub.east"}, []string{"--js-domain", `"hub.east"`, "one subject token"}},
		{"API prefix with a wildcard", natsconn.Flags{JSAPIPrefix: "JS.*.API"}, []string{"--js-api-prefix", `"JS.*.API"`, "without wildcards"}},
		{"missing nkey file", natsconn.Flags{NKey: missing}, []string{"--nats-nkey", missing, "cannot read"}},
		{"nkey file without a seed", natsconn.Flags{NKey: filepath.Join(dir)}, []string{"--nats-nkey", dir}},
		{"missing creds file", natsconn.Flags{Creds: missing}, []string{"--nats-creds", missing, "cannot read"}},
		{"not a creds file", natsconn.Flags{Creds: garbage}, []string{"--nats-creds", garbage, "not a NATS credentials file"}},
		{"missing CA", natsconn.Flags{TLSCA: missing}, []string{"--nats-tls-ca", missing, "cannot read"}},
		{"CA without PEM", natsconn.Flags{TLSCA: garbage}, []string{"--nats-tls-ca", garbage, "no PEM certificate"}},
		{"cert without key", natsconn.Flags{TLSCert: garbage}, []string{"--nats-tls-cert", "--nats-tls-key"}},
		{"key without cert", natsconn.Flags{TLSKey: garbage}, []string{"--nats-tls-key", "--nats-tls-cert"}},
		{"bad key pair", natsconn.Flags{TLSCert: garbage, TLSKey: garbage}, []string{"--nats-tls-cert", garbage}},
		{"password without user", natsconn.Flags{Password: "hunter2-secret"}, []string{"--nats-password", "--nats-user"}},
		{"two methods", natsconn.Flags{Token: "hunter2-secret", Creds: garbage}, []string{"--nats-token", "--nats-creds", "one way"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.flags.Resolve("nats://127.0.0.1:4222")
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), "hunter2")
			require.NotContains(t, err.Error(), "SUAMLK2ZNL35")
		})
	}
}

// A domain or an API prefix comes from the flags, else from the context
// (which jsbridge refused before), and picks the JetStream API subjects.
func TestResolveJetStreamDomainAndAPIPrefix(t *testing.T) {
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	writeContext(t, config, "leaf", `{"url": "nats://x:4222", "jetstream_domain": "leaf"}`)
	writeContext(t, config, "imported", `{"url": "nats://x:4222", "jetstream_api_prefix": "JS.hub.API."}`)
	for _, tc := range []struct {
		name           string
		flags          natsconn.Flags
		domain, prefix string
		api            string
	}{
		{"none", natsconn.Flags{}, "", "", "$JS.API"},
		{"domain flag", natsconn.Flags{JSDomain: "hub"}, "hub", "", "$JS.hub.API"},
		{"prefix flag", natsconn.Flags{JSAPIPrefix: "JS.x.API"}, "", "JS.x.API", "JS.x.API"},
		{"context domain", natsconn.Flags{Context: "leaf"}, "leaf", "", "$JS.leaf.API"},
		{"flag over context", natsconn.Flags{Context: "leaf", JSDomain: "hub"}, "hub", "", "$JS.hub.API"},
		{"context prefix", natsconn.Flags{Context: "imported"}, "", "JS.hub.API", "JS.hub.API"},
		{"domain flag over context prefix", natsconn.Flags{Context: "imported", JSDomain: "leaf"}, "leaf", "", "$JS.leaf.API"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.flags.Resolve("")
			require.NoError(t, err)
			require.Equal(t, tc.domain, s.JSDomain)
			require.Equal(t, tc.prefix, s.JSAPIPrefix)
			require.Equal(t, tc.api, s.JetStreamAPI())
		})
	}
}

func TestGivenListsTheSetFlags(t *testing.T) {
	t.Parallel()
	require.Empty(t, natsconn.Flags{}.Given())
	require.Equal(t, []string{"--context", "--nats-password", "--nats-tls-first"},
		natsconn.Flags{Context: "x", Password: "p", TLSFirst: true}.Given())
}
