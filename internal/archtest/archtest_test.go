package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/jsbridge/jsbridge"

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string
}

// graph is the module's packages and everything they import, by import path.
type graph map[string]pkg

// loadGraph runs go list over the whole module, from the module's root.
func loadGraph(t *testing.T) graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Standard,Imports", "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		g[p.ImportPath] = p
	}
	return g
}

// paths returns, for every package from imports (transitively, itself
// excluded), one import chain that leads to it from from.
func (g graph) paths(from string) map[string][]string {
	seen := map[string][]string{from: {from}}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, imp := range g[cur].Imports {
			if _, ok := seen[imp]; ok || imp == "C" {
				continue
			}
			seen[imp] = append(slices.Clone(seen[cur]), imp)
			queue = append(queue, imp)
		}
	}
	delete(seen, from)
	return seen
}

// rule is what one package of the module may reach through its imports.
type rule struct {
	// pkg is relative to the module ("drain").
	pkg string
	// forbidden are import path prefixes no dependency may have.
	forbidden []string
	// except are import paths a forbidden prefix does not cover.
	except []string
	// only, when not nil, are the module's packages (relative) and the
	// third-party packages (full path) allowed besides the standard
	// library; everything else is forbidden.
	only []string
	why  string
}

var (
	nats     = "github.com/nats-io/"
	postgres = "github.com/jackc/"
	// otelSDK is OpenTelemetry's SDK and exporters: only the binaries
	// (internal/otelenv) pull them in; the public packages speak the API.
	otelSDK = "go.opentelemetry.io/otel/sdk"
	otelExp = "go.opentelemetry.io/otel/exporters/"
	// clock is the injectable clock the engines take.
	clock = "github.com/jonboulle/clockwork"
	// gsl is nats-server's generic subject trie: standard library only.
	gsl = "github.com/nats-io/nats-server/v2/server/gsl"
)

var rules = []rule{
	{pkg: "event", only: []string{}, why: "the event type everyone speaks depends on nothing"},
	{pkg: "wire", only: []string{}, why: "the bus contract is importable by every process and receiver: standard library only"},
	{pkg: "drain", only: []string{"event", clock}, forbidden: []string{nats, postgres}, why: "the drain knows nothing of NATS or Postgres: the store and the handler are interfaces; time comes from an injected clock"},
	{pkg: "forward", forbidden: []string{postgres, module + "/store", otelSDK, otelExp}, why: "forward knows nothing of Postgres, and traces through the OpenTelemetry API only"},
	{pkg: "store", forbidden: []string{nats, module + "/drain", module + "/forward"}, why: "the store knows nothing of the bus or the loop that drives it"},
	{pkg: "webhook", only: []string{"event", "wire"}, forbidden: []string{nats, postgres}, why: "receivers import webhook alone: no NATS, no Postgres, no third-party code"},
	{pkg: "webhook/pgstore", forbidden: []string{nats}, why: "the receivers' Postgres idempotency store knows nothing of NATS"},
	{pkg: "breaker", forbidden: []string{nats, postgres}, why: "circuit breakers know nothing of the bus or the store"},
	{pkg: "bridge", forbidden: []string{module + "/jsbridgetest", module + "/embedded", module + "/cmd/", module + "/internal/startup", module + "/internal/ops", "github.com/nats-io/nats-server", "github.com/alecthomas/kong", otelSDK, otelExp}, why: "an application that embeds the bridge pulls in no NATS server, CLI, ops port or OpenTelemetry SDK"},
	{pkg: "consumer", forbidden: []string{module + "/jsbridgetest", postgres, module + "/store", module + "/drain", module + "/forward", module + "/bridge", module + "/embedded", module + "/cmd/", module + "/internal/ops", "github.com/nats-io/nats-server", "github.com/alecthomas/kong", otelSDK, otelExp}, except: []string{gsl}, why: "an application that embeds the consumer pulls in no Postgres, bridge, NATS server, CLI, ops port or OpenTelemetry SDK (but the server's subject trie, gsl, which imports only the standard library: the shared engine matches its subscriptions' filters with it, by the server's own rules)"},
	{pkg: "jsbridgetest", forbidden: []string{module + "/internal/natsconn", module + "/cmd/", module + "/internal/ops", module + "/internal/flagdoc", "github.com/alecthomas/kong"}, why: "the test kit is built from the public packages an application uses, not from the binaries"},
	{pkg: "internal/audit", forbidden: []string{postgres, module + "/store"}, why: "verify reads Postgres through an interface the bridge plugs the store into"},
	{pkg: "internal/deliver/base", only: []string{clock}, why: "the engine's archetype (clock, logger, replica id) is its lowest floor: every room takes it, so it imports no room and nothing but the clock"},
	{pkg: "internal/deliver/owner", forbidden: []string{module + "/internal/deliver", module + "/internal/deliver/", module + "/breaker", module + "/webhook", postgres, otelSDK, otelExp}, except: []string{module + "/internal/deliver/base"}, why: "partition ownership (membership, share, leases, epochs, the lease fence) is what the engine builds on: it imports neither the engine's root nor another room (but the archetype every room takes, base), and knows nothing of attempts, breakers or webhooks"},
	{pkg: "internal/deliver", forbidden: []string{postgres, module + "/store", module + "/drain", module + "/forward", otelSDK, otelExp}, why: "the consumer's engine knows nothing of Postgres or the bridge, and traces through the OpenTelemetry API only"},
}

// TestImportRules checks every rule against the module's package graph.
func TestImportRules(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)

	// The graph must be the real one, or every rule would pass vacuously.
	for _, want := range [][2]string{{"forward", "github.com/nats-io/nats.go"}, {"store", "github.com/jackc/pgx/v5"}, {"drain", module + "/event"}} {
		if _, ok := g.paths(module + "/" + want[0])[want[1]]; !ok {
			t.Fatalf("go list graph: %s does not reach %s; the graph is incomplete", want[0], want[1])
		}
	}

	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			t.Parallel()
			from := module + "/" + r.pkg
			if _, ok := g[from]; !ok {
				t.Fatalf("package %s is not in the module (rename the rule with it)", from)
			}
			for dep, chain := range g.paths(from) {
				if bad := r.violation(g, dep); bad != "" {
					t.Errorf("%s imports %s (%s); the rule: %s\n\timport chain: %s",
						r.pkg, dep, bad, r.why, strings.Join(chain, " → "))
				}
			}
		})
	}
}

// violation says why dep breaks r, or "" when it does not.
func (r rule) violation(g graph, dep string) string {
	for _, f := range r.forbidden {
		if (dep == f || strings.HasPrefix(dep, f)) && !slices.Contains(r.except, dep) {
			return "forbidden: " + f
		}
	}
	if r.only == nil || g[dep].Standard {
		return ""
	}
	for _, ok := range r.only {
		if dep == module+"/"+ok || dep == ok {
			return ""
		}
	}
	return "beyond the standard library only " + strings.Join(r.only, ", ") + " may be imported"
}
