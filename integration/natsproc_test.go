package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

var (
	natsBuildOnce sync.Once
	natsBin       string
	natsBuildErr  error
)

// natsServerBinary builds the nats-server of go.mod once per test run and
// returns its path: a server the test can stop with SIGSTOP must be a
// process of its own.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	natsBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jsbridge-nats-server-")
		if err != nil {
			natsBuildErr = err
			return
		}
		natsBin = dir + "/nats-server"
		cmd := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			natsBuildErr = fmt.Errorf("go build nats-server: %v\n%s", err, out.String())
		}
	})
	require.NoError(t, natsBuildErr)
	return natsBin
}

// natsProc is a nats-server process with JetStream on a loopback port.
type natsProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	out  *lockedBuffer
	done chan error
}

// startNATSProc starts a nats-server process with JetStream (its store in
// a temporary directory) and waits until it accepts a client. At cleanup
// it is continued (if stopped) and terminated.
func startNATSProc(t *testing.T) *natsProc {
	t.Helper()
	port := freePort(t)
	p := &natsProc{t: t, url: fmt.Sprintf("nats://127.0.0.1:%d", port), out: &lockedBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(natsServerBinary(t), "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", t.TempDir())
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	require.Eventually(t, func() bool {
		nc, err := nats.Connect(p.url, nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		nc.Close()
		return true
	}, 30*time.Second, 50*time.Millisecond, "nats-server never accepted a client; output:\n%s", p.out.String())
	return p
}

// freeze stops the server process (SIGSTOP): its sockets stay open, and
// nothing it receives is answered until thaw.
func (p *natsProc) freeze() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGSTOP))
}

// thaw continues the server process (SIGCONT).
func (p *natsProc) thaw() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGCONT))
}
