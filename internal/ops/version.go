package ops

import (
	"fmt"
	"io"
	"os"

	"github.com/alecthomas/kong"

	"github.com/jsbridge/jsbridge/internal/buildinfo"
)

// VersionCmd is the `version` subcommand of every binary: it prints the
// module version, commit, build date, Go toolchain and module path
// (buildinfo.Info.Long) to stdout and exits 0.
type VersionCmd struct{}

// Run prints the version of the binary kctx names.
func (VersionCmd) Run(kctx *kong.Context) error {
	return printVersion(kctx.Stdout, buildinfo.Read().Long(kctx.Model.Name))
}

// VersionFlag is --version on every binary: it prints buildinfo's one-line
// form and exits 0 before any command runs or any required flag is
// checked.
type VersionFlag bool

// BeforeReset prints the version and exits; kong calls it when the flag
// is given.
func (VersionFlag) BeforeReset(app *kong.Kong) error {
	if err := printVersion(app.Stdout, buildinfo.Read().Line(app.Model.Name)+"\n"); err != nil {
		return err
	}
	app.Exit(0)
	return nil
}

func printVersion(w io.Writer, s string) error {
	if w == nil {
		w = os.Stdout
	}
	_, err := fmt.Fprint(w, s)
	return err
}
