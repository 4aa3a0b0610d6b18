package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

type config struct {
	Mode        string
	N           int
	Rate        float64
	Bin         string
	DataDir     string
	DatabaseURL string
	NatsPort    int
	Cluster     int
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
		url, stopPG, err := proc.StartPostgres(".")
		if err != nil {
			return 1, err
		}
		defer stopPG()
		cfg.DatabaseURL = url
	}
	schema := "jsbridge_" + cfg.Mode
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return 1, fmt.Errorf("-database-url: %w", err)
	}
	pcfg.MaxConns = 16 // the producer appends from 8 goroutines
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
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

	if cfg.Cluster < 0 {
		return 2, fmt.Errorf("-cluster %d: want a number of nodes (e.g. 3), or 0 for the bridge's embedded server", cfg.Cluster)
	}
	natsPort := cfg.NatsPort
	// A cluster's nodes take free ports of their own.
	if cfg.Cluster == 0 && natsPort == 0 {
		if cfg.Mode == "run" {
			natsPort = 4222
		} else if natsPort, err = proc.FreePort(); err != nil {
			return 1, err
		}
	}
	if cfg.Cluster == 0 {
		if err := portFree(natsPort); err != nil {
			return 1, err
		}
	}
	bridgeOps, err := proc.FreePort()
	if err != nil {
		return 1, err
	}
	consumerOps, err := proc.FreePort()
	if err != nil {
		return 1, err
	}
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	natsArgs := []string{"--embedded-nats", "--embedded-nats-dir", natsDir, "--embedded-nats-port", strconv.Itoa(natsPort)}
	replicas := 1
	natsWhat := "embedded JetStream"
	if cfg.Cluster > 0 {
		// Registered before the processes' StopAll, so the cluster stops
		// after the bridge and the consumer.
		cluster, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: cfg.Cluster, Dir: natsDir, Name: "demo"})
		if err != nil {
			return 1, fmt.Errorf("-cluster %d: %w", cfg.Cluster, err)
		}
		defer cluster.Shutdown()
		natsURL = cluster.ClientURLs()
		replicas = min(cfg.Cluster, 3)
		natsArgs = []string{"--nats-url", natsURL}
		natsWhat = fmt.Sprintf("%d-node JetStream cluster, R%d,", cfg.Cluster, replicas)
	}
	procs := &proc.Group{}
	defer procs.StopAll(20 * time.Second)

	bridge, err := procs.Start("bridge", filepath.Join(cfg.Bin, "bridge"), append([]string{"run"}, append(natsArgs,
		"--stream-replicas", strconv.Itoa(replicas),
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", bridgeOps), "--no-migrate", "--log-level", "warn",
	)...), "DATABASE_URL="+cfg.DatabaseURL, "JSBRIDGE_SCHEMA="+schema)
	if err != nil {
		return 1, err
	}
	if err := proc.WaitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", bridgeOps), bridge); err != nil {
		return 1, fmt.Errorf("bridge: %w", err)
	}
	// Start all: the final tally counts every event appended, also those
	// appended before the consumer started.
	consumer, err := procs.Start("consumer", filepath.Join(cfg.Bin, "consumer"), []string{"run",
		"--nats-url", natsURL, "--stream-replicas", strconv.Itoa(replicas), "--start", "all", "--name", "demo-receiver", "--filter", wire.All(wire.DefaultEventsPrefix),
		"--url", "http://" + ln.Addr().String() + "/webhook", "--allow-private",
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", consumerOps), "--log-level", "warn",
	}, "JSBRIDGE_SECRET="+secret)
	if err != nil {
		return 1, err
	}
	if err := proc.WaitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", consumerOps), consumer); err != nil {
		return 1, fmt.Errorf("consumer: %w", err)
	}
	fmt.Printf("demo: bridge (%s at %s, ops 127.0.0.1:%d), consumer (ops 127.0.0.1:%d, subscription demo-receiver, start all), receiver at %s, Postgres schema %s\n",
		natsWhat, natsURL, bridgeOps, consumerOps, ln.Addr(), schema)

	if cfg.Mode == "run" {
		fmt.Printf("demo: appending %.0f events/s to order-<n> streams; look inside with: nats --server %s stream info EVENTS; Ctrl-C stops everything\n", cfg.Rate, natsURL)
		return runSteady(ctx, cfg, st, rcv, procs, natsURL)
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

// portFree fails, saying how to choose another, when the embedded NATS
// server's port is taken (another make run, or a NATS server of its own):
// better said here than as the bridge's exit a moment later.
func portFree(port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("NATS port %d: address in use (another make run, or a NATS server?): choose another with make run NATS_PORT=%d (demo -nats-port)", port, port+1)
	}
	return ln.Close()
}
