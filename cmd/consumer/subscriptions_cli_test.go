package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// get, list and export never print a secret, the URL's query or a header
// value unless asked with the key; export --secrets-dir imports back; the
// stored document holds none of them in clear; errors name the flag or
// the field and the value.
func TestSubscriptionsCLIRedactsAndRoundTrips(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	secret, sFile := k.secretFile(t, "s")
	const url = "https://hooks.example.com/in?token=t0psecret"
	_, err := k.cliOut(t, "add", "billing", "--url", url, "--filter", "events.order.>", "--secret-file", sFile,
		"--header", "Authorization=Bearer h3ader", "--ordering", "none", "--max-in-flight", "8")
	require.NoError(t, err)

	clear := []string{secret, "t0psecret", "h3ader"}
	for _, args := range [][]string{{"get", "billing"}, {"get", "billing", "--json"}, {"list"}, {"list", "--json"}, {"export"}} {
		out, err := k.cliOut(t, args...)
		require.NoError(t, err, args)
		require.Contains(t, out, "billing")
		for _, c := range clear {
			require.NotContains(t, out, c, "%v prints a secret", args)
		}
	}
	kv, err := k.js.KeyValue(k.ctx, consumer.DefaultSubscriptionsBucket)
	require.NoError(t, err)
	e, err := kv.Get(k.ctx, "billing")
	require.NoError(t, err)
	for _, c := range clear {
		require.NotContains(t, string(e.Value()), c, "the bucket holds a secret in clear")
	}

	out, err := k.cliOut(t, "get", "billing", "--show-secrets")
	require.NoError(t, err)
	for _, c := range clear {
		require.Contains(t, out, c)
	}

	// Export with the secrets into files, delete, import: the same.
	dir := filepath.Join(k.dir, "export")
	exported, err := k.cliOut(t, "export", "--secrets-dir", dir)
	require.NoError(t, err)
	require.NotContains(t, exported, secret)
	file := filepath.Join(k.dir, "all.yaml")
	require.NoError(t, os.WriteFile(file, []byte(exported), 0o600))
	require.NoError(t, k.cli(t, "delete", "billing"))
	out, err = k.cliOut(t, "import", file)
	require.NoError(t, err)
	require.Contains(t, out, "subscription billing added")
	store, err := consumer.OpenSubscriptionStore(k.ctx, k.js, consumer.SubscriptionStoreConfig{})
	require.NoError(t, err)
	keys, err := readKeys(k.keyFile)
	require.NoError(t, err)
	got, err := store.WithKeys(keys).Get(k.ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, url, got.URL)
	require.Equal(t, []string{secret}, got.Secrets)
	require.Equal(t, "Bearer h3ader", got.Headers["Authorization"])
	require.Equal(t, 8, got.MaxInFlight)
	require.Equal(t, consumer.OrderingNone, got.Ordering)
	require.Equal(t, consumer.StartSequence, got.Start.Policy)

	// Errors name the flag or the field and the value.
	err = k.cli(t, "add", "x", "--url", "https://hooks.example.com", "--filter", "events.>", "--secret-file", filepath.Join(k.dir, "missing"))
	require.ErrorContains(t, err, "--secret-file")
	err = k.cli(t, "add", "bad name", "--url", "https://hooks.example.com", "--filter", "events.>", "--secret-file", sFile)
	require.ErrorIs(t, err, consumer.ErrInvalidConfig)
	require.ErrorContains(t, err, `Name: "bad name"`)
	err = k.cli(t, "add", "local", "--url", "https://127.0.0.1/in", "--filter", "events.>", "--secret-file", sFile)
	require.ErrorIs(t, err, consumer.ErrForbiddenAddress)
	require.ErrorContains(t, err, "--allow-private")
	err = k.cli(t, "add", "billing", "--url", "https://hooks.example.com", "--filter", "events.>", "--secret-file", sFile)
	require.ErrorIs(t, err, consumer.ErrConflict)
	err = k.cli(t, "update", "billing", "--start", "all")
	require.ErrorContains(t, err, "--start")
	err = k.cli(t, "pause", "nope")
	require.ErrorIs(t, err, consumer.ErrSubscriptionNotFound)

	// Without the key, a write says which flag gives it.
	noKey := storeFlags{}
	_, err = noKey.needKeyring()
	require.ErrorIs(t, err, consumer.ErrNoSecretsKey)
	require.ErrorContains(t, err, "--secrets-key-file")

	// Key rotation: the new key first, the old one kept; reseal; then the
	// new key alone opens every subscription.
	line, err := k.cliOut(t, "keygen", "--id", "k2")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "k2:"), line)
	old, err := os.ReadFile(k.keyFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(k.keyFile, []byte(line+string(old)), 0o600))
	out, err = k.cliOut(t, "reseal")
	require.NoError(t, err)
	require.Contains(t, out, "reseal: 1 of 1 subscription(s) sealed again with key k2")
	require.NoError(t, os.WriteFile(k.keyFile, []byte(line), 0o600))
	out, err = k.cliOut(t, "list")
	require.NoError(t, err)
	require.Contains(t, out, " k2 ")
	out, err = k.cliOut(t, "get", "billing", "--show-secrets")
	require.NoError(t, err)
	require.Contains(t, out, secret)
}

// The subscriptions bucket's replica count follows --stream-replicas
// (JSBRIDGE_STREAM_REPLICAS) unless --subscriptions-bucket-replicas is
// set, on every command that may create the bucket: a bucket made by
// subscriptions add on a cluster keeps as many copies as the rest.
// (Not parallel: it sets the environment.)
func TestSubscriptionsBucketReplicasFollowStreamReplicas(t *testing.T) {
	t.Setenv("JSBRIDGE_STREAM_REPLICAS", "")
	require.NoError(t, os.Unsetenv("JSBRIDGE_STREAM_REPLICAS"))
	t.Setenv("JSBRIDGE_CONSUMER_SUBSCRIPTIONS_BUCKET_REPLICAS", "")
	require.NoError(t, os.Unsetenv("JSBRIDGE_CONSUMER_SUBSCRIPTIONS_BUCKET_REPLICAS"))
	replicas := func(args ...string) int {
		t.Helper()
		var c cli
		app, err := kong.New(&c, ops.WireVars())
		require.NoError(t, err)
		kctx, err := app.Parse(args)
		require.NoError(t, err, "%v", args)
		var f *storeFlags
		switch kctx.Command() {
		case "subscriptions add <name>", "subscriptions add":
			f = &c.Subscriptions.Add.storeFlags
		case "subscriptions list":
			f = &c.Subscriptions.List.storeFlags
		case "run":
			f = &c.Run.storeFlags
		default:
			t.Fatalf("command %q", kctx.Command())
		}
		cfg, err := f.storeConfig(nil)
		require.NoError(t, err, "%v", args)
		return cfg.Replicas
	}
	require.Equal(t, 1, replicas("subscriptions", "list"), "both defaults: R1")
	require.Equal(t, 3, replicas("subscriptions", "add", "billing", "--stream-replicas", "3"))
	require.Equal(t, 3, replicas("run", "--stream-replicas", "3"))
	require.Equal(t, 1, replicas("subscriptions", "add", "billing", "--stream-replicas", "3", "--subscriptions-bucket-replicas", "1"), "set, it wins")
	t.Setenv("JSBRIDGE_STREAM_REPLICAS", "3")
	require.Equal(t, 3, replicas("subscriptions", "list"), "the environment variable too")

	_, err := (&storeFlags{BucketReplicas: -1, StreamReplicas: 1}).storeConfig(nil)
	require.ErrorContains(t, err, "--subscriptions-bucket-replicas (JSBRIDGE_CONSUMER_SUBSCRIPTIONS_BUCKET_REPLICAS) -1")
}
