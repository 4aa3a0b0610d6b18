package clidoc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/clidoc"
	"github.com/jsbridge/jsbridge/internal/flagdoc"
)

type grammar struct {
	Level string `name:"level" env:"APP_LEVEL" default:"info" help:"Log level | verbosity."`
	Run   struct {
		Lease  time.Duration `name:"lease" env:"APP_LEASE,OLD_LEASE" default:"30s" aliases:"ttl" help:"Lease of <name>."`
		Quiet  bool          `name:"quiet" negatable:"" default:"true" help:"Quiet."`
		Config string        `name:"config" short:"c" help:"File."`
		Secret string        `name:"secret" hidden:"" help:"Hidden."`
	} `cmd:"" help:"Run it."`
	Tool struct {
		Get struct {
			Key string `arg:"" help:"The key."`
		} `cmd:"" help:"Get one."`
	} `cmd:"" help:"Tools."`
	Internal struct{} `cmd:"" hidden:""`
}

func TestRender(t *testing.T) {
	t.Parallel()
	app, err := kong.New(&grammar{}, kong.Name("app"))
	require.NoError(t, err)
	got := clidoc.Render(app)
	for _, want := range []string{
		"## app\n",
		"| `--level` | `APP_LEVEL` | `info` | Log level \\| verbosity. |",
		"### app run\n\n`app run [flags]`\n\nRun it.\n",
		"| `--lease` | `APP_LEASE`, `OLD_LEASE` | `30s` | Lease of &lt;name>. Also spelled --ttl (old name, deprecated). |",
		"| `--[no-]quiet` |  | on | Quiet. |",
		"| `-c`, `--config` |  |  | File. |",
		"### app tool\n\n`app tool <command>`",
		"### app tool get\n\n`app tool get <key> [flags]`",
		"- `<key>`: The key.",
	} {
		require.Contains(t, got, want)
	}
	require.NotContains(t, got, "secret")
	require.NotContains(t, got, "internal")
	require.NotContains(t, got, "--help")

	// The tables are what flagdoc reads: the rendering passes its check.
	rows, err := flagdoc.Rows(got, "### app run", "#")
	require.NoError(t, err)
	global, err := flagdoc.Rows(got, "## app", "#")
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)
	require.Empty(t, flagdoc.Problems(append(global, rows...), flags))
}

func TestSplice(t *testing.T) {
	t.Parallel()
	doc := "# Ref\n\nintro\n\n## a\n\nold a\n\n## b\n\nold b\n"
	require.Equal(t, "# Ref\n\nintro\n\n## a\n\nnew a\n\n## b\n\nold b\n", clidoc.Splice(doc, "## a\n\nnew a\n\n"))
	require.Equal(t, "# Ref\n\nintro\n\n## a\n\nold a\n\n## b\n\nnew b\n", clidoc.Splice(doc, "## b\n\nnew b\n"))
	require.Equal(t, "# Ref\n\nintro\n\n## c\n\nc\n", clidoc.Splice("# Ref\n\nintro\n", "## c\n\nc\n"))
	require.True(t, strings.HasPrefix(clidoc.Header, "# Command-line reference"))
}
