package main

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/ops"
)

// checkEngine parses `consumer run args...` and returns what --engine's
// check says: its error, and the log it wrote.
func checkEngine(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var cl cli
	parser, err := kong.New(&cl, ops.WireVars())
	require.NoError(t, err)
	_, err = parser.Parse(append([]string{"run"}, args...))
	require.NoError(t, err)
	var buf bytes.Buffer
	err = cl.Run.check(slog.New(slog.NewTextHandler(&buf, nil)))
	return buf.String(), err
}

// --engine is deprecated: left out it says nothing; auto and shared are
// accepted with one warning that it does nothing; durables is refused
// naming the flag, the value and consumer migrate; any other value is
// refused naming the flag and the value.
func TestEngineFlagIsDeprecated(t *testing.T) {
	t.Setenv("JSBRIDGE_ENGINE", "") // restored at the end
	log, err := checkEngine(t)
	require.NoError(t, err)
	require.Empty(t, log, "no flag, no warning")
	for _, v := range []string{"auto", "shared"} {
		log, err = checkEngine(t, "--engine", v)
		require.NoError(t, err)
		require.Contains(t, log, "level=WARN")
		require.Contains(t, log, "deprecated and does nothing")
		require.Equal(t, 1, bytes.Count([]byte(log), []byte("\n")), "one warning")
	}
	_, err = checkEngine(t, "--engine", "durables")
	require.ErrorContains(t, err, `--engine (JSBRIDGE_ENGINE) "durables": the durables engine was removed`)
	require.ErrorContains(t, err, "`consumer migrate`")
	_, err = checkEngine(t, "--engine", "orbit")
	require.EqualError(t, err, `--engine (JSBRIDGE_ENGINE) "orbit": deprecated, and does nothing: remove it (it accepted auto and shared)`)
}

// JSBRIDGE_ENGINE is read the same way.
func TestEngineEnvIsDeprecated(t *testing.T) {
	t.Setenv("JSBRIDGE_ENGINE", "shared")
	log, err := checkEngine(t)
	require.NoError(t, err)
	require.Contains(t, log, "deprecated and does nothing")
	t.Setenv("JSBRIDGE_ENGINE", "durables")
	_, err = checkEngine(t)
	require.ErrorContains(t, err, "`consumer migrate`")
}
