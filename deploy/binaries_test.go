package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the module's root, seen from this package's directory.
const repoRoot = ".."

// staticBin builds bridge and consumer once per test binary, as `make
// image` does (CGO_ENABLED=0, -trimpath), into a directory removed when
// the process ends: the manifests' checks read their --help, the image
// test packs them.
var staticBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "jsbridge-deploy-bin-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, runtime.GOOS+"_"+runtime.GOARCH)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out+"/", "./cmd/bridge", "./cmd/consumer")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{string(b), err}
	}
	return dir, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := staticBin(); err == nil && dir != "" {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

// binPath is the built binary name ("bridge" or "consumer").
func binPath(t *testing.T, name string) string {
	t.Helper()
	dir, err := staticBin()
	require.NoError(t, err)
	return filepath.Join(dir, runtime.GOOS+"_"+runtime.GOARCH, name)
}

// cliSurface is what a command of a binary accepts, read from its real
// --help: long flag names (without "--"; "[no-]x" gives x and no-x) and
// the environment variables it reads.
type cliSurface struct {
	flags map[string]bool
	envs  map[string]bool
}

var (
	helpFlag = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--(\[no-\])?([a-z][a-z0-9-]*)`)
	helpEnv  = regexp.MustCompile(`\(\$([A-Z][A-Z0-9_]*)((?:,\s*\$[A-Z][A-Z0-9_]*)*)\)`)
	envName  = regexp.MustCompile(`[A-Z][A-Z0-9_]*`)
)

// surface runs `<binary> <command…> --help` and parses it. kong's help
// for a command lists the root's flags too.
func surface(t *testing.T, binary string, command ...string) cliSurface {
	t.Helper()
	out, err := exec.Command(binPath(t, binary), append(command, "--help")...).CombinedOutput()
	require.NoError(t, err, "%s %s --help: %s", binary, strings.Join(command, " "), out)
	s := cliSurface{flags: map[string]bool{}, envs: map[string]bool{}}
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		s.flags[m[2]] = true
		if m[1] != "" {
			s.flags["no-"+m[2]] = true
		}
	}
	for _, m := range helpEnv.FindAllStringSubmatch(string(out), -1) {
		s.envs[m[1]] = true
		for _, e := range envName.FindAllString(m[2], -1) {
			s.envs[e] = true
		}
	}
	require.NotEmpty(t, s.flags, "%s %v --help lists no flag", binary, command)
	require.NotEmpty(t, s.envs, "%s %v --help names no environment variable", binary, command)
	return s
}

// flagName is the name of a command-line argument "--name=value" or
// "--name", "" for one that is not a long flag.
func flagName(arg string) string {
	if !strings.HasPrefix(arg, "--") {
		return ""
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
	return name
}

// checkArgs reports each long flag of args that s does not take.
func (s cliSurface) checkArgs(where string, args []string) []string {
	var out []string
	for _, a := range args {
		if n := flagName(a); n != "" && !s.flags[n] {
			out = append(out, where+": --"+n+" is not a flag of the binary")
		}
	}
	return out
}

func TestSurfaceReadsTheHelp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	t.Parallel()
	s := surface(t, "bridge", "run")
	require.True(t, s.flags["ops-addr"])
	require.True(t, s.flags["no-migrate"])
	require.True(t, s.flags["database-url"], "the root's flags are in run --help")
	require.True(t, s.envs["DATABASE_URL"])
	require.False(t, s.flags["no-such-flag"])
	c := surface(t, "consumer", "run")
	require.True(t, c.flags["config"])
	require.NotEmpty(t, c.checkArgs("x", []string{"--config=/x", "--bogus=1", "run"}))
}
