package main

import (
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// parseEngine parses `consumer run args...` and returns the engine it
// configures, or its error.
func parseEngine(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var cl cli
	parser, err := kong.New(&cl, ops.WireVars())
	require.NoError(t, err)
	_, err = parser.Parse(append([]string{"run"}, args...))
	require.NoError(t, err)
	return engine(cl.Run.Engine)
}

// --engine takes auto (the default), shared and durables; any other value is
// refused with an error naming the flag and the value.
func TestEngineFlag(t *testing.T) {
	t.Parallel()
	e, err := parseEngine(t)
	require.NoError(t, err)
	require.Equal(t, consumer.EngineAuto, e, "the default")
	for _, want := range []string{consumer.EngineShared, consumer.EngineDurables} {
		e, err = parseEngine(t, "--engine", want)
		require.NoError(t, err)
		require.Equal(t, want, e)
	}
	_, err = parseEngine(t, "--engine", "Shared")
	require.EqualError(t, err, `--engine (JSBRIDGE_ENGINE) "Shared": want auto, shared or durables`)
}

// JSBRIDGE_ENGINE sets it too.
func TestEngineEnv(t *testing.T) {
	t.Setenv("JSBRIDGE_ENGINE", "shared")
	e, err := parseEngine(t)
	require.NoError(t, err)
	require.Equal(t, consumer.EngineShared, e)
	t.Setenv("JSBRIDGE_ENGINE", "durable")
	_, err = parseEngine(t)
	require.EqualError(t, err, `--engine (JSBRIDGE_ENGINE) "durable": want auto, shared or durables`)
}
