// Package proc runs jsbridge's binaries as child processes for the demo and
// the benchmarks: started in their own process group with a parent-death
// signal (nothing outlives the parent), stopped with SIGTERM then SIGKILL,
// and measured (peak resident memory).
package proc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one child process.
type Process struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu      sync.Mutex
	stopped bool // Stop was called: its exit is expected
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// PeakRSS returns the process's peak resident set size in bytes (VmHWM from
// /proc/<pid>/status), or an error once it has exited.
func (p *Process) PeakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, fmt.Errorf("%s: read peak RSS: %w", p.Name, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: parse VmHWM %q: %w", p.Name, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("%s: no VmHWM in /proc/%d/status", p.Name, p.Pid())
}

// StopPeakRSS reads the process's peak RSS (PeakRSS) and then stops it
// (Stop): the figure of a process measured at full speed. The error is
// Stop's (wrapped with the process's name), else PeakRSS's.
func (p *Process) StopPeakRSS(grace time.Duration) (int64, error) {
	rss, rssErr := p.PeakRSS()
	if err := p.Stop(grace); err != nil {
		return 0, fmt.Errorf("%s exit: %w", p.Name, err)
	}
	return rss, rssErr
}

// Stop sends SIGTERM and waits up to grace, then SIGKILL. It returns the
// process's exit error (nil for a clean exit after SIGTERM).
func (p *Process) Stop(grace time.Duration) error {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	if !p.Exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	return p.err
}

// Kill sends SIGKILL (no graceful shutdown: a crash, for the benchmarks
// that measure recovery) and waits for the process to end. Its exit is
// expected, as after Stop.
func (p *Process) Kill() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	if !p.Exited() {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Group is a set of child processes stopped together.
type Group struct {
	mu   sync.Mutex
	list []*Process
}

// Start starts bin with args and extra environment (KEY=VALUE), output to
// this process's stdout and stderr.
func (g *Group) Start(name, bin string, args []string, env ...string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	// Own process group (a terminal's Ctrl-C reaches only the parent, which
	// stops the children in order) and a parent-death signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w; build it first (make build)", name, bin, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	g.mu.Lock()
	g.list = append(g.list, p)
	g.mu.Unlock()
	return p, nil
}

// StopAll stops the processes newest first, each with SIGTERM and up to
// grace before SIGKILL.
func (g *Group) StopAll(grace time.Duration) {
	g.mu.Lock()
	list := g.list
	g.list = nil
	g.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		_ = list[i].Stop(grace)
	}
}

// AnyExited returns an error naming a process that ended on its own (not
// through Stop).
func (g *Group) AnyExited() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.list {
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if !stopped && p.Exited() {
			return fmt.Errorf("%s exited unexpectedly: %v", p.Name, p.err)
		}
	}
	return nil
}

// WaitReady polls url until it answers 200, p exits, ctx ends or 30 s pass.
func WaitReady(ctx context.Context, url string, p *Process) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%s exited before it was ready (see its log above)", p.Name)
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not ready after 30s", p.Name, url)
}

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// StartPostgres starts (or reuses) the throwaway local Postgres with the
// repository's scripts/pg (repo is the repository root) and returns its URL
// and a func that stops it again only if this call started it.
func StartPostgres(repo string) (string, func(), error) {
	script := filepath.Join(repo, "scripts", "pg")
	wasRunning := exec.Command(script, "status").Run() == nil
	cmd := exec.Command(script, "start")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("scripts/pg start: %w", err)
	}
	stop := func() {
		if !wasRunning {
			c := exec.Command(script, "stop")
			c.Stderr = os.Stderr
			_ = c.Run()
		}
	}
	return strings.TrimSpace(string(out)), stop, nil
}
