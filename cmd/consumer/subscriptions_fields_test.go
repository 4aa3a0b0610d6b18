package main

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// fileSample is a value for each key of a subscription in the
// subscriptions file, none at its default, as YAML; {dir} is a directory
// holding the files they name. A key of fileSubscription missing here
// fails TestSubscriptionsBucketKeepsEveryFileField: a new field of the
// file format is round-tripped through the bucket or the test says so.
var fileSample = map[string]string{
	"name":            "billing",
	"filter_subjects": "[events.order.>, events.*.*.InvoiceRequested]",
	"url":             "https://hooks.example.com/in?token=t0psecret",
	"secrets_env":     "[ROUNDTRIP_SECRET]",
	"secrets_file":    "[{dir}/secret-b]",
	"scheme":          "hmac-sha256",
	"body":            "binary",
	"headers":         "{X-Team: billing}",
	"headers_env":     "{Authorization: ROUNDTRIP_AUTH}",
	"timeout":         "7s",
	"ack_wait":        "40s",
	"max_deliver":     "7",
	"backoff":         "[2s, 9s]",
	"max_in_flight":   "9",
	"max_ack_pending": "900",
	"rate_limit":      "12.5",
	"allow_private":   "true",
	"allow_http":      "true",
	"tls":             "{client_cert_file: {dir}/client.crt, client_key_file: {dir}/client.key, ca_file: {dir}/client.crt}",
	"ordering":        "stream",
	"on_dead_letter":  "skip",
	"start":           "{time: 2026-11-01T00:00:00Z}",
}

// fileFlag is the add/update flag of each key of the subscriptions file
// ("" for name, an argument).
var fileFlag = map[string]string{
	"name": "", "filter_subjects": "filter", "url": "url", "secrets_env": "secret-env", "secrets_file": "secret-file",
	"scheme": "scheme", "body": "body", "headers": "header", "headers_env": "header-env", "timeout": "timeout",
	"ack_wait": "ack-wait", "max_deliver": "max-deliver", "backoff": "backoff", "max_in_flight": "max-in-flight",
	"max_ack_pending": "max-ack-pending", "rate_limit": "rate-limit", "allow_private": "allow-private",
	"allow_http": "allow-http", "tls": "tls-client-cert", "ordering": "ordering", "on_dead_letter": "on-dead-letter",
	"start": "start",
}

// fileKeys returns the YAML keys of a subscription in the subscriptions
// file, read from fileSubscription's tags.
func fileKeys() []string {
	var keys []string
	st := reflect.TypeOf(fileSubscription{})
	for i := range st.NumField() {
		keys = append(keys, strings.Split(st.Field(i).Tag.Get("yaml"), ",")[0])
	}
	return keys
}

// A subscriptions file holding every field the format takes (built from
// fileSubscription's fields, so none can be forgotten), added with
// `subscriptions add -f`, exported and read back, is the same
// subscription: the bucket keeps every field (rate_limit was once lost).
// `import` of the export keeps them too, and every field has an
// add/update flag.
func TestSubscriptionsBucketKeepsEveryFileField(t *testing.T) {
	k := newRuntimeKit(t)
	certFile, keyFile := writeCert(t, k.dir)
	require.NoError(t, os.Rename(certFile, filepath.Join(k.dir, "client.crt")))
	require.NoError(t, os.Rename(keyFile, filepath.Join(k.dir, "client.key")))
	_, secretB := k.secretFile(t, "secret-b")
	secretA, _ := k.secretFile(t, "secret-a")
	t.Setenv("ROUNDTRIP_SECRET", secretA)
	t.Setenv("ROUNDTRIP_AUTH", "Bearer h3ader")
	require.Equal(t, filepath.Join(k.dir, "secret-b"), secretB)

	var file strings.Builder
	file.WriteString("subscriptions:\n")
	for i, key := range fileKeys() {
		v, ok := fileSample[key]
		require.True(t, ok, "subscriptions file key %s has no sample in fileSample: add one", key)
		require.Contains(t, fileFlag, key, "subscriptions file key %s has no add/update flag in fileFlag", key)
		lead := "    "
		if i == 0 {
			lead = "  - "
		}
		file.WriteString(lead + key + ": " + strings.ReplaceAll(v, "{dir}", k.dir) + "\n")
	}
	path := filepath.Join(k.dir, "every-field.yaml")
	require.NoError(t, os.WriteFile(path, []byte(file.String()), 0o600))
	want, _, err := loadSubscriptions(path)
	require.NoError(t, err, file.String())
	require.Len(t, want, 1)
	sv := reflect.ValueOf(want[0])
	for i := range sv.NumField() {
		require.False(t, sv.Field(i).IsZero(), "the sample file leaves consumer.Subscription.%s at its zero value", sv.Type().Field(i).Name)
	}

	readBack := func(name string) consumer.Subscription {
		t.Helper()
		exported, err := k.cliOut(t, "export", "--secrets-dir", filepath.Join(k.dir, name))
		require.NoError(t, err)
		out := filepath.Join(k.dir, name+".yaml")
		require.NoError(t, os.WriteFile(out, []byte(exported), 0o600))
		got, _, err := loadSubscriptions(out)
		require.NoError(t, err, exported)
		require.Len(t, got, 1)
		return got[0]
	}
	// ack_wait, deprecated and ignored, is read from the file and not
	// stored.
	want[0].AckWait = 0
	_, err = k.cliOut(t, "add", "-f", path)
	require.NoError(t, err)
	require.Equal(t, want[0], readBack("after-add"), "add -f keeps every field")

	require.NoError(t, k.cli(t, "delete", "billing"))
	_, err = k.cliOut(t, "import", filepath.Join(k.dir, "after-add.yaml"))
	require.NoError(t, err)
	require.Equal(t, want[0], readBack("after-import"), "import keeps every field")

	// The flags: every key has one, and update takes it (rate_limit here).
	var c cli
	app, err := kong.New(&c, ops.WireVars())
	require.NoError(t, err)
	var flags []string
	for _, n := range app.Model.Children {
		if n.Name != "subscriptions" {
			continue
		}
		for _, sub := range n.Children {
			if sub.Name == "update" {
				for _, f := range sub.Flags {
					flags = append(flags, f.Name)
				}
			}
		}
	}
	for key, flag := range fileFlag {
		require.True(t, flag == "" || slices.Contains(flags, flag), "update has no --%s for the file's %s", flag, key)
	}
	require.NoError(t, k.cli(t, "update", "billing", "--rate-limit", "30", "--header-env", "Authorization=ROUNDTRIP_AUTH"))
	got := readBack("after-update")
	require.Equal(t, 30.0, got.RateLimit)
	require.Equal(t, map[string]string{"Authorization": "Bearer h3ader"}, got.Headers, "update's headers replace the stored ones")
}
