package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/proc"
)

// The many-subscriptions rows run the JetStream server in a child process
// of its own (bench -nats-server-child), so that its memory and CPU are
// measured apart from this process's.

// serverURLsFile is the file, in the child's directory, where the server
// child writes its client URLs (comma-separated) once it is ready.
const serverURLsFile = "client-urls"

// serverPprofFile is the file, in the child's directory, holding the
// port on 127.0.0.1 where the server child serves its CPU profile
// (/debug/pprof/profile), written before serverURLsFile.
const serverPprofFile = "pprof-port"

// serverChildPprof is the port of the server child's CPU profile whose
// directory is dir.
func serverChildPprof(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, serverPprofFile))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(b))
}

// natsServerChild is the -nats-server-child mode: arg is "<dir> <nodes>";
// it runs one embedded server (nodes 1) or a cluster of nodes in this
// process with its storage under dir, writes the client URLs to
// dir/client-urls and runs until ctx ends (SIGTERM).
func natsServerChild(ctx context.Context, arg string) error {
	dir, n, ok := strings.Cut(arg, " ")
	nodes, err := strconv.Atoi(n)
	if !ok || err != nil || nodes < 1 {
		return fmt.Errorf("-nats-server-child %q: want \"<dir> <nodes>\"", arg)
	}
	var urls string
	if nodes == 1 {
		srv, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		urls = srv.ClientURL()
	} else {
		c, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: nodes, Dir: dir, Name: "bench-many"})
		if err != nil {
			return err
		}
		defer c.Shutdown()
		urls = c.ClientURLs()
	}
	// Its CPU profile on demand (the e2e row takes one with -profile-dir).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.Serve(ln, mux) }()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if err := os.WriteFile(filepath.Join(dir, serverPprofFile), []byte(port), 0o644); err != nil {
		return err
	}
	tmp := filepath.Join(dir, serverURLsFile+".tmp")
	if err := os.WriteFile(tmp, []byte(urls), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, serverURLsFile)); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// startServerChild starts this program as a server child of nodes nodes
// with its storage under dir and returns it and its client URLs once
// they are written.
func (e *env) startServerChild(ctx context.Context, dir string, nodes int) (*proc.Process, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	p, err := e.procs.Start("nats-server", self, []string{"-nats-server-child", fmt.Sprintf("%s %d", dir, nodes)})
	if err != nil {
		return nil, "", err
	}
	var urls string
	err = e.waitFor(ctx, 2*time.Minute, "JetStream server child", func() (bool, error) {
		if p.Exited() {
			return false, errors.New("JetStream server child ended early")
		}
		b, err := os.ReadFile(filepath.Join(dir, serverURLsFile))
		if err != nil {
			return false, nil
		}
		urls = string(b)
		return true, nil
	})
	if err != nil {
		_ = p.Stop(20 * time.Second)
		return nil, "", err
	}
	return p, urls, nil
}

// childBus is a JetStream server (or cluster) in a child process, a
// connection to it, and the events stream provisioned on it.
type childBus struct {
	proc *proc.Process
	urls string // client URLs, comma-separated
	nc   *nats.Conn
	js   jetstream.JetStream
}

// startChildBus starts a server child of nodes nodes with its storage
// under dir (startServerChild), connects to it and provisions the events
// stream at nodes replicas. stop ends them; it is a no-op on nil.
func (e *env) startChildBus(ctx context.Context, dir string, nodes int) (*childBus, error) {
	p, urls, err := e.startServerChild(ctx, dir, nodes)
	if err != nil {
		return nil, err
	}
	b := &childBus{proc: p, urls: urls}
	if b.nc, err = nats.Connect(urls); err == nil {
		if b.js, err = jetstream.New(b.nc); err == nil {
			_, err = forward.Provision(ctx, b.js, forward.StreamConfig{Replicas: nodes})
		}
	}
	if err != nil {
		b.stop(20 * time.Second)
		return nil, err
	}
	return b, nil
}

// stop closes the connection and stops the server child, waiting at most
// wait for it.
func (b *childBus) stop(wait time.Duration) {
	if b == nil {
		return
	}
	if b.nc != nil {
		b.nc.Close()
	}
	_ = b.proc.Stop(wait)
}

// currentRSS is process pid's resident set size in bytes now (VmRSS).
func currentRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmRSS %q: %w", pid, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}
