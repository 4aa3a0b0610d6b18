package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/doccheck"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// Every bridge command line in an sh block of README.md, CONTRIBUTING.md and
// docs/*.md parses with the real command line: the subcommand, its flags,
// their values and its arguments exist and fit (what exits 80 when a
// reader copies it otherwise). The production block also runs, in
// integration's TestREADMEProductionRuns.
func TestDocCommandsParse(t *testing.T) {
	t.Parallel()
	pages, err := doccheck.Pages("../..")
	require.NoError(t, err)
	subs, err := filepath.Abs("../consumer/testdata/subscriptions.yaml")
	require.NoError(t, err)
	n := 0
	for _, p := range pages {
		raw, err := os.ReadFile(filepath.Join("../..", p))
		require.NoError(t, err)
		for _, c := range doccheck.Commands(p, string(raw), "bridge") {
			args := append([]string(nil), c.Args[1:]...)
			for i, a := range args {
				if a == "subscriptions.yaml" {
					args[i] = subs
				}
			}
			app, err := kong.New(&cli{}, kong.Name("bridge"), ops.WireVars())
			require.NoError(t, err)
			_, err = app.Parse(args)
			require.NoError(t, err, "%s:%d: %s", c.Page, c.Line, strings.Join(c.Args, " "))
			n++
		}
	}
	require.Positive(t, n, "the docs show bridge commands")
}
