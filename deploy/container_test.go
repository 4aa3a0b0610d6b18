package deploy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// The image runs: its layer unpacked as a root file system, runc (a
// container runtime, no daemon) starts the bridge and a consumer from it
// as the image's user, on the host's network, against the test Postgres
// and an embedded JetStream; an event appended to Postgres arrives at a
// webhook receiver, its signature verified.
func TestImageDeliversAWebhookUnderRunc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image and runs containers")
	}
	runc := installRunc(t)
	require.Equal(t, 0, os.Geteuid(), "runc needs root to start the image's containers")
	t.Parallel()

	layout, _ := writeImage(t)
	_, m, cfg := readImage(t, layout)
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	unpackLayer(t, blobPath(layout, m.Layers[0].Digest), rootfs)

	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	dbURL := jsbridgetest.DatabaseURL(t)
	js := jsbridgetest.StartJetStream(t, embedded.Config{})
	rec := jsbridgetest.NewReceiver(t, jsbridgetest.ReceiverConfig{})

	bridgeOps, consumerOps := freeAddr(t), freeAddr(t)
	startContainer(t, runc, rootfs, cfg, []string{"DATABASE_URL=" + dbURL},
		"bridge", "run", "--nats-url="+js.ClientURL(), "--schema="+schema, "--ops-addr="+bridgeOps)
	waitReady(t, bridgeOps)
	startContainer(t, runc, rootfs, cfg, []string{"JSBRIDGE_SECRET=" + rec.Secrets()[0]},
		"consumer", "run", "--nats-url="+js.ClientURL(), "--name=image-test", "--url="+rec.URL(),
		"--allow-private", "--filter=events.order.>", "--ops-addr="+consumerOps)
	waitReady(t, consumerOps)

	out, err := exec.Command(binPath(t, "bridge"), "append", "--database-url="+dbURL, "--schema="+schema,
		"order-1", "OrderPlaced", `{"total": 42}`).CombinedOutput()
	require.NoError(t, err, "bridge append: %s", out)
	require.Eventually(t, func() bool { return len(rec.Deliveries()) > 0 }, jsbridgetest.DefaultWait, 50*time.Millisecond,
		"no webhook delivered; attempts %d, rejected %v", rec.Attempts(), rec.Rejected())
	got := rec.Deliveries()
	require.Len(t, got, 1)
	require.Equal(t, "order-1", got[0].Stream)
	require.Equal(t, "OrderPlaced", got[0].Type)
	require.JSONEq(t, `{"total": 42}`, string(got[0].Data))
}

// unpackLayer extracts a gzipped layer tar into dir with its modes and
// owners, as a container runtime's image store would.
func unpackLayer(t *testing.T, blob, dir string) {
	t.Helper()
	f, err := os.Open(blob)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(p, 0o755))
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, data, 0o600))
		default:
			t.Fatalf("layer entry %s: unexpected type %c", h.Name, h.Typeflag)
		}
		require.NoError(t, os.Lchown(p, h.Uid, h.Gid))
		require.NoError(t, os.Chmod(p, os.FileMode(h.Mode&0o777)|modeBits(h.Mode)))
	}
}

func modeBits(mode int64) os.FileMode {
	var m os.FileMode
	if mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

// installRunc returns runc's path, installing it first when it is absent
// (scripts/runc: Debian's package with apt-get, as scripts/pg installs
// Postgres), so that `make test` on a fresh machine with Go needs nothing
// installed by hand. When it cannot, the test fails with the script's
// message, which names the command to run.
func installRunc(t *testing.T) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join("..", "scripts", "runc"))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "scripts/runc could not find or install runc, which runs the image here:\n%s", stderr.String())
	return strings.TrimSpace(string(out))
}

// startContainer runs args in a runc container on rootfs (read-only) with
// the image config's user, working directory and environment plus env,
// sharing the host's network so that loopback reaches the test servers.
// It is killed and deleted at cleanup; its output is logged on failure.
func startContainer(t *testing.T, runc, rootfs string, cfg ociConfig, env []string, args ...string) {
	t.Helper()
	bundle := t.TempDir()
	out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput()
	require.NoError(t, err, "runc spec: %s", out)
	var spec map[string]any
	readJSON(t, filepath.Join(bundle, "config.json"), &spec)
	uid, gid, ok := strings.Cut(cfg.Config.User, ":")
	require.True(t, ok, "image user %q", cfg.Config.User)
	u, _ := strconv.Atoi(uid)
	g, _ := strconv.Atoi(gid)
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = args
	proc["env"] = append(append([]string{}, cfg.Config.Env...), env...)
	proc["cwd"] = cfg.Config.WorkingDir
	proc["user"] = map[string]any{"uid": u, "gid": g}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	linux := spec["linux"].(map[string]any)
	var ns []any
	for _, n := range linux["namespaces"].([]any) {
		if n.(map[string]any)["type"] != "network" {
			ns = append(ns, n)
		}
	}
	linux["namespaces"] = ns
	b, err := json.Marshal(spec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644))

	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	id := "jsbridge-test-" + args[0] + "-" + hex.EncodeToString(suffix)
	var logs lockedBuffer
	cmd := exec.Command(runc, "run", "--bundle", bundle, id)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = exec.Command(runc, "kill", id, "KILL").Run()
		_ = cmd.Wait()
		_ = exec.Command(runc, "delete", "--force", id).Run()
		if t.Failed() {
			t.Logf("container %s (%s) output:\n%s", id, strings.Join(args, " "), logs.String())
		}
	})
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// freeAddr is a free loopback address for an ops port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// waitReady waits for GET /readyz on addr to answer 200, for a minute.
func waitReady(t *testing.T, addr string) {
	t.Helper()
	var last string
	require.Eventually(t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://%s/readyz", addr))
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = resp.Status + ": " + string(b)
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 100*time.Millisecond, "%s/readyz: %s", addr, last)
}
