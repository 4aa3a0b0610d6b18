package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// binaries returns the directory holding cmd/bridge and cmd/consumer, built
// once by TestMain before any test starts: these tests run them as real
// processes, and no test's timeout may include the build (on a fresh machine
// with an empty build cache it takes minutes).
func binaries(t *testing.T) string {
	t.Helper()
	require.NoError(t, buildErr, "building the binaries in TestMain failed")
	return binDir
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// cli runs one short command to completion and returns its combined output.
func cli(t *testing.T, env []string, bin string, args ...string) (string, error) {
	t.Helper()
	return cliStdin(t, env, nil, bin, args...)
}

// cliStdin is cli with stdin read from in (nil: none).
func cliStdin(t *testing.T, env []string, in []byte, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), bin), args...)
	cmd.Env = append(os.Environ(), env...)
	if in != nil {
		cmd.Stdin = bytes.NewReader(in)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// daemon starts a long-running command; at cleanup it gets SIGTERM and must
// exit 0 within 20 s.
func daemon(t *testing.T, env []string, bin string, args ...string) *syncBuffer {
	t.Helper()
	cmd := exec.Command(filepath.Join(binaries(t), bin), args...)
	cmd.Env = append(os.Environ(), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited with %v after SIGTERM; output:\n%s", bin, err, out.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not exit within 20 s of SIGTERM; output:\n%s", bin, out.String())
		}
	})
	return out
}

// syncBuffer is a process's output, written and read concurrently. The
// buffer is a field, not embedded: an embedded bytes.Buffer would lend it
// ReadFrom, which io.Copy would call past the lock.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func waitHTTP200(t *testing.T, url string) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "%s never answered 200", url)
}

func TestCLIBridgeAndConsumerProcesses(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema}

	// The first migrate says what it created; the next has nothing to do.
	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	require.Contains(t, out, fmt.Sprintf("schema %q: applied 10 migrations", schema))
	require.Contains(t, out, "001_streams.sql: table "+schema+".streams, index streams_pending_idx")
	require.Contains(t, out, "002_events.sql: table "+schema+".events, function "+schema+".jsbridge_events_inserted, trigger jsbridge_events_inserted")
	require.Contains(t, out, "005_live_appends.sql: column "+schema+".streams.pending, index streams_claimable_idx, function "+schema+".jsbridge_events_inserted")
	require.Contains(t, out, "006_idle_notify.sql: function "+schema+".jsbridge_events_inserted")
	require.Contains(t, out, "007_one_stream_append.sql: function "+schema+".jsbridge_events_inserted")
	require.Contains(t, out, "008_pending_append.sql: function "+schema+".jsbridge_events_inserted")
	require.Contains(t, out, "009_appended_marker.sql: table "+schema+".appended, function "+schema+".jsbridge_events_inserted")
	require.Contains(t, out, "010_new_stream_marker.sql: function "+schema+".jsbridge_events_inserted")
	require.NotContains(t, out, "up to date")
	out, err = cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	require.Equal(t, fmt.Sprintf("schema %q is up to date: no migration to apply\n", schema), out)

	out, err = cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{"total": 42}`)
	require.NoError(t, err, out)
	require.Contains(t, out, "to order-1 at version 0")

	out, err = cli(t, env, "bridge", "append", "order-1", "OrderConfirmed", `{not json`)
	require.Error(t, err)
	require.Contains(t, out, "Data")
	require.Contains(t, out, "not valid JSON")

	out, err = cli(t, env, "bridge", "append", "--expected-version", "-1", "order-1", "OrderPlaced", `{}`)
	require.Error(t, err, "appending to a non-empty stream with expected version -1 must fail")
	require.Contains(t, strings.ToLower(out), "concurrency")

	rc, rsrv := newRecorder(t)
	natsPort, bridgeOps, consumerOps := freePort(t), freePort(t), freePort(t)
	daemon(t, env, "bridge", "run", "--embedded-nats", "--embedded-nats-dir", t.TempDir(),
		"--embedded-nats-port", fmt.Sprint(natsPort), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", bridgeOps))
	waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", bridgeOps))
	daemon(t, []string{"JSBRIDGE_SECRET=" + testSecret}, "consumer", "run", "--start", "all",
		"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "--name", "cli-test",
		"--url", rsrv.URL, "--allow-private", "--filter", "events.order.>", "--ops-addr", fmt.Sprintf("127.0.0.1:%d", consumerOps))
	waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", consumerOps))

	out, err = cli(t, env, "bridge", "append", "order-1", "OrderConfirmed", `{"by": "cli"}`)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool { return rc.count() == 2 }, 30*time.Second, 50*time.Millisecond)

	require.Eventually(t, func() bool {
		out, err = cli(t, env, "bridge", "streams", "--json")
		if err != nil {
			return false
		}
		var row struct {
			Stream    string `json:"stream"`
			Watermark int64  `json:"watermark"`
			Head      int64  `json:"head"`
			Lag       int64  `json:"lag"`
			Blocked   bool   `json:"blocked"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(out)), &row) != nil {
			return false
		}
		return row.Stream == "order-1" && row.Watermark == 1 && row.Head == 1 && row.Lag == 0 && !row.Blocked
	}, 10*time.Second, 100*time.Millisecond, "bridge streams --json: %s", out)

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", consumerOps))
	require.NoError(t, err)
	defer resp.Body.Close()
	var metrics bytes.Buffer
	_, _ = metrics.ReadFrom(resp.Body)
	require.Contains(t, metrics.String(), `jsbridge_consumer_deliveries_total{outcome="ack"`)
}

func TestCLIMigrateDryRunNeedsNoDatabase(t *testing.T) {
	t.Parallel()
	out, err := cli(t, []string{"DATABASE_URL="}, "bridge", "migrate", "--dry-run", "--schema", "app_events")
	require.NoError(t, err, out)
	require.Contains(t, out, "CREATE TABLE IF NOT EXISTS app_events.streams")
	require.NotContains(t, out, ";;")
}

func TestCLIRejectsBadInputNamingIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "subs.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("subscriptions:\n  - name: a\n    url: http://127.0.0.1:1/\n    filter_subjects: [events.>]\n    ack_wiat: 10s\n"), 0o600))
	out, err := cli(t, nil, "consumer", "run", "--config", cfg, "--nats-url", "nats://127.0.0.1:1")
	require.Error(t, err)
	require.Contains(t, out, "ack_wiat")

	out, err = cli(t, []string{"DATABASE_URL="}, "bridge", "run", "--embedded-nats")
	require.Error(t, err)
	require.Contains(t, out, "--database-url")

	out, err = cli(t, nil, "consumer", "run", "--nats-url", "nats://127.0.0.1:1")
	require.Error(t, err)
	require.Contains(t, out, "--url")
}

// Event data too large for a command line (2 MB) goes in through stdin or
// --data-file, and is stored byte for byte.
func TestCLIAppendReadsDataFromStdinAndFile(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema}
	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)

	big := []byte(`{"blob":"` + strings.Repeat("x", 2<<20) + `"}`)
	out, err = cliStdin(t, env, big, "bridge", "append", "doc-1", "DocumentUploaded", "-")
	require.NoError(t, err, out)
	require.Contains(t, out, "to doc-1 at version 0")

	file := filepath.Join(t.TempDir(), "data.json")
	require.NoError(t, os.WriteFile(file, big, 0o600))
	out, err = cli(t, env, "bridge", "append", "--data-file", file, "doc-1", "DocumentUploaded")
	require.NoError(t, err, out)
	require.Contains(t, out, "to doc-1 at version 1")

	var n int
	var stored []byte
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*), min(data::text) FROM "+schema+".events WHERE stream = 'doc-1' AND length(data::text) > 2000000").Scan(&n, &stored))
	require.Equal(t, 2, n, "both 2 MB events stored")
	var want, got any
	require.NoError(t, json.Unmarshal(big, &want))
	require.NoError(t, json.Unmarshal(stored, &got))
	require.Equal(t, want, got)

	out, err = cli(t, env, "bridge", "append", "doc-1", "DocumentUploaded")
	require.Error(t, err, out)
	require.Contains(t, out, "--data-file")
	out, err = cli(t, env, "bridge", "append", "--data-file", file, "doc-1", "DocumentUploaded", "{}")
	require.Error(t, err, out)
	require.Contains(t, out, "not both")
}
