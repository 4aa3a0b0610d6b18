package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

// Environment of the test binary when it runs as a NATS server (see
// TestMain): the JetStream store directory and the client port. The test
// binary doubles as a NATS server process, so a test can have a server that
// is down when the binaries start and comes up later on a known port, or
// one it can freeze with SIGSTOP: nothing to build or install, it is the
// embedded server in a process of its own.
const (
	envServeNATSDir  = "JSBRIDGE_TEST_SERVE_NATS_DIR"
	envServeNATSPort = "JSBRIDGE_TEST_SERVE_NATS_PORT"
)

// serveNATS runs an embedded JetStream server until SIGTERM or until the
// test process that started it is gone.
func serveNATS(dir, port string) int {
	p, err := strconv.Atoi(port)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %q: %v\n", envServeNATSPort, port, err)
		return 2
	}
	parent := os.Getppid()
	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: p})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Shutdown()
	return serveUntilStopped(parent)
}

// natsProc is a NATS server in a process of its own on a fixed port,
// started and stopped by the test.
type natsProc struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// newNATSProc reserves a port and a store directory; the server is not
// started (start). It is stopped at cleanup.
func newNATSProc(t *testing.T) *natsProc {
	t.Helper()
	p := &natsProc{t: t, port: freePort(t), dir: t.TempDir()}
	t.Cleanup(p.stop)
	return p
}

func (p *natsProc) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", p.port) }

// start starts the server and waits until it accepts connections.
func (p *natsProc) start() {
	p.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envServeNATSDir+"="+p.dir, envServeNATSPort+"="+strconv.Itoa(p.port))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(p.t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	require.Eventually(p.t, func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.port), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 30*time.Second, 20*time.Millisecond, "NATS server process on port %d", p.port)
}

// stop stops a running server (SIGTERM) and waits for it to exit.
func (p *natsProc) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a frozen server cannot handle SIGTERM
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

// startNATSProc starts a NATS server process on a port of its own and
// returns it running.
func startNATSProc(t *testing.T) *natsProc {
	t.Helper()
	p := newNATSProc(t)
	p.start()
	return p
}

// freeze stops the server process (SIGSTOP): its sockets stay open, and
// nothing it receives is answered until thaw. stop continues it first.
func (p *natsProc) freeze() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGSTOP))
}

// thaw continues the server process (SIGCONT).
func (p *natsProc) thaw() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGCONT))
}

// serveUntilStopped waits until the serving process gets SIGTERM or
// SIGINT, or is orphaned (its parent, the test run, died), and returns the
// process's exit code, 0.
func serveUntilStopped(parent int) int {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-sig:
			return 0
		case <-t.C:
			if os.Getppid() != parent { // orphaned: the test run died
				return 0
			}
		}
	}
}
