package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/doccheck"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// TestREADMEQuickStartRuns runs the sh blocks of the README's "Use it
// beside your app" in order, as a reader would: the exports (with the
// test's Postgres, an embedded JetStream server and the test's secret),
// consumer secret, bridge run and consumer run (each with an ops address;
// the endpoint is the test's receiver, on loopback, so --allow-private),
// then an order event appended reaches the receiver, signed.
func TestREADMEQuickStartRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binaries")
	}
	t.Parallel()
	raw, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	sec := string(raw)
	i := strings.Index(sec, "\n## Use it beside your app\n")
	require.GreaterOrEqual(t, i, 0, "README has the section")
	sec = sec[i+1:]
	sec = sec[:strings.Index(sec[3:], "\n## ")+3]

	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	rc, rsrv := newRecorder(t)
	vars := map[string]string{ // what the README's exports become here
		"DATABASE_URL":   jsbridgetest.DatabaseURL(t),
		"NATS_URL":       srv.ClientURL(),
		"BILLING_SECRET": testSecret,
	}
	env := []string{"JSBRIDGE_SCHEMA=" + schema}
	ran := map[string]bool{}
	for _, b := range doccheck.Blocks(sec) {
		if b.Lang != "sh" {
			continue
		}
		lines := strings.Split(strings.TrimRight(b.Text, "\n"), "\n")
		for k := 0; k < len(lines); k++ {
			line := lines[k]
			for strings.HasSuffix(strings.TrimSpace(line), `\`) && k+1 < len(lines) {
				line = strings.TrimSuffix(strings.TrimSpace(line), `\`) + " " + lines[k+1]
				k++
			}
			args := doccheck.Words(line)
			if len(args) == 0 {
				continue
			}
			if args[0] == "export" {
				for _, kv := range args[1:] {
					name, _, ok := strings.Cut(kv, "=")
					require.True(t, ok, line)
					value, known := vars[name]
					require.True(t, known, "the README exports %s, which this test does not know", name)
					env = append(env, name+"="+value)
				}
				continue
			}
			for j, a := range args {
				if strings.HasPrefix(a, "$") {
					args[j] = vars[strings.TrimPrefix(a, "$")]
				}
			}
			cmd := strings.Join(args[:min(2, len(args))], " ")
			switch cmd {
			case "consumer secret":
				out, err := cli(t, env, "consumer", args[1:]...)
				if err != nil && strings.Contains(out, "unexpected argument secret") {
					t.Logf("consumer secret is not in this build yet (the friction branch adds it)")
					continue
				}
				require.NoError(t, err, out)
				require.Contains(t, out, "whsec_", "consumer secret prints a whsec_ secret")
			case "bridge run", "consumer run":
				if cmd == "consumer run" {
					for j := range args {
						if strings.HasPrefix(args[j], "https://") {
							args[j] = rsrv.URL // the test's receiver stands in for the endpoint
						}
					}
					args = append(args, "--allow-private")
				}
				addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
				p := startProc(t, env, args[0], append(args[1:], "--ops-addr", addr)...)
				require.Eventually(t, func() bool { code, _ := getBody("http://" + addr + "/readyz"); return code == 200 },
					30*time.Second, 50*time.Millisecond, "%s becomes ready; output:\n%s", line, p.out)
			default:
				t.Fatalf("the README's quick start runs %q, which this test does not know", line)
			}
			ran[cmd] = true
		}
	}
	require.True(t, ran["bridge run"] && ran["consumer run"], "the section runs the bridge and the consumer: %v", ran)

	out, err := cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{"total": 42}`)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool { return rc.count() == 1 }, 30*time.Second, 50*time.Millisecond,
		"an order event reaches the endpoint the README's consumer run names")
}
