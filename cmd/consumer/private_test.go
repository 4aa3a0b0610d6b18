package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// runArgs parses and runs `consumer run args...` as main would, up to its
// first error; the URLs here are refused before any connection is tried.
func runArgs(t *testing.T, args ...string) error {
	t.Helper()
	var c cli
	app, err := kong.New(&c, ops.WireVars())
	require.NoError(t, err)
	kctx, err := app.Parse(append([]string{"run", "--nats-url", "nats://127.0.0.1:1", "--ops-addr", "", "--startup-timeout", "1ms"}, args...))
	require.NoError(t, err)
	kctx.BindTo(context.Background(), (*context.Context)(nil))
	return kctx.Run(&c.Globals)
}

// An endpoint URL whose host is literally loopback, private or localhost,
// without --allow-private (allow_private: in a file), is refused at start,
// naming the field, the value and how to allow it.
func TestRunRefusesLocalOrPrivateURL(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"https://localhost:8443/hook", "https://127.0.0.1:8443/hook", "https://10.0.0.5/hook"} {
		err := runArgs(t, "--url", url, "--secret", secretA)
		require.ErrorIs(t, err, consumer.ErrForbiddenAddress, url)
		require.ErrorContains(t, err, `URL: "`+url+`"`)
		require.ErrorContains(t, err, "--allow-private")

		dir := t.TempDir()
		path := filepath.Join(dir, "subs.yaml")
		secret := filepath.Join(dir, "secret")
		require.NoError(t, os.WriteFile(secret, []byte(secretA), 0o600))
		yaml := "subscriptions:\n  - name: orders\n    url: " + url + "\n    filter_subjects: [events.>]\n    secrets_file: [" + secret + "]\n"
		require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
		_, _, err = loadSubscriptions(path)
		require.ErrorIs(t, err, consumer.ErrForbiddenAddress, url)
		require.ErrorContains(t, err, "--config "+path+`: subscriptions[0] ("orders")`)
		require.ErrorContains(t, err, `URL: "`+url+`"`)
		require.ErrorContains(t, err, "allow_private: true")

		require.NoError(t, os.WriteFile(path, []byte(yaml+"    allow_private: true\n"), 0o600))
		_, _, err = loadSubscriptions(path)
		require.NoError(t, err, "allow_private: true lets it be")
	}
}
