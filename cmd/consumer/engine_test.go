package main

import (
	"os"
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

// --engine takes durables (the default) and shared; any other value is
// refused with an error naming the flag and the value.
func TestEngineFlag(t *testing.T) {
	t.Parallel()
	if os.Getenv("JSBRIDGE_ENGINE") == "" { // else the environment names it (TestEngineEnv)
		e, err := parseEngine(t)
		require.NoError(t, err)
		require.Equal(t, consumer.EngineDurables, e, "the default")
	}
	e, err := parseEngine(t, "--engine", "shared")
	require.NoError(t, err)
	require.Equal(t, consumer.EngineShared, e)
	_, err = parseEngine(t, "--engine", "Shared")
	require.EqualError(t, err, `--engine (JSBRIDGE_ENGINE) "Shared": want durables or shared`)
}

// JSBRIDGE_ENGINE sets it too.
func TestEngineEnv(t *testing.T) {
	t.Setenv("JSBRIDGE_ENGINE", "shared")
	e, err := parseEngine(t)
	require.NoError(t, err)
	require.Equal(t, consumer.EngineShared, e)
	t.Setenv("JSBRIDGE_ENGINE", "durable")
	_, err = parseEngine(t)
	require.EqualError(t, err, `--engine (JSBRIDGE_ENGINE) "durable": want durables or shared`)
}
