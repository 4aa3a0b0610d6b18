package integration

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The exit statuses docs/operations.md gives are the binaries': what the
// command line parser refuses (an unknown flag, a value that does not
// parse, a --config file that does not exist) exits 80, nothing started;
// a flag value the program refuses exits 1.
func TestDocExitStatuses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	t.Parallel()
	raw, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	doc := string(raw)
	row80 := rowOf(t, doc, "| 80 |")
	for _, says := range []string{"unknown flag", "does not parse", "does not exist"} {
		require.Contains(t, row80, says)
	}
	require.Contains(t, rowOf(t, doc, "| 1 |"), "one of the causes")

	for _, c := range []struct {
		code int
		args []string
	}{
		{80, []string{"bridge", "run", "--no-such-flag"}},
		{80, []string{"bridge", "run", "--lease", "5x"}},
		{80, []string{"consumer", "run", "-c", "/nonexistent/subscriptions.yaml"}},
		{80, []string{"consumer", "no-such-command"}},
		// A configuration that waiting cannot fix (a loopback endpoint
		// without allow_private), refused before NATS is dialled.
		{1, []string{"consumer", "run", "--url", "https://127.0.0.1/", "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "--ops-addr", "", "--nats-url", "nats://127.0.0.1:1"}},
	} {
		out, err := cli(t, nil, c.args[0], c.args[1:]...)
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%v: %v\n%s", c.args, err, out)
		require.Equal(t, c.code, exit.ExitCode(), "%v:\n%s", c.args, out)
	}
}

// rowOf returns the line of doc that starts with prefix.
func rowOf(t *testing.T, doc, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %q", prefix)
	return ""
}
