package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/doccheck"
	"github.com/jsbridge/jsbridge/internal/flagdoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// Every consumer command line in an sh block of README.md, CONTRIBUTING.md and
// docs/*.md parses with the real command line: the subcommand, its flags,
// their values and its arguments exist and fit (what exits 80 when a
// reader copies it otherwise). The production block also runs, in
// integration's TestREADMEProductionRuns.
func TestDocCommandsParse(t *testing.T) {
	t.Parallel()
	pages, err := doccheck.Pages("../..")
	require.NoError(t, err)
	subs, err := filepath.Abs("../consumer/testdata/subscriptions.yaml")
	require.NoError(t, err)
	n := 0
	for _, p := range pages {
		raw, err := os.ReadFile(filepath.Join("../..", p))
		require.NoError(t, err)
		for _, c := range doccheck.Commands(p, string(raw), "consumer") {
			args := append([]string(nil), c.Args[1:]...)
			for i, a := range args {
				if a == "subscriptions.yaml" {
					args[i] = subs
				}
			}
			app, err := kong.New(&cli{}, kong.Name("consumer"), ops.WireVars())
			require.NoError(t, err)
			_, err = app.Parse(args)
			require.NoError(t, err, "%s:%d: %s", c.Page, c.Line, strings.Join(c.Args, " "))
			n++
		}
	}
	require.Positive(t, n, "the docs show consumer commands")
}

// Every subscriptions file shown in a yaml block of the docs loads (the
// complete one is testdata/subscriptions.yaml, loaded field by field in
// TestLoadCompleteSubscriptionsFile); the secrets they name come from the
// environment, set here.
func TestDocSubscriptionFilesLoad(t *testing.T) {
	for _, env := range []string{"BILLING_SECRET", "BILLING_SECRET_NEXT"} {
		t.Setenv(env, secretA)
	}
	t.Setenv("BILLING_AUTH", "Bearer t0ken")
	pages, err := doccheck.Pages("../..")
	require.NoError(t, err)
	n := 0
	for _, p := range pages {
		raw, err := os.ReadFile(filepath.Join("../..", p))
		require.NoError(t, err)
		for _, b := range doccheck.Blocks(string(raw)) {
			if b.Lang != "yaml" || !strings.Contains(b.Text, "subscriptions:") || strings.Contains(b.Text, "/run/secrets/") {
				continue // the complete file needs its secret files: see above
			}
			path := filepath.Join(t.TempDir(), "subs.yaml")
			require.NoError(t, os.WriteFile(path, []byte(b.Text), 0o600))
			_, _, err := loadSubscriptions(path)
			require.NoError(t, err, "%s:%d", p, b.Line)
			n++
		}
	}
	require.Positive(t, n, "the docs show subscriptions files")
}

// docs/subscriptions.md says which flags a subscriptions file (-c)
// replaces and which still apply: the subscription and breaker flags
// (subscriptionFlags) are replaced, every other flag of consumer run still
// applies and is named there (the NATS connection and log flags as groups).
func TestSubscriptionsPageSaysWhatConfigReplaces(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/subscriptions.md")
	require.NoError(t, err)
	sec := string(raw)
	i := strings.Index(sec, "\n## Flags or a file\n")
	require.GreaterOrEqual(t, i, 0)
	sec = sec[i+1:]
	sec = sec[:strings.Index(sec[3:], "\n## ")+3]
	_, stillApply, ok := strings.Cut(sec, "still apply")
	require.True(t, ok, "the section says which flags still apply")

	replaced := map[string]bool{}
	typ := reflect.TypeFor[subscriptionFlags]()
	for i := range typ.NumField() {
		if name := typ.Field(i).Tag.Get("name"); name != "" && name != "config" {
			replaced[name] = true
		}
	}
	app, err := kong.New(&cli{}, kong.Name("consumer"), ops.WireVars())
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)
	for name := range flags {
		switch {
		case name == "config":
		case replaced[name]:
			require.NotContains(t, stillApply, "`--"+name+"`", "--%s is replaced by the file", name)
		case strings.HasPrefix(name, "nats-") || name == "context":
			require.Contains(t, stillApply, "NATS connection flags")
		case strings.HasPrefix(name, "log-"):
			require.Contains(t, stillApply, "log flags")
		default:
			require.Contains(t, stillApply, "`--"+name+"`", "--%s still applies with -c: say so", name)
		}
	}
}
