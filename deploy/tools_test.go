package deploy_test

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tool returns the path of the command pkg@version (e.g.
// helm.sh/helm/v3/cmd/helm@v3.22.0), building it from the module proxy
// with `go install` the first time. Built tools are kept in
// $JSBRIDGE_TOOLS, by default <user cache dir>/jsbridge-tools, under
// <name>@<version>: outside the Go build cache, so a CI run with an empty
// build cache (.ci/run) on a machine that built them before does not
// rebuild them (goreleaser takes minutes cold). The make targets use the
// same place.
func tool(t *testing.T, pkg, version string) string {
	t.Helper()
	dir := os.Getenv("JSBRIDGE_TOOLS")
	if dir == "" {
		cache, err := os.UserCacheDir()
		require.NoError(t, err)
		dir = filepath.Join(cache, "jsbridge-tools")
	}
	name := path.Base(pkg)
	if strings.HasPrefix(name, "v") && strings.Count(pkg, "/") > 2 { // github.com/goreleaser/goreleaser/v2
		name = path.Base(path.Dir(pkg))
	}
	bin := filepath.Join(dir, name+"@"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	tmp, err := os.MkdirTemp(dir, ".build-")
	require.NoError(t, err)
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", pkg+"@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go install %s@%s: %s", pkg, version, out)
	// Rename is atomic: tests building the same tool at once both succeed.
	require.NoError(t, os.Rename(filepath.Join(tmp, name), bin))
	return bin
}
