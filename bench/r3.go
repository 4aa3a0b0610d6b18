package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// r3Row compares, on an embedded 3-node JetStream cluster (in this process)
// with the EVENTS stream at 3 replicas, the bridge draining a Postgres
// backlog against a bare async-publish loop of the same messages: a quarter
// of the drain row's events over a quarter of its streams. Every publish
// waits for a majority of the replicas, so this is the production shape's
// limit rather than the single server's.
func (e *env) r3Row(ctx context.Context) (row, error) {
	n, streams := max(e.cfg.Events/4, 1), max(e.cfg.Streams/4, 1)
	fmt.Printf("bench: r3: starting a 3-node cluster; %d events over %d streams\n", n, streams)
	dir, err := os.MkdirTemp("", "jsbridge-bench-r3-")
	if err != nil {
		return row{}, err
	}
	defer os.RemoveAll(dir)
	cluster, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: 3, Dir: dir, Name: "bench"})
	if err != nil {
		return row{}, err
	}
	defer cluster.Shutdown()
	nc, err := cluster.Connect()
	if err != nil {
		return row{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return row{}, err
	}
	fresh := func() error {
		if err := js.DeleteStream(ctx, wire.DefaultEventsStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		_, err := forward.Provision(ctx, js, forward.StreamConfig{Replicas: 3})
		return err
	}

	evs := backlog(n, streams)
	if err := fresh(); err != nil {
		return row{}, err
	}
	ref, err := publishAsyncTo(ctx, js, evs)
	if err != nil {
		return row{}, fmt.Errorf("reference: %w", err)
	}
	fmt.Printf("bench: r3: reference async publish %.0f msg/s\n", ref)

	const schema = "bench_r3"
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return row{}, err
	}
	if err := e.load(ctx, schema, evs); err != nil {
		return row{}, err
	}
	evs = nil
	if err := fresh(); err != nil {
		return row{}, err
	}
	start := time.Now()
	bridge, _, err := e.startBridgeAt(ctx, cluster.ClientURLs(), schema, "--stream-replicas", "3")
	if err != nil {
		return row{}, err
	}
	defer bridge.Stop(20 * time.Second)
	err = e.waitFor(ctx, 30*time.Minute, "r3 drain", func() (bool, error) {
		_, fwd, err := st.Totals(ctx)
		return fwd >= int64(n), err
	})
	if err != nil {
		return row{}, err
	}
	ours := float64(n) / time.Since(start).Seconds()
	if err := bridge.Stop(20 * time.Second); err != nil {
		return row{}, err
	}
	if err := expectMessagesIn(ctx, js, n); err != nil {
		return row{}, err
	}
	fmt.Printf("bench: r3: bridge %.0f events/s\n", ours)
	ratio := ours / ref
	return row{
		Name:      fmt.Sprintf("R3 drain: %d events (256 B) over %d streams into a 3-node cluster (in this process), EVENTS at 3 replicas", n, streams),
		Ours:      fmt.Sprintf("%.0f events/s", ours),
		Reference: fmt.Sprintf("%.0f msg/s (bare async publish, same cluster)", ref),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≥ 0.7",
		Met:       ratio >= 0.7,
	}, nil
}
