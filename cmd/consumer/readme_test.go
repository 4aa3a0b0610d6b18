package main

import (
	"os"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/flagdoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// The README's table for `consumer` lists every flag of `consumer run`
// with the environment variable and default the code has.
func TestREADMEFlagTablesMatchTheCode(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	rows, err := flagdoc.Rows(string(readme), "### consumer", "## ")
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	app, err := kong.New(&cli{}, ops.WireVars())
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)
	require.Contains(t, flags, "ack-wait", "the grammar was read")
	require.Empty(t, flagdoc.Problems(rows, flags))
}
