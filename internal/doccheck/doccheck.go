// Package doccheck reads the project's Markdown pages (README.md,
// CONTRIBUTING.md, docs/*.md) for the tests that keep them true: the
// relative links and their anchors, and the fenced code blocks a reader is
// told to run.
package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Pages returns the Markdown pages under root (the repository's top
// directory): README.md, CONTRIBUTING.md and docs/*.md, as paths relative
// to root with forward slashes.
func Pages(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	pages := []string{"README.md", "CONTRIBUTING.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			return nil, err
		}
		pages = append(pages, filepath.ToSlash(rel))
	}
	return pages, nil
}

// Block is a fenced code block: its language ("sh", "yaml", "" for none),
// its text (with a final newline) and the line of its opening fence.
type Block struct {
	Lang string
	Text string
	Line int
}

// Blocks returns the fenced code blocks of a page's text, in order.
func Blocks(text string) []Block {
	var out []Block
	var cur *Block
	for i, l := range strings.Split(text, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &Block{Lang: strings.TrimSpace(strings.TrimPrefix(l, "```")), Line: i + 1}
		case cur != nil && strings.HasPrefix(l, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.Text += l + "\n"
		}
	}
	return out
}

var (
	heading = regexp.MustCompile(`^#{1,6} +(.*)$`)
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// What GitHub drops from a heading's text to make its anchor.
	notSlug = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// Anchors returns the anchors of a page's headings as GitHub makes them:
// lower case, punctuation dropped, spaces as '-', a repeated one suffixed
// "-1", "-2", ...; headings inside code blocks do not count.
func Anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		m := heading.FindStringSubmatch(l)
		if fence || m == nil {
			continue
		}
		slug := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[1])), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// Link is a relative link of a page: the page it points to (relative to
// the repository's top, "" for the same page) and its anchor ("" for
// none).
type Link struct {
	Target, Anchor string
	Line           int
}

// Links returns the relative links of page (a path relative to the
// repository's top) outside code blocks; absolute URLs (with a scheme)
// and mailto links are left out.
func Links(page, text string) []Link {
	var out []Link
	fence := false
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(l, -1) {
			dest := m[1]
			if strings.Contains(dest, "://") || strings.HasPrefix(dest, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(dest, "#")
			if target != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), target)))
			}
			out = append(out, Link{Target: target, Anchor: anchor, Line: i + 1})
		}
	}
	return out
}

// Broken returns one line per relative link of the pages under root that
// points to no file, or to an anchor its page does not have. Links to a
// page in pending (pages other branches add) are not checked.
func Broken(root string, pending map[string]bool) ([]string, error) {
	pages, err := Pages(root)
	if err != nil {
		return nil, err
	}
	texts := map[string]string{}
	read := func(p string) (string, error) {
		if t, ok := texts[p]; ok {
			return t, nil
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return "", err
		}
		texts[p] = string(b)
		return string(b), nil
	}
	var out []string
	for _, p := range pages {
		text, err := read(p)
		if err != nil {
			return nil, err
		}
		for _, l := range Links(p, text) {
			target := l.Target
			if target == "" {
				target = p
			}
			if pending[target] {
				continue
			}
			t, err := read(target)
			if err != nil {
				out = append(out, fmt.Sprintf("%s:%d: %s does not exist", p, l.Line, target))
				continue
			}
			if l.Anchor != "" && strings.HasSuffix(target, ".md") && !Anchors(t)[l.Anchor] {
				out = append(out, fmt.Sprintf("%s:%d: %s has no heading #%s", p, l.Line, target, l.Anchor))
			}
		}
	}
	return out, nil
}

// Command is one command line of a page's sh block: its words (quotes
// removed, "…" placeholders dropped, leading VAR=value assignments and a
// trailing # comment left out) and where it is.
type Command struct {
	Page string
	Line int
	Args []string
}

// Commands returns the command lines of the sh blocks of page whose
// program's base name is one of programs (e.g. "bridge"); a line ending
// in '\' continues on the next.
func Commands(page, text string, programs ...string) []Command {
	var out []Command
	for _, b := range Blocks(text) {
		if b.Lang != "sh" {
			continue
		}
		lines := strings.Split(strings.TrimRight(b.Text, "\n"), "\n")
		for i := 0; i < len(lines); i++ {
			start := i
			line := lines[i]
			for strings.HasSuffix(strings.TrimSpace(line), `\`) && i+1 < len(lines) {
				line = strings.TrimSuffix(strings.TrimSpace(line), `\`) + " " + lines[i+1]
				i++
			}
			args := Words(line)
			for len(args) > 0 && strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "-") {
				args = args[1:]
			}
			for k, a := range args { // a redirection or pipe ends the command
				if a == "<" || a == ">" || a == "|" || a == "&&" {
					args = args[:k]
					break
				}
			}
			if len(args) == 0 {
				continue
			}
			for _, p := range programs {
				if filepath.Base(args[0]) == p {
					out = append(out, Command{Page: page, Line: b.Line + 1 + start, Args: args})
				}
			}
		}
	}
	return out
}

// Words splits a shell line into words: single and double quotes group
// (without expanding anything), an unquoted # starts a comment, and "…"
// placeholders are dropped.
func Words(line string) []string {
	var out []string
	var cur strings.Builder
	quote, started := rune(0), false
	flush := func() {
		if started && cur.String() != "…" {
			out = append(out, cur.String())
		}
		cur.Reset()
		started = false
	}
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, started = r, true
		case r == '#' && !started:
			flush()
			return out
		case r == ' ' || r == '\t':
			flush()
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	flush()
	return out
}
