package deploy_test

import (
	"flag"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// composeFile is the part of the Compose specification compose.yaml uses,
// decoded strictly so that a misspelt key fails.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
	XNats    any                       `yaml:"x-nats"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Restart     string                       `yaml:"restart"`
	Command     []string                     `yaml:"command"`
	Environment map[string]string            `yaml:"environment"`
	DependsOn   map[string]map[string]string `yaml:"depends_on"`
	Ports       []string                     `yaml:"ports"`
	Volumes     []string                     `yaml:"volumes"`
	ExtraHosts  []string                     `yaml:"extra_hosts"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
	Healthcheck struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		Retries     int      `yaml:"retries"`
		StartPeriod string   `yaml:"start_period"`
	} `yaml:"healthcheck"`
}

// interpolation is Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}.
var interpolation = regexp.MustCompile(`\$\{([A-Z_][A-Z0-9_]*)(?::?[-?]([^}]*))?\}`)

// interpolate replaces each ${…} by its default (or "x" when it has none),
// as Compose would with the variable unset or set.
func interpolate(s string) string {
	return interpolation.ReplaceAllStringFunc(s, func(m string) string {
		sub := interpolation.FindStringSubmatch(m)
		if strings.Contains(m, ":-") && sub[2] != "" {
			return sub[2]
		}
		return "x"
	})
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	f, err := os.Open("compose.yaml")
	require.NoError(t, err)
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var c composeFile
	require.NoError(t, dec.Decode(&c))
	return c
}

// The stack the docs promise: Postgres, 3 NATS nodes in one cluster, the
// bridge and 2 consumer replicas, each with a health check, jsbridge's on
// /readyz of its own ops port.
func TestComposeStackShape(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	names := make([]string, 0, len(c.Services))
	for n := range c.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	require.Equal(t, []string{"bridge", "consumer", "nats-1", "nats-2", "nats-3", "postgres"}, names)
	require.Equal(t, 2, c.Services["consumer"].Deploy.Replicas)
	for name, s := range c.Services {
		require.NotEmpty(t, s.Healthcheck.Test, "service %s has no health check", name)
		require.Equal(t, "CMD", s.Healthcheck.Test[0], "service %s: the image has no shell", name)
	}
	for _, n := range []string{"nats-1", "nats-2", "nats-3"} {
		require.Equal(t, "service_healthy", c.Services["bridge"].DependsOn[n]["condition"])
	}
	require.Equal(t, "service_healthy", c.Services["consumer"].DependsOn["bridge"]["condition"])

	// The three nodes' command lines parse with nats-server's own flag
	// set, route to each other and name themselves apart.
	seen := map[string]bool{}
	for _, n := range []string{"nats-1", "nats-2", "nats-3"} {
		fs := flag.NewFlagSet(n, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		opts, err := server.ConfigureOptions(fs, c.Services[n].Command, func() {}, func() {}, func() {})
		require.NoError(t, err, "%s command", n)
		require.True(t, opts.JetStream, n)
		require.Equal(t, "jsbridge", opts.Cluster.Name, n)
		require.Len(t, opts.Routes, 3, n)
		require.False(t, seen[opts.ServerName], "server name %s twice", opts.ServerName)
		seen[opts.ServerName] = true
		require.Equal(t, 8222, opts.HTTPPort, n)
	}
}

// Every flag and environment variable compose.yaml gives the bridge and
// the consumer is one the binary takes (read from its --help, so a
// renamed flag fails here), and each health check probes /readyz on the
// port --ops-addr opens.
func TestComposeFlagsAndEnvExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	t.Parallel()
	c := loadCompose(t)
	var problems []string
	for _, name := range []string{"bridge", "consumer"} {
		s := c.Services[name]
		require.GreaterOrEqual(t, len(s.Command), 2, name)
		binary, args := s.Command[0], make([]string, 0, len(s.Command))
		require.Equal(t, name, binary)
		for _, a := range s.Command[1:] {
			args = append(args, interpolate(a))
		}
		cli := surface(t, binary, args[0])
		problems = append(problems, cli.checkArgs("compose "+name, args[1:])...)
		for env := range s.Environment {
			if !cli.envs[env] {
				problems = append(problems, "compose "+name+": environment "+env+" is read by no flag of "+binary+" "+args[0])
			}
		}
		// Health check: `<binary> probe http://127.0.0.1:<ops port>/readyz`.
		hc := s.Healthcheck.Test
		require.Len(t, hc, 4, "%s healthcheck", name)
		require.Equal(t, []string{binary, "probe"}, hc[1:3], "%s healthcheck", name)
		surface(t, binary, "probe") // the subcommand exists
		u, err := url.Parse(hc[3])
		require.NoError(t, err)
		require.Equal(t, "/readyz", u.Path, "%s healthcheck", name)
		var opsAddr string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--ops-addr="); ok {
				opsAddr = v
			}
		}
		_, port, err := net.SplitHostPort(opsAddr)
		require.NoError(t, err, "%s: --ops-addr %q", name, opsAddr)
		require.Equal(t, port, u.Port(), "%s: the health check probes another port than --ops-addr", name)
	}
	require.Empty(t, problems)
}

// A machine with Docker and no Go builds the image from deploy/Dockerfile
// (compose's build of the bridge service, whose image the consumer shares):
// it builds both binaries with the Go release go.mod asks for, static, and
// runs them as the non-root user 65532 on a base with CA certificates.
func TestDockerfileBuildsWhatMakeImageDoes(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	b := c.Services["bridge"].Build
	require.Equal(t, "..", b.Context)
	require.Equal(t, "deploy/Dockerfile", b.Dockerfile)
	require.Equal(t, c.Services["bridge"].Image, c.Services["consumer"].Image, "the consumer runs the image the bridge service builds")

	df, err := os.ReadFile(filepath.Join(repoRoot, b.Dockerfile))
	require.NoError(t, err)
	mod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	require.NoError(t, err)
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	require.NotNil(t, goLine, "go.mod's go line")
	text := string(df)
	require.Contains(t, text, "FROM golang:"+string(goLine[1])+" AS build", "the builder's Go is go.mod's")
	require.Contains(t, text, "CGO_ENABLED=0 go build -trimpath")
	require.Contains(t, text, "./cmd/bridge ./cmd/consumer")
	require.Contains(t, text, "FROM gcr.io/distroless/static-debian12:nonroot")
	require.Contains(t, text, "COPY --from=build /out/bridge /out/consumer /usr/local/bin/")
	require.Contains(t, text, "USER 65532:65532")
}
