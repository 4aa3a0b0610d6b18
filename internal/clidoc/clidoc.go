// Package clidoc writes a binary's command-line reference as Markdown from
// its kong model: every command, its arguments and its flags with their
// environment variables and defaults. docs/cli.md is its output for both
// binaries (`make docs`), and each binary's test fails when the page
// differs from what Render gives, so the reference cannot drift from the
// flag definitions.
package clidoc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/alecthomas/kong"
)

// Render returns the reference of app as one Markdown section: a "## name"
// heading, the flags every command takes, then one "### name command"
// section per visible command (depth first, in declaration order) with its
// usage line, help and own flags. Hidden commands and flags, --help and --version,
// are left out. Tables have the columns flag | env | default | meaning, the
// shape package flagdoc reads.
func Render(app *kong.Kong) string {
	var b strings.Builder
	root := app.Model.Node
	fmt.Fprintf(&b, "## %s\n\n", root.Name)
	if root.Help != "" {
		fmt.Fprintf(&b, "%s\n\n", cell(oneLine(root.Help)))
	}
	b.WriteString("Flags every command of " + code(root.Name) + " takes:\n\n")
	table(&b, root.Flags)
	for _, c := range commands(root) {
		fmt.Fprintf(&b, "### %s\n\n", strings.TrimSpace(root.Name+" "+c.Path()))
		fmt.Fprintf(&b, "%s\n\n", code(usage(root.Name, c)))
		if c.Help != "" {
			fmt.Fprintf(&b, "%s\n\n", cell(oneLine(c.Help)))
		}
		for _, a := range c.Positional {
			fmt.Fprintf(&b, "- %s: %s\n", code(a.Summary()), cell(oneLine(a.Help)))
		}
		if len(c.Positional) > 0 {
			b.WriteString("\n")
		}
		if len(visible(c.Flags)) > 0 {
			table(&b, c.Flags)
		}
	}
	return b.String()
}

// Splice returns doc with the section Render wrote for app's binary (from
// its "## name" line to the next "## " line or the end) replaced by
// section; a doc without that section gets it appended.
func Splice(doc, section string) string {
	name := strings.SplitN(section, "\n", 2)[0] + "\n"
	start := strings.Index(doc, "\n"+name)
	if start < 0 {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	start++
	end := strings.Index(doc[start+len(name):], "\n## ")
	if end < 0 {
		return doc[:start] + section
	}
	return doc[:start] + section + doc[start+len(name)+end+1:]
}

// commands lists the visible commands under n, depth first; a command with
// subcommands is listed before them.
func commands(n *kong.Node) []*kong.Node {
	var out []*kong.Node
	for _, c := range n.Children {
		if c.Hidden || c.Type != kong.CommandNode {
			continue
		}
		out = append(out, c)
		out = append(out, commands(c)...)
	}
	return out
}

func usage(binary string, c *kong.Node) string {
	u := strings.TrimSpace(binary + " " + c.Path())
	if len(c.Children) > 0 {
		return u + " <command>"
	}
	for _, a := range c.Positional {
		u += " " + a.Summary()
	}
	return u + " [flags]"
}

func visible(flags []*kong.Flag) []*kong.Flag {
	var out []*kong.Flag
	for _, f := range flags {
		if f.Hidden || f.Name == "help" || f.Name == "version" { // both said in Header
			continue
		}
		out = append(out, f)
	}
	return out
}

func table(b *strings.Builder, flags []*kong.Flag) {
	b.WriteString("| flag | env | default | meaning |\n|---|---|---|---|\n")
	for _, f := range visible(flags) {
		name := "`--" + f.Name + "`"
		if f.Tag != nil && f.Tag.Negatable != "" {
			name = "`--[no-]" + f.Name + "`"
		}
		if f.Short != 0 {
			name = fmt.Sprintf("`-%c`, %s", f.Short, name)
		}
		var envs []string
		for _, e := range f.Envs {
			envs = append(envs, code(e))
		}
		meaning := oneLine(f.Help)
		if len(f.Aliases) > 0 {
			meaning += " Also spelled --" + strings.Join(f.Aliases, ", --") + " (old name, deprecated)."
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, strings.Join(envs, ", "), defaultOf(f), cell(meaning))
	}
	b.WriteString("\n")
}

// defaultOf is the default column: a bool's on/off, a value's default in
// backquotes, "(required)" or empty.
func defaultOf(f *kong.Flag) string {
	switch {
	case f.IsBool():
		if f.Default == "true" {
			return "on"
		}
		return "off"
	case f.Required:
		return "(required)"
	case f.HasDefault && f.Default != "":
		return code(f.Default)
	}
	return ""
}

func code(s string) string {
	if strings.Contains(s, "`") {
		return "``" + s + "``"
	}
	return "`" + s + "`"
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// cell makes help text safe in Markdown: a '|' would end a table cell,
// and "<subscription>" would be read as an HTML tag and vanish.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;").Replace(s)
}

// Command is the body of a binary's hidden `cli-reference` command: it
// prints the section reference returns, or with file set splices it into
// that file (see Splice), creating the file with Header when missing.
func Command(reference func() (string, error), file string) error {
	section, err := reference()
	if err != nil {
		return err
	}
	if file == "" {
		_, err := os.Stdout.WriteString(section)
		return err
	}
	doc, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		doc, err = []byte(Header), nil
	}
	if err != nil {
		return err
	}
	return os.WriteFile(file, []byte(Splice(string(doc), section)), 0o644)
}

// Header opens a new docs/cli.md, before the binaries' sections.
const Header = `# Command-line reference

Generated from the flag definitions by ` + "`make docs`" + ` (each binary's hidden
` + "`cli-reference`" + ` command); a test fails when this page differs from them.
Every flag also reads the environment variable shown beside it, and
` + "`-h`, `--help`" + ` on any command prints its help; ` + "`--version`" + ` prints the
binary's version on one line (its ` + "`version`" + ` command, in full).
`
