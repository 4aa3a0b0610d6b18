package flagdoc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/flagdoc"
)

type grammar struct {
	Level string `name:"level" env:"APP_LEVEL" default:"info"`
	Run   struct {
		Lease  time.Duration `name:"lease" env:"APP_LEASE" default:"30s"`
		Wait   time.Duration `name:"wait" env:"APP_WAIT" default:"0s"`
		Quiet  bool          `name:"quiet" env:"APP_QUIET"`
		Config string        `name:"config" short:"c" env:"APP_CONFIG"`
		User   string        `name:"user" env:"APP_USER"`
		Pass   string        `name:"pass" env:"APP_PASS"`
	} `cmd:""`
}

const readme = "# app\n### app\n\n| flag | env | default | meaning |\n|---|---|---|---|\n" +
	"| `--level` | `APP_LEVEL` | `info` | x |\n" +
	"| `--lease` | `APP_LEASE` | `30s` | x |\n" +
	"| `--wait` | `APP_WAIT` | `0` (forever) | x |\n" +
	"| `--quiet` | `APP_QUIET` | off | x |\n" +
	"| `-c`, `--config` | `APP_CONFIG` | | x |\n" +
	"| `--user`, `--pass` | `APP_USER`, `APP_PASS` | | x |\n" +
	"## next\n| `--other` | `X` | | outside the section |\n"

func problems(t *testing.T, text string) []string {
	t.Helper()
	rows, err := flagdoc.Rows(text, "### app", "## ")
	require.NoError(t, err)
	app, err := kong.New(&grammar{})
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)
	return flagdoc.Problems(rows, flags)
}

func TestProblems(t *testing.T) {
	t.Parallel()
	require.Empty(t, problems(t, readme))
	for _, c := range []struct{ from, to, want string }{
		{"| `--lease` | `APP_LEASE` | `30s`", "| `--lease` | `APP_LEASE` | `10s`", `--lease defaults to "30s", the README says "10s"`},
		{"| `--level` | `APP_LEVEL`", "| `--level` | `APP_LVL`", `--level reads "APP_LEVEL", the README says "APP_LVL"`},
		{"| `--quiet` | `APP_QUIET` | off | x |\n", "", "--quiet is in no README flag table"},
		{"| `--quiet` |", "| `--loud` |", "--loud is not a flag of this command"},
		{"`APP_USER`, `APP_PASS`", "`APP_USER`, `APP_USER`", `--pass reads "APP_PASS", the README says "APP_USER"`},
	} {
		text := replaceOnce(t, readme, c.from, c.to)
		require.Contains(t, strings.Join(problems(t, text), "\n"), c.want, "after replacing %q", c.from)
	}
	_, err := flagdoc.Rows(readme, "### nothing", "")
	require.Error(t, err)

	app, err := kong.New(&grammar{})
	require.NoError(t, err)
	got, err := flagdoc.Check(readme, "### app", "## ", app, "run")
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = flagdoc.Check("# app\n### app\nno table\n", "### app", "", app, "run")
	require.ErrorContains(t, err, "no flag table", "an empty section cannot pass")
}

func replaceOnce(t *testing.T, s, from, to string) string {
	t.Helper()
	require.Contains(t, s, from)
	return strings.Replace(s, from, to, 1)
}
