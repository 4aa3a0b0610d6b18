package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/internal/flagdoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// Every `bridge run` flag that maps to a bridge.Config field defaults to
// the bridge package's Default* constant, so the defaults are defined once
// in effect: the kong tags keep literals for --help. (--migrate is left
// out: the command line migrates unless --no-migrate, while a zero Config
// leaves migrating to the application.)
func TestRunFlagDefaultsAreTheBridgeDefaults(t *testing.T) {
	t.Parallel()
	app, err := kong.New(&cli{}, ops.WireVars())
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)

	want := map[string]any{
		"schema":           bridge.DefaultSchema,
		"stream":           bridge.DefaultStream,
		"subject-prefix":   bridge.DefaultSubjectPrefix,
		"source":           bridge.DefaultSource,
		"duplicate-window": bridge.DefaultDuplicateWindow,
		"lease":            bridge.DefaultLease,
		"claim-limit":      bridge.DefaultClaimLimit,
		"fetch-limit":      bridge.DefaultFetchLimit,
		"poll-interval":    bridge.DefaultPollInterval,
		"linger":           time.Duration(0), // off: claim again at once
		"max-retries":      bridge.DefaultMaxRetries,
		"max-in-flight":    bridge.DefaultMaxInFlight,
		"publish-timeout":  bridge.DefaultPublishTimeout,
		"shutdown-grace":   bridge.DefaultShutdownGrace,
		"settle-timeout":   bridge.DefaultSettleTimeout,
		// No default on either side: "" means the bridge's own events
		// table, and a generated lease holder name.
		"events-table": "",
		"owner":        "",
	}
	for name, def := range want {
		f, ok := flags[name]
		require.True(t, ok, "bridge run has no --%s", name)
		var got any
		switch def.(type) {
		case time.Duration:
			got, err = time.ParseDuration(f.Default)
		case int:
			got, err = strconv.Atoi(f.Default)
		case string:
			got = f.Default
		default:
			t.Fatalf("--%s: no comparison for %T", name, def)
		}
		require.NoError(t, err, "--%s default %q", name, f.Default)
		require.Equal(t, def, got, "--%s: the flag's default is not bridge's", name)
	}
}
