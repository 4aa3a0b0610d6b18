package main

import (
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/clidoc"
	"github.com/jsbridge/jsbridge/internal/flagdoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// docs/cli.md's bridge section is what the flag definitions generate: run
// `make docs` (or `go generate ./cmd/...`) after changing a flag.
func TestCLIReferenceIsGenerated(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/cli.md")
	require.NoError(t, err)
	section, err := reference()
	require.NoError(t, err)
	require.Equal(t, string(doc), clidoc.Splice(string(doc), section),
		"docs/cli.md is stale: run make docs")
	require.True(t, strings.HasPrefix(string(doc), clidoc.Header), "docs/cli.md starts with clidoc.Header: delete it and run make docs")
}

// Every command's table in docs/cli.md, with the flags every command
// takes, lists each of its flags with the environment variable and
// default the code has (the check the README's tables had).
func TestCLIReferenceTablesMatchTheCode(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/cli.md")
	require.NoError(t, err)
	doc := string(raw)
	app, err := kong.New(&cli{}, kong.Name("bridge"), ops.WireVars())
	require.NoError(t, err)
	problems, err := flagdoc.Reference(doc, "bridge", app)
	require.NoError(t, err)
	require.Empty(t, problems)
}
