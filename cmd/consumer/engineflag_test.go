package main

import (
	"os"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// dlq replay and replay take --engine (JSBRIDGE_ENGINE) as consumer run
// does, and refuse a bad value naming the flag.
func TestReplayCommandsTakeTheEngine(t *testing.T) {
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
	var cfg consumer.Config
	cl := parse("dlq", "replay", "--all")
	require.NoError(t, cl.DLQ.Replay.apply(&cfg))
	require.Equal(t, consumer.EngineAuto, cfg.Engine, "the default")
	cl = parse("dlq", "replay", "--all", "--engine", "shared")
	require.NoError(t, cl.DLQ.Replay.apply(&cfg))
	require.Equal(t, consumer.EngineShared, cfg.Engine)
	cl = parse("replay", "--since", "1h", "--engine", "shared")
	require.NoError(t, cl.Replay.apply(&cfg))
	require.Equal(t, consumer.EngineShared, cfg.Engine)
	cl = parse("replay", "--since", "1h", "--engine", "orbit")
	require.EqualError(t, cl.Replay.apply(&cfg), `--engine (JSBRIDGE_ENGINE) "orbit": want auto, shared or durables`)
	t.Setenv("JSBRIDGE_ENGINE", "shared")
	cl = parse("dlq", "replay", "--all")
	require.NoError(t, cl.DLQ.Replay.apply(&cfg))
	require.Equal(t, consumer.EngineShared, cfg.Engine, "JSBRIDGE_ENGINE")
}
