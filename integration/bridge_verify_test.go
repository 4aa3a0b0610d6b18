package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// verifyCLI runs `bridge verify` and returns its stdout, stderr and exit
// status.
func verifyCLI(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), "bridge"), append([]string{"verify"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return stdout.String(), stderr.String(), code
}

// TestBridgeVerifyReportsRepairsAndExitsByOutcome drains streams with the
// real forwarder, loses a tail and a hole in JetStream as a crash would,
// and runs the bridge binary's verify: exit 1 naming exactly those, --json
// for machines, --repair restoring the tail (exit 1: the hole is left),
// and a clean exit 0 once only clean streams are verified; bad flags exit 2.
func TestBridgeVerifyReportsRepairsAndExitsByOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	st, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	dir := t.TempDir()
	srv := jsbridgetest.StartJetStream(t, embedded.Config{Dir: dir})
	_, js := jsbridgetest.Connect(t, srv)
	_, err = forward.Provision(ctx, js, forward.StreamConfig{})
	require.NoError(t, err)
	for _, s := range []string{"order-1", "order-2", "user-1"} {
		var evs []store.NewEvent
		for i := range 4 {
			evs = append(evs, store.NewEvent{Name: "Changed", Data: fmt.Appendf(nil, `{"i": %d}`, i)})
		}
		_, err := st.Append(ctx, s, -1, evs...)
		require.NoError(t, err)
	}
	fwd, err := forward.New(js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	d, err := drain.New(st, fwd, drain.Config{Owner: "verify-test", Lease: 10 * time.Second})
	require.NoError(t, err)
	for {
		stats, err := d.Cycle(ctx)
		require.NoError(t, err)
		if stats == (drain.Stats{}) {
			break
		}
	}
	appended, forwarded, err := st.Totals(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(12), appended)
	require.Equal(t, appended, forwarded)

	// Lose order-1's last two events (a tail) and order-2's version 1 (a
	// hole), then restart the server as after the crash that lost them.
	s, err := js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	for _, want := range []struct {
		stream  string
		version string
	}{{"order-1", "2"}, {"order-1", "3"}, {"order-2", "1"}} {
		var m *jetstream.RawStreamMsg
		for seq := uint64(1); m == nil; seq++ {
			require.Less(t, seq, uint64(100), "no message of %s version %s", want.stream, want.version)
			got, err := s.GetMsg(ctx, seq)
			if err == nil && got.Header.Get(wire.HeaderSubject) == want.stream && got.Header.Get(wire.HeaderStreamVersion) == want.version {
				m = got
			}
		}
		require.NoError(t, s.DeleteMsg(ctx, m.Sequence))
	}
	srv.Shutdown()
	srv = jsbridgetest.StartJetStream(t, embedded.Config{Dir: dir})

	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema, "NATS_URL=" + srv.ClientURL()}
	out, stderr, code := verifyCLI(t, env)
	require.Equal(t, 1, code, "problems found: exit 1\n%s%s", out, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Contains(t, lines[0], "order-1 version=2 ")
	require.Contains(t, lines[0], "kind=missing")
	require.Contains(t, lines[1], "order-1 version=3 ")
	require.Contains(t, lines[2], "order-2 version=1 ")
	require.Contains(t, lines[2], "hole")
	require.Contains(t, lines[3], "verified 12 events of 3 streams")
	require.Contains(t, lines[3], "3 missing, 0 duplicate, 0 out of order, 0 content differs; 0 repaired, 3 left")
	require.Contains(t, lines[3], "events/s")

	out, _, code = verifyCLI(t, env, "--json", "--stream", "order-1")
	require.Equal(t, 1, code)
	dec := json.NewDecoder(strings.NewReader(out))
	var kinds []string
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		if obj["summary"] == true {
			require.EqualValues(t, 4, obj["events"])
			require.EqualValues(t, 2, obj["left"])
			continue
		}
		kinds = append(kinds, fmt.Sprintf("%s/%v/%s", obj["stream"], obj["version"], obj["kind"]))
	}
	require.Equal(t, []string{"order-1/2/missing", "order-1/3/missing"}, kinds)

	out, stderr, code = verifyCLI(t, env, "--repair")
	require.Equal(t, 1, code, "the hole is left: exit 1\n%s%s", out, stderr)
	require.Contains(t, out, "2 repaired, 1 left", out)

	out, stderr, code = verifyCLI(t, env, "--match", "^(order-1|user-1)$")
	require.Equal(t, 0, code, "repaired and clean streams: exit 0\n%s%s", out, stderr)
	require.Contains(t, out, "verified 8 events of 2 streams")
	_, _, code = verifyCLI(t, env, "--stream", "order-2")
	require.Equal(t, 1, code, "the hole is still reported")

	// Continuous: a round every --interval until SIGTERM (then exit 0 at
	// cleanup: the last round was clean).
	rounds := daemon(t, env, "bridge", "verify", "--continuous", "--interval", "100ms", "--stream", "user-1", "--ops-addr", "")
	require.Eventually(t, func() bool {
		return strings.Count(rounds.String(), "verified 4 events of 1 streams") >= 3
	}, 20*time.Second, 50*time.Millisecond, "three rounds; output:\n%s", rounds)

	// Continuous rounds export what they find on the ops port: order-2's
	// hole is one missing event, left by every round.
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	holed := startProc(t, env, "bridge", "verify", "--continuous", "--interval", "100ms", "--stream", "order-2", "--ops-addr", opsAddr)
	waitReadyz(t, opsAddr, http.StatusOK, "ready")
	require.Eventually(t, func() bool {
		problems, _ := metric(t, opsAddr, `jsbridge_bridge_audit_rounds_total{result="problems"}`)
		return problems >= 2
	}, 20*time.Second, 50*time.Millisecond, "two rounds with problems; output:\n%s", holed.out)
	for name, want := range map[string]float64{
		"jsbridge_bridge_audit_missing": 1, "jsbridge_bridge_audit_duplicates": 0, "jsbridge_bridge_audit_out_of_order": 0,
		"jsbridge_bridge_audit_content_differs": 0, `jsbridge_bridge_audit_rounds_total{result="clean"}`: 0,
		`jsbridge_bridge_audit_rounds_total{result="failed"}`: 0,
	} {
		got, ok := metric(t, opsAddr, name)
		require.True(t, ok, "%s exported", name)
		require.Equal(t, want, got, name)
	}
	checked, _ := metric(t, opsAddr, "jsbridge_bridge_audit_events_checked_total")
	require.GreaterOrEqual(t, checked, 8.0, "two rounds of order-2's 4 events")
	last, _ := metric(t, opsAddr, "jsbridge_bridge_audit_last_run_timestamp_seconds")
	require.InDelta(t, float64(time.Now().Unix()), last, 30, "the last round ended just now")
	took, ok := metric(t, opsAddr, "jsbridge_bridge_audit_last_run_duration_seconds")
	require.True(t, ok && took > 0, "the last round's duration: %v", took)
	holed.kill(t) // problems left: its exit status would be 1

	for _, args := range [][]string{{"--continuous", "--interval", "0s"}, {"--stream", "order-1", "--match", "x"}, {"--since", "yesterday"}, {"--stream", "nope-1"}, {"--match", "("}} {
		_, stderr, code := verifyCLI(t, env, args...)
		require.Equal(t, 2, code, "%v: usage error, exit 2: %s", args, stderr)
		require.Contains(t, stderr, args[len(args)-2], "%v: the error names the flag", args)
	}
}
