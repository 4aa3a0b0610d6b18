package main

//go:generate go run . cli-reference --write ../../docs/cli.md

import (
	"github.com/alecthomas/kong"

	"github.com/jsbridge/jsbridge/internal/clidoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// cliReferenceCmd prints (or writes into docs/cli.md) this binary's
// command-line reference, generated from the flag definitions; hidden from
// --help. `make docs` and `go generate ./cmd/...` run it.
type cliReferenceCmd struct {
	Write string `name:"write" placeholder:"FILE" help:"Replace this binary's section of FILE (e.g. docs/cli.md) instead of printing it."`
}

func (c *cliReferenceCmd) Run() error {
	return clidoc.Command(reference, c.Write)
}

// reference is the "## consumer" section of docs/cli.md.
func reference() (string, error) {
	app, err := kong.New(&cli{}, kong.Name("consumer"), ops.WireVars())
	if err != nil {
		return "", err
	}
	return clidoc.Render(app), nil
}
