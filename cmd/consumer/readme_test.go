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
	app, err := kong.New(&cli{}, ops.WireVars())
	require.NoError(t, err)
	problems, err := flagdoc.Check(string(readme), "### consumer", "## ", app, "run")
	require.NoError(t, err)
	require.Empty(t, problems)
}
