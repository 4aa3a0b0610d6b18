package main

import (
	"bytes"
	"log/slog"
	"os"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/ops"
)

// dlq replay and replay take the deprecated --engine (JSBRIDGE_ENGINE) as
// consumer run does: a warning for shared, durables refused naming
// consumer migrate.
func TestReplayCommandsTakeTheDeprecatedEngine(t *testing.T) {
	t.Setenv("JSBRIDGE_ENGINE", "") // restored at the end
	require.NoError(t, os.Unsetenv("JSBRIDGE_ENGINE"))
	parse := func(args ...string) cli {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse(args)
		require.NoError(t, err)
		return cl
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	cl := parse("dlq", "replay", "--all")
	require.NoError(t, cl.DLQ.Replay.check(log))
	require.Empty(t, buf.String(), "no flag, no warning")
	cl = parse("dlq", "replay", "--all", "--engine", "shared")
	require.NoError(t, cl.DLQ.Replay.check(log))
	require.Contains(t, buf.String(), "deprecated and does nothing")
	cl = parse("replay", "--since", "1h", "--engine", "durables")
	require.ErrorContains(t, cl.Replay.check(log), "`consumer migrate`")
	t.Setenv("JSBRIDGE_ENGINE", "durables")
	cl = parse("dlq", "replay", "--all")
	require.ErrorContains(t, cl.DLQ.Replay.check(log), `--engine (JSBRIDGE_ENGINE) "durables"`, "JSBRIDGE_ENGINE")
}
