package main

import (
	"log/slog"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// parseRun parses `consumer run args...` and returns the attempts record
// it configures, or its error.
func parseRun(t *testing.T, args ...string) (*consumer.AttemptsConfig, error) {
	t.Helper()
	var cl cli
	parser, err := kong.New(&cl, ops.WireVars())
	require.NoError(t, err)
	_, err = parser.Parse(append([]string{"run"}, args...))
	require.NoError(t, err)
	return cl.Run.attemptsConfig(&cl.Globals, slog.New(slog.DiscardHandler))
}

// --attempts-record takes failures (the default) and all; any other
// value is refused with an error naming the flag and the value.
func TestAttemptsRecordFlag(t *testing.T) {
	t.Parallel()
	a, err := parseRun(t)
	require.NoError(t, err)
	require.Equal(t, consumer.AttemptsRecordFailures, a.Record, "the default")
	a, err = parseRun(t, "--attempts-record", "all")
	require.NoError(t, err)
	require.Equal(t, consumer.AttemptsRecordAll, a.Record)
	a, err = parseRun(t, "--attempts-record=failures")
	require.NoError(t, err)
	require.Equal(t, consumer.AttemptsRecordFailures, a.Record)

	_, err = parseRun(t, "--attempts-record", "successes")
	require.EqualError(t, err, `--attempts-record (JSBRIDGE_ATTEMPTS_RECORD) "successes": want failures or all`)
	_, err = parseRun(t, "--attempts-record", "")
	require.ErrorContains(t, err, `--attempts-record (JSBRIDGE_ATTEMPTS_RECORD) "": want failures or all`)
	// Refused even with the records off.
	_, err = parseRun(t, "--attempts-record", "ALL", "--attempts-max-age", "0")
	require.ErrorContains(t, err, `--attempts-record (JSBRIDGE_ATTEMPTS_RECORD) "ALL"`)
}

// JSBRIDGE_ATTEMPTS_RECORD sets it too, and a bad value is refused alike.
func TestAttemptsRecordEnv(t *testing.T) {
	t.Setenv("JSBRIDGE_ATTEMPTS_RECORD", "all")
	a, err := parseRun(t)
	require.NoError(t, err)
	require.Equal(t, consumer.AttemptsRecordAll, a.Record)
	t.Setenv("JSBRIDGE_ATTEMPTS_RECORD", "some")
	_, err = parseRun(t)
	require.EqualError(t, err, `--attempts-record (JSBRIDGE_ATTEMPTS_RECORD) "some": want failures or all`)
}
