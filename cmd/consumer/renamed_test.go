package main

import (
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/flagdoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// Every new name of renamed is a flag or variable of `consumer run`; no old
// one is any more.
func TestRenamedNamesAreTheGrammars(t *testing.T) {
	t.Parallel()
	app, err := kong.New(&cli{}, ops.WireVars())
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)
	names := map[string]bool{}
	for name, f := range flags {
		names["--"+name] = true
		for _, e := range f.Envs {
			names[e] = true
		}
	}
	for _, r := range renamed {
		require.True(t, names[r.New], "%s is not a flag or variable of consumer run", r.New)
		require.False(t, names[r.Old], "%s is still a flag or variable of consumer run", r.Old)
	}
}

// The old names still set what they set, through the new ones, with a
// warning naming the new one. (Not parallel: it sets the environment.)
func TestRenamedOldNamesStillWork(t *testing.T) {
	for _, r := range renamed {
		if !strings.HasPrefix(r.New, "--") {
			t.Setenv(r.New, "") // restored at cleanup: ApplyRenames sets it
			require.NoError(t, os.Unsetenv(r.New))
		}
	}
	t.Setenv("JSBRIDGE_OPS_ADDR", "127.0.0.1:19465")
	t.Setenv("JSBRIDGE_MAX_IN_FLIGHT", "7")
	args, warnings, err := ops.ApplyRenames(renamed, []string{"run", "--replicas", "3"}, os.LookupEnv, os.Setenv)
	require.NoError(t, err)
	var c cli
	app, err := kong.New(&c, ops.WireVars())
	require.NoError(t, err)
	_, err = app.Parse(args)
	require.NoError(t, err)
	require.Equal(t, 3, c.Run.StreamReplicas)
	require.Equal(t, "127.0.0.1:19465", c.Run.OpsAddr)
	require.Equal(t, 7, c.Run.MaxInFlight)
	all := strings.Join(warnings, "\n")
	for _, want := range []string{"use --stream-replicas", "use JSBRIDGE_CONSUMER_OPS_ADDR", "use JSBRIDGE_CONSUMER_MAX_IN_FLIGHT"} {
		require.Contains(t, all, want)
	}
}
