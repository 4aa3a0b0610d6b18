package jsbridgetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLookupDatabaseURLOutsideACheckoutSaysWhatToSet: where jsbridgetest
// is not in a jsbridge checkout (an application's module cache: no .git,
// scripts/pg not executable), it runs nothing and the error names the
// variable to set, not the repository's script; the variable wins
// everywhere.
func TestLookupDatabaseURLOutsideACheckoutSaysWhatToSet(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "scripts"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "scripts", "pg"), []byte("#!/bin/sh\necho ran >&2; exit 1\n"), 0o444))

	_, err := lookupDatabaseURL("", root)
	require.Error(t, err)
	require.Contains(t, err.Error(), "set "+EnvDatabaseURL)
	require.NotContains(t, err.Error(), "fix scripts/pg")

	u, err := lookupDatabaseURL("postgres://x@h/db", root)
	require.NoError(t, err)
	require.Equal(t, "postgres://x@h/db", u)

	// A checkout whose script fails: the error says so and names the variable.
	require.NoError(t, os.Mkdir(filepath.Join(root, ".git"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(root, "scripts", "pg"), 0o755))
	_, err = lookupDatabaseURL("", root)
	require.ErrorContains(t, err, "start failed")
	require.ErrorContains(t, err, EnvDatabaseURL)
}
