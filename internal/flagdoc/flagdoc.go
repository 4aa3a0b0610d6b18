// Package flagdoc checks that the docs' flag tables (docs/cli.md) say what a binary's
// command line does: every flag of a command is in a table, every flag in a
// table exists, and its environment variable and default are the code's.
// The binaries' tests call it, so the reference cannot drift from --help.
package flagdoc

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/alecthomas/kong"
)

// Row is one row of a README flag table: the flags of its first cell (a
// cell may name several, e.g. "`--nats-user`, `--nats-password`"), the
// environment variables of its second (one per flag, in the same order),
// and the default of its third (the first backquoted value; "" when the
// cell has none, e.g. "(required)").
type Row struct {
	Flags   []string
	Envs    []string
	Default string
	Line    int
}

var (
	// A long flag ("`--lease`", "`--[no-]migrate`"); short ones ("`-c`")
	// stand beside their long form and are not matched.
	flagName  = regexp.MustCompile("`--(?:\\[no-\\])?([a-z][a-z0-9-]*)`")
	backquote = regexp.MustCompile("`([^`]*)`")
)

// Rows returns the flag-table rows of readme between the line starting
// with from and the next line starting with until ("" for the end).
// A flag-table row is a Markdown table row whose first cell starts with a
// backquoted "-".
func Rows(readme, from, until string) ([]Row, error) {
	lines := strings.Split(readme, "\n")
	start := -1
	for i, l := range lines {
		if start < 0 && strings.HasPrefix(l, from) {
			start = i
			continue
		}
		if start >= 0 && until != "" && strings.HasPrefix(l, until) {
			lines = lines[:i]
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("README has no line starting with %q", from)
	}
	var rows []Row
	for i := start; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|"), "|")
		for k := range cells {
			cells[k] = strings.TrimSpace(cells[k])
		}
		if len(cells) < 3 || !strings.HasPrefix(cells[0], "`-") {
			continue
		}
		r := Row{Line: i + 1}
		for _, m := range flagName.FindAllStringSubmatch(cells[0], -1) {
			r.Flags = append(r.Flags, m[1])
		}
		for _, m := range backquote.FindAllStringSubmatch(cells[1], -1) {
			r.Envs = append(r.Envs, m[1])
		}
		if m := backquote.FindStringSubmatch(cells[2]); m != nil {
			r.Default = m[1]
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// Flags returns the flags a command takes: those of the root and of the
// command at path (e.g. "run"), without --help, --version and hidden
// ones, by name.
func Flags(app *kong.Kong, path ...string) (map[string]*kong.Flag, error) {
	out := map[string]*kong.Flag{}
	add := func(n *kong.Node) {
		for _, f := range n.Flags {
			if f.Name != "help" && f.Name != "version" && !f.Hidden {
				out[f.Name] = f
			}
		}
	}
	node := app.Model.Node
	add(node)
	for _, name := range path {
		var next *kong.Node
		for _, c := range node.Children {
			if c.Name == name {
				next = c
			}
		}
		if next == nil {
			return nil, fmt.Errorf("no command %q under %q", name, node.Name)
		}
		node = next
		add(node)
	}
	return out, nil
}

// Problems compares rows with flags: a flag missing from the rows, a row
// naming a flag the command does not take, or a row whose environment
// variable or default is not the flag's. A row's default is compared only
// when the flag has one and is not a bool (bools read "off"/"on"); a
// duration default of "0s" may be written "0". A row naming several flags
// without an environment variable ("as for the bridge") is checked for the
// flags' existence only.
func Problems(rows []Row, flags map[string]*kong.Flag) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range rows {
		for i, name := range r.Flags {
			seen[name] = true
			f, ok := flags[name]
			if !ok {
				out = append(out, fmt.Sprintf("README line %d: --%s is not a flag of this command", r.Line, name))
				continue
			}
			if len(r.Flags) > 1 && len(r.Envs) == 0 {
				continue // "`--log-format`, `--log-level` | as for the bridge"
			}
			want := ""
			if i < len(r.Envs) {
				want = r.Envs[i]
			}
			if env := firstEnv(f); env != want {
				out = append(out, fmt.Sprintf("README line %d: --%s reads %q, the README says %q", r.Line, name, env, want))
			}
			if f.IsBool() || !f.HasDefault {
				continue
			}
			if r.Default != f.Default && !(f.Default == "0s" && r.Default == "0") {
				out = append(out, fmt.Sprintf("README line %d: --%s defaults to %q, the README says %q", r.Line, name, f.Default, r.Default))
			}
		}
	}
	for name := range flags {
		if !seen[name] {
			out = append(out, fmt.Sprintf("--%s is in no README flag table", name))
		}
	}
	return out
}

// Check compares the flag tables of readme between the lines starting with
// from and until (see Rows) with the flags of the command at path of app
// (see Flags) and returns the Problems. It fails when the section has no
// flag table or the command no flag, so it cannot pass by reading nothing.
func Check(readme, from, until string, app *kong.Kong, path ...string) ([]string, error) {
	rows, err := Rows(readme, from, until)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("README has no flag table between %q and %q", from, until)
	}
	flags, err := Flags(app, path...)
	if err != nil {
		return nil, err
	}
	if len(flags) == 0 {
		return nil, fmt.Errorf("command %q has no flags", strings.Join(path, " "))
	}
	return Problems(rows, flags), nil
}

func firstEnv(f *kong.Flag) string {
	if len(f.Envs) == 0 {
		return ""
	}
	return f.Envs[0]
}

// Reference checks binary's section of the CLI reference doc (docs/cli.md)
// against app: for each visible leaf command, its "### <binary> <path>"
// table and the section's table of flags every command takes, together,
// against the command's flags (Problems). It returns the problems, each
// prefixed with the command ("bridge run: ..."), and an error when a
// table cannot be read.
func Reference(doc, binary string, app *kong.Kong) ([]string, error) {
	global, err := Rows(doc, "## "+binary, "#")
	if err != nil {
		return nil, err
	}
	if len(global) == 0 {
		return nil, fmt.Errorf("flagdoc: no table of the flags every %s command takes", binary)
	}
	var problems []string
	var walk func(n *kong.Node, path []string) error
	walk = func(n *kong.Node, path []string) error {
		for _, c := range n.Children {
			if c.Hidden || c.Type != kong.CommandNode {
				continue
			}
			p := append(append([]string(nil), path...), c.Name)
			if len(c.Children) > 0 {
				if err := walk(c, p); err != nil {
					return err
				}
				continue
			}
			cmd := binary + " " + strings.Join(p, " ")
			rows, err := Rows(doc, "### "+cmd, "#")
			if err != nil {
				return err
			}
			flags, err := Flags(app, p...)
			if err != nil {
				return err
			}
			for _, pr := range Problems(append(rows, global...), flags) {
				problems = append(problems, cmd+": "+pr)
			}
		}
		return nil
	}
	if err := walk(app.Model.Node, nil); err != nil {
		return nil, err
	}
	return problems, nil
}
