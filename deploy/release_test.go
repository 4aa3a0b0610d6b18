//go:build release

// The release check builds goreleaser (tens of minutes on a cold 2-core
// machine) and cross-compiles both binaries four times, so it is not part
// of make test: make release-snapshot runs it (go test -tags release).

package deploy_test

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goreleaserVersion is the goreleaser `make release-snapshot` runs (see
// tool for where it is built and kept).
const goreleaserVersion = "v2.15.1"

// `make release-snapshot`'s run of goreleaser, offline (GOPROXY=off), gives
// one archive per platform (linux and darwin, amd64 and arm64) holding
// both binaries and the install docs, and a checksums file that matches
// them; the binaries report the snapshot's version and the commit.
func TestReleaseSnapshot(t *testing.T) {
	t.Parallel()
	// The repository's config with dist/ moved into a temporary directory,
	// so the test leaves the work tree alone.
	cfg, err := os.ReadFile(filepath.Join(repoRoot, ".goreleaser.yaml"))
	require.NoError(t, err)
	dist := filepath.Join(t.TempDir(), "dist")
	cfgPath := filepath.Join(t.TempDir(), "goreleaser.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(strings.Replace(string(cfg), "\ndist: dist/release\n", "\ndist: "+dist+"\n", 1)), 0o644))

	// Build goreleaser (this may use the module proxy), then run it with
	// the proxy off, as make release-snapshot does: the release builds
	// only what is in the module cache.
	run := exec.Command(tool(t, "github.com/goreleaser/goreleaser/v2", goreleaserVersion),
		"release", "--snapshot", "--clean", "--config", cfgPath)
	run.Dir = repoRoot
	run.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	b, err := run.CombinedOutput()
	require.NoError(t, err, "goreleaser: %s", b)

	// checksums.txt: "<sha256>  <archive>" for each archive, and they match.
	f, err := os.Open(filepath.Join(dist, "checksums.txt"))
	require.NoError(t, err)
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		require.Len(t, fields, 2, "checksums.txt line %q", sc.Text())
		sums[fields[1]] = fields[0]
	}
	require.NoError(t, sc.Err())
	var archives []string
	for name := range sums {
		archives = append(archives, name)
	}
	slices.Sort(archives)
	require.Len(t, archives, 4, "archives: %v", archives)
	version := strings.TrimPrefix(strings.TrimSuffix(archives[0], "_darwin_amd64.tar.gz"), "jsbridge_")
	require.True(t, strings.HasSuffix(version, "-snapshot"), "version %q", version)
	var want []string
	for _, p := range []string{"darwin_amd64", "darwin_arm64", "linux_amd64", "linux_arm64"} {
		want = append(want, "jsbridge_"+version+"_"+p+".tar.gz")
	}
	require.Equal(t, want, archives)

	// The commit goreleaser stamps: HEAD, or "none" in a repository without
	// a tag (goreleaser then fakes its git state: v0.0.0, commit none).
	head, err := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	commit := strings.TrimSpace(string(head))
	if exec.Command("git", "-C", repoRoot, "describe", "--tags").Run() != nil {
		commit = "none"
	}
	for _, a := range archives {
		data, err := os.ReadFile(filepath.Join(dist, a))
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		require.Equal(t, sums[a], hex.EncodeToString(sum[:]), "checksum of %s", a)
		files := untar(t, filepath.Join(dist, a))
		names := make([]string, 0, len(files))
		for n := range files {
			names = append(names, n)
		}
		slices.Sort(names)
		require.Equal(t, []string{"README.md", "bridge", "consumer", "docs/deploy.md", "docs/install.md"}, names, a)
		if !strings.HasSuffix(a, "_"+runtime.GOOS+"_"+runtime.GOARCH+".tar.gz") {
			continue
		}
		dir := t.TempDir()
		for _, b := range []string{"bridge", "consumer"} {
			p := filepath.Join(dir, b)
			require.NoError(t, os.WriteFile(p, files[b], 0o755))
			out, err := exec.Command(p, "version").CombinedOutput()
			require.NoError(t, err, "%s version: %s", b, out)
			require.Contains(t, string(out), "version: v"+version+"\n", b)
			require.Contains(t, string(out), "commit:  "+commit+"\n", b)
			require.NotContains(t, string(out), "built:   unknown", b)
		}
	}
}

// untar returns the regular files of a .tar.gz by name.
func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = data
	}
}
