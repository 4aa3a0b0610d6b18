package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/store"
)

type config struct {
	Mode        string
	N           int
	Rate        float64
	Bin         string
	DataDir     string
	DatabaseURL string
	NatsPort    int
	Timeout     time.Duration
	Quiet       bool
}

func run(ctx context.Context, cfg config) (int, error) {
	if cfg.Mode != "run" && cfg.Mode != "check" {
		return 2, fmt.Errorf("-mode %q: want run or check", cfg.Mode)
	}
	if cfg.Mode == "check" && cfg.N <= 0 {
		return 2, fmt.Errorf("-n %d: want a positive number of events", cfg.N)
	}
	if cfg.DatabaseURL == "" {
		url, stopPG, err := startPostgres()
		if err != nil {
			return 1, err
		}
		defer stopPG()
		cfg.DatabaseURL = url
	}
	schema := "jsbridge_" + cfg.Mode
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return 1, fmt.Errorf("-database-url: %w", err)
	}
	defer pool.Close()
	// A fresh schema and JetStream store each time, so the counts start at 0.
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return 1, fmt.Errorf("reset schema %s: %w", schema, err)
	}
	st, err := store.New(pool, store.WithSchema(schema))
	if err != nil {
		return 1, err
	}
	if err := st.Migrate(ctx); err != nil {
		return 1, fmt.Errorf("migrate: %w", err)
	}
	natsDir := filepath.Join(cfg.DataDir, cfg.Mode, "nats")
	if err := os.RemoveAll(natsDir); err != nil {
		return 1, err
	}

	secret, err := newSecret()
	if err != nil {
		return 1, err
	}
	rcv, err := newReceiver(secret, !cfg.Quiet && cfg.Mode == "run")
	if err != nil {
		return 1, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 1, err
	}
	srv := &http.Server{Handler: rcv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	natsPort := cfg.NatsPort
	if natsPort == 0 {
		if cfg.Mode == "run" {
			natsPort = 4222
		} else if natsPort, err = freePort(); err != nil {
			return 1, err
		}
	}
	bridgeOps, err := freePort()
	if err != nil {
		return 1, err
	}
	consumerOps, err := freePort()
	if err != nil {
		return 1, err
	}
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	procs := &processes{}
	defer procs.stop()

	bridge, err := procs.start("bridge", filepath.Join(cfg.Bin, "bridge"), []string{"run",
		"--embedded-nats", "--embedded-nats-dir", natsDir, "--embedded-nats-port", strconv.Itoa(natsPort),
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", bridgeOps), "--no-migrate", "--log-level", "warn",
	}, "DATABASE_URL="+cfg.DatabaseURL, "JSBRIDGE_SCHEMA="+schema)
	if err != nil {
		return 1, err
	}
	if err := waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", bridgeOps), bridge); err != nil {
		return 1, fmt.Errorf("bridge: %w", err)
	}
	consumer, err := procs.start("consumer", filepath.Join(cfg.Bin, "consumer"), []string{"run",
		"--nats-url", natsURL, "--name", "demo-receiver", "--filter", "events.>",
		"--url", "http://" + ln.Addr().String() + "/webhook", "--allow-private",
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", consumerOps), "--log-level", "warn",
	}, "JSBRIDGE_SECRET="+secret)
	if err != nil {
		return 1, err
	}
	if err := waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", consumerOps), consumer); err != nil {
		return 1, fmt.Errorf("consumer: %w", err)
	}
	fmt.Printf("demo: bridge (embedded JetStream at %s, ops 127.0.0.1:%d), consumer (ops 127.0.0.1:%d), receiver at %s, Postgres schema %s\n",
		natsURL, bridgeOps, consumerOps, ln.Addr(), schema)

	if cfg.Mode == "run" {
		fmt.Printf("demo: appending %.0f events/s to order-<n> streams; look inside with: nats --server %s stream info EVENTS; Ctrl-C stops everything\n", cfg.Rate, natsURL)
		return runSteady(ctx, cfg, st, rcv, procs)
	}
	return runCheck(ctx, cfg, st, rcv, procs)
}

func newSecret() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b), nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startPostgres starts (or reuses) the throwaway local Postgres; the returned
// func stops it again only if this run started it.
func startPostgres() (string, func(), error) {
	script := filepath.Join("scripts", "pg")
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

func waitReady(ctx context.Context, url string, p *process) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("exited before it was ready (see its log above)")
		}
		resp, err := http.Get(url)
		if err == nil {
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
	return fmt.Errorf("%s not ready after 30s", url)
}

// process is one child process (bridge or consumer).
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

type processes struct{ list []*process }

func (ps *processes) start(name, bin string, args []string, env ...string) (*process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	// Own process group (Ctrl-C reaches us; we stop the children in order)
	// and a parent-death signal so nothing outlives the demo.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w; run `make build` first", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	ps.list = append(ps.list, p)
	return p, nil
}

// stop sends SIGTERM to the children, newest first (consumer, then bridge),
// and SIGKILL to any still running after 20 s.
func (ps *processes) stop() {
	for i := len(ps.list) - 1; i >= 0; i-- {
		p := ps.list[i]
		if p.exited() {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// anyExited returns an error naming a child that stopped on its own.
func (ps *processes) anyExited() error {
	for _, p := range ps.list {
		if p.exited() {
			return fmt.Errorf("%s exited unexpectedly: %v", p.name, p.err)
		}
	}
	return nil
}

var errStopped = errors.New("stopped")
