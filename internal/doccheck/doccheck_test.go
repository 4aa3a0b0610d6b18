package doccheck_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/doccheck"
)

// Pages other branches add; their links are checked once they are here.
var pending = map[string]bool{}

// Every relative link of README.md, CONTRIBUTING.md and docs/*.md points
// to a file that exists, and to a heading its page has.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	broken, err := doccheck.Broken("../..", pending)
	require.NoError(t, err)
	require.Empty(t, broken, "\n%s", strings.Join(broken, "\n"))
}

func TestAnchorsAndLinks(t *testing.T) {
	t.Parallel()
	text := "# Page\n## Durability: what can be lost\n### `bridge verify` (R3)\n```\n# not a heading\n```\n## Page\n" +
		"[a](other.md#x) [b](#page) [c](https://example.com/#y)\n```\n[d](nowhere.md)\n```\n"
	a := doccheck.Anchors(text)
	require.Equal(t, map[string]bool{"page": true, "durability-what-can-be-lost": true, "bridge-verify-r3": true, "page-1": true}, a)
	require.Equal(t, []doccheck.Link{{Target: "docs/other.md", Anchor: "x", Line: 8}, {Anchor: "page", Line: 8}}, doccheck.Links("docs/p.md", text))
	blocks := doccheck.Blocks(text)
	require.Len(t, blocks, 2)
	require.Equal(t, doccheck.Block{Text: "# not a heading\n", Line: 4}, blocks[0])
}

func TestCommands(t *testing.T) {
	t.Parallel()
	text := "```sh\nexport X=1\nOTEL_A=b bin/bridge run --lease 5s …   # a comment\nconsumer run --name 'a b' \\\n  --url \"$U\"\nnats stream ls\n```\n```\nbridge not-sh\n```\n"
	got := doccheck.Commands("p.md", text, "bridge", "consumer")
	require.Equal(t, []doccheck.Command{
		{Page: "p.md", Line: 3, Args: []string{"bin/bridge", "run", "--lease", "5s"}},
		{Page: "p.md", Line: 4, Args: []string{"consumer", "run", "--name", "a b", "--url", "$U"}},
	}, got)
}

// benchFigure is how a result of `make bench` reads in prose: a ratio to
// the reference (0.71) or a memory size (44 MB).
var benchFigure = regexp.MustCompile(`\b0\.\d{2}\b|\b\d+ MB\b`)

// A paragraph that talks about the benchmarks cites docs/benchmarks.md
// (which `make bench` rewrites) rather than repeating its results, which
// would go stale; docs/performance.md keeps the record of past runs.
func TestProseCitesBenchmarks(t *testing.T) {
	t.Parallel()
	pages, err := doccheck.Pages("../..")
	require.NoError(t, err)
	for _, p := range pages {
		if p == "docs/benchmarks.md" || p == "docs/performance.md" || p == "docs/cli.md" {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("../..", p))
		require.NoError(t, err)
		for _, para := range strings.Split(string(raw), "\n\n") {
			if !strings.Contains(para, "bench") {
				continue
			}
			require.Empty(t, benchFigure.FindAllString(para, -1), "%s repeats a benchmark result; cite docs/benchmarks.md instead:\n%s", p, para)
		}
	}
}

// Every go block of the pages is valid Go: a file, declarations, or
// statements of a function body (snippets use names they do not declare,
// so they are parsed, not type-checked).
func TestGoBlocksParse(t *testing.T) {
	t.Parallel()
	pages, err := doccheck.Pages("../..")
	require.NoError(t, err)
	n := 0
	for _, p := range pages {
		raw, err := os.ReadFile(filepath.Join("../..", p))
		require.NoError(t, err)
		for _, b := range doccheck.Blocks(string(raw)) {
			if b.Lang != "go" {
				continue
			}
			n++
			var errs []error
			for _, src := range []string{b.Text, "package p\n" + b.Text, "package p\nfunc _() {\n" + b.Text + "}\n"} {
				_, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
				if err == nil {
					errs = nil
					break
				}
				errs = append(errs, err)
			}
			require.Empty(t, errs, "%s:%d: the go block does not parse", p, b.Line)
		}
	}
	require.Positive(t, n)
}
