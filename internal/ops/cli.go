package ops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/jsbridge/jsbridge/wire"
)

// RunCLI is a binary's main: it parses the command line into cli (a
// pointer to a kong grammar, --help built from its tags), runs the chosen
// subcommand with globals (a pointer into cli) and a context.Context bound
// for its Run method, the context ending on SIGINT or SIGTERM, and exits
// with status 1 after printing "<name>: <error>" to stderr when it fails
// (or with the error's ExitCode(), when it has one). The old names of
// renamed are accepted, each with a warning on stderr (ApplyRenames).
func RunCLI(name, description string, cli, globals any, renamed ...Renamed) {
	parser := kong.Must(cli,
		kong.Name(name),
		kong.Description(description+"\n\nEvery flag also reads the environment variable shown beside it."),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		WireVars(),
	)
	args, warnings, err := ApplyRenames(renamed, os.Args[1:], os.LookupEnv, os.Setenv)
	parser.FatalIfErrorf(err)
	for _, w := range warnings {
		fmt.Fprintf(os.Stderr, "%s: warning: %s\n", name, w)
	}
	kctx, err := parser.Parse(args)
	parser.FatalIfErrorf(err)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(globals); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		stop()
		code := 1
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		os.Exit(code)
	}
}

// WireVars are the bus contract's defaults as kong variables, so flag tags
// take them from package wire instead of spelling them again:
// ${events_stream} ("EVENTS"), ${events_prefix} ("events"), ${dlq_stream}
// ("DLQ") and ${dlq_prefix} ("dlq"). RunCLI passes them; a test building
// the grammar with kong.New must pass them too.
func WireVars() kong.Vars {
	return kong.Vars{
		"events_stream": wire.DefaultEventsStream,
		"events_prefix": wire.DefaultEventsPrefix,
		"dlq_stream":    wire.DefaultDLQStream,
		"dlq_prefix":    wire.DefaultDLQPrefix,

		"attempts_stream": wire.DefaultAttemptsStream,
		"attempts_prefix": wire.DefaultAttemptsPrefix,

		"subscriptions_bucket": wire.DefaultSubscriptionsBucket,
	}
}
