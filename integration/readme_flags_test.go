package integration

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	helpFlag = regexp.MustCompile(`(?m)^ +(?:-[a-z], )?--(?:\[no-\])?([a-z0-9-]+)`)
	helpEnv  = regexp.MustCompile(`\(\$([A-Z0-9_]+)\)`)
)

// TestREADMEDocumentsEveryFlag: every flag and environment variable a
// subcommand's --help shows is in docs/cli.md (the CLI reference), so the
// reference cannot fall behind the built binaries.
func TestREADMEDocumentsEveryFlag(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../docs/cli.md")
	require.NoError(t, err)
	for _, cmd := range [][]string{
		{"bridge", "run"}, {"bridge", "migrate"}, {"bridge", "append"}, {"bridge", "streams"}, {"bridge", "unblock"}, {"bridge", "reset"}, {"bridge", "verify"},
		{"consumer", "run"}, {"consumer", "dlq", "list"}, {"consumer", "dlq", "replay"}, {"consumer", "dlq", "skip"}, {"consumer", "dlq", "purge"}, {"consumer", "trace"}, {"consumer", "status"},
	} {
		out, err := cli(t, nil, cmd[0], append(cmd[1:], "--help")...)
		require.NoError(t, err, out)
		// Kong wraps help lines at spaces, never inside "($NAME)".
		flat := strings.Join(strings.Fields(out), " ")
		for _, m := range helpFlag.FindAllStringSubmatch(out, -1) {
			documented := regexp.MustCompile(`--(\[no-\])?` + regexp.QuoteMeta(m[1]) + `\b`)
			require.True(t, documented.Match(readme), "%v --help shows --%s, which docs/cli.md does not document", cmd, m[1])
		}
		for _, m := range helpEnv.FindAllStringSubmatch(flat, -1) {
			require.Contains(t, string(readme), "`"+m[1]+"`", "%v --help shows $%s, which docs/cli.md does not document", cmd, m[1])
		}
	}
}
