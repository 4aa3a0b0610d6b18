package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// The many-subscriptions rows (-only many): one consumer process running
// n subscriptions from the subscriptions bucket (--subscriptions-from
// kv), all unordered, all ordered, or (-many-mix) some of each together,
// each with its own filter and endpoint path, against a JetStream
// server in a child process of its own (one node, or a 3-node cluster
// with the events stream and the consumer's buckets at 3 replicas). Each
// row measures what the deployment holds: the JetStream consumers on the
// server, the server's and the consumer's RSS once idle, the start-up
// (consumer process start until every subscription delivers: an event
// published for each after the start reached its endpoint), the idle
// CPU of both processes over manyIdleWindow with no events, and how
// long a change takes to apply: a subscription added to the bucket until
// its first event (published right after the add) reaches its endpoint,
// and a paused one resumed until the event that waited reaches it. The
// throughput case, many subscriptions sharing one filter, is
// manythroughput.go.

// manyCase is one many-subscriptions row.
type manyCase struct {
	subs    int // in all
	ordered int // of subs, the last ones have ordering stream; the others none
	nodes   int // 1: one server; 3: a cluster, everything at 3 replicas
}

// mixed reports whether c runs unordered and ordered subscriptions
// together (-many-mix).
func (c manyCase) mixed() bool { return c.ordered > 0 && c.ordered < c.subs }

// ordering is subscription i's ordering: the last c.ordered are ordered,
// and so is one added after them (i ≥ c.subs) when there are any.
func (c manyCase) ordering(i int) string {
	if c.ordered > 0 && i >= c.subs-c.ordered {
		return "stream"
	}
	return "none"
}

// what names the subscriptions of c in its row.
func (c manyCase) what() string {
	switch {
	case c.mixed():
		return fmt.Sprintf("%d unordered and %d ordered together", c.subs-c.ordered, c.ordered)
	case c.ordered > 0:
		return fmt.Sprintf("%d (ordering stream)", c.subs)
	}
	return fmt.Sprintf("%d (ordering none)", c.subs)
}

// manyCases are the rows of the full run (or of -many-sizes and
// -many-mix); the quick run keeps 100 on one server (about 25 s). The
// throughput case is apart (manyThroughputRows).
func (e *env) manyCases() []manyCase {
	var base []manyCase
	switch {
	case len(e.cfg.ManySizes) > 0:
		for _, n := range e.cfg.ManySizes {
			for _, nodes := range []int{1, 3} {
				if e.cfg.ManyNodes == 0 || e.cfg.ManyNodes == nodes {
					c := manyCase{subs: n, nodes: nodes}
					if e.cfg.ManyOrdering == "stream" {
						c.ordered = n
					}
					base = append(base, c)
				}
			}
		}
	case e.cfg.ManyPicked:
	case e.cfg.Quick:
		base = []manyCase{{subs: 100, nodes: 1}}
	default:
		base = []manyCase{
			{subs: 100, nodes: 1}, {subs: 1000, nodes: 1}, {subs: 10_000, nodes: 1},
			{subs: 100, nodes: 3}, {subs: 1000, nodes: 3}, {subs: 10_000, nodes: 3},
			{subs: 100, ordered: 100, nodes: 1}, {subs: 1000, ordered: 1000, nodes: 3},
		}
	}
	if u, o := e.cfg.ManyMix[0], e.cfg.ManyMix[1]; u+o > 0 {
		nodes := 3
		if e.cfg.ManyNodes == 1 {
			nodes = 1
		}
		base = append(base, manyCase{subs: u + o, ordered: o, nodes: nodes})
	}
	return base
}

// manyChangeTimeout bounds the wait for a change's event.
const manyChangeTimeout = time.Minute

// manyIdleWindow is how long the idle CPU is measured (quick: less).
func (e *env) manyIdleWindow() time.Duration {
	if e.cfg.Quick {
		return 10 * time.Second
	}
	return 30 * time.Second
}

// manyRows runs every manyCase.
func (e *env) manyRows(ctx context.Context) ([]row, error) {
	var rows []row
	for _, c := range e.manyCases() {
		r, err := e.manyRow(ctx, c)
		if err != nil {
			return rows, fmt.Errorf("%s subscriptions, %d node(s): %w", c.what(), c.nodes, err)
		}
		rows = append(rows, r)
	}
	rs, err := e.manyThroughputRows(ctx)
	return append(rows, rs...), err
}

// manyFigures are one case's measurements.
type manyFigures struct {
	consumers int // on the server, every stream, after start-up
	// delivering is from the consumer's start until every subscription's
	// first event reached its endpoint (one published for each after the
	// start); reached counts the subscriptions whose event did. It is
	// the row's start-up too.
	delivering         time.Duration
	reached            int
	serverRSS, consRSS int64
	serverCPU, consCPU float64 // share of one core while idle
	add, resume        time.Duration
}

func (e *env) manyRow(ctx context.Context, c manyCase) (row, error) {
	where := "one server"
	if c.nodes > 1 {
		where = fmt.Sprintf("%d-node cluster, R%d", c.nodes, c.nodes)
	}
	name := fmt.Sprintf("many subscriptions: %s on %s, one consumer process", c.what(), where)
	target, limit := "all delivering ≤ 60 s; idle CPU ≤ 5 % of a core each; a change applies ≤ 1 s", 0.05
	if c.mixed() {
		// Issue 34's target for the cluster holding both sets.
		target, limit = "all delivering ≤ 60 s; idle CPU ≤ 10 % of a core each; server RSS ≤ 1 GB (a cluster's three nodes together); a change applies ≤ 1 s", 0.10
	}
	fmt.Printf("bench: many: subscriptions %s, %s (load %s)\n", c.what(), where, loadAverage())
	f, err := e.manyMeasure(ctx, c)
	if err != nil {
		return row{}, err
	}
	mb := func(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/(1<<20)) }
	change := func(d time.Duration) string {
		if d < 0 {
			return "none within " + manyChangeTimeout.String()
		}
		return d.Round(time.Millisecond).String()
	}
	ours := fmt.Sprintf("start %s; every subscription delivering %s; idle CPU consumer %.1f %%, server %.1f %%; RSS consumer %s, server %s; %d JetStream consumers; add %s, resume %s",
		f.delivering.Round(100*time.Millisecond), change(f.delivering), 100*f.consCPU, 100*f.serverCPU, mb(f.consRSS), mb(f.serverRSS), f.consumers,
		change(f.add), change(f.resume))
	if f.reached < c.subs {
		ours = fmt.Sprintf("only %d of %d subscriptions delivering; ", f.reached, c.subs) + ours
	}
	fmt.Printf("bench: many: %s (load %s)\n", ours, loadAverage())
	return row{
		Name:      name,
		Ours:      ours,
		Reference: "—",
		Ratio:     "—",
		Target:    target,
		Met: f.reached >= c.subs && f.delivering <= time.Minute && f.consCPU <= limit && f.serverCPU <= limit &&
			(!c.mixed() || f.serverRSS <= 1<<30) && f.add >= 0 && f.add <= time.Second && f.resume >= 0 && f.resume <= time.Second,
	}, nil
}

// manySub is subscription i of a many row.
func manySub(i int, sinkURL, secret, ordering string) consumer.Subscription {
	name := fmt.Sprintf("m%05d", i)
	return consumer.Subscription{
		Name: name, FilterSubjects: []string{fmt.Sprintf("%s.m%d.>", wire.DefaultEventsPrefix, i)},
		URL: sinkURL + "/" + name, Secrets: []string{secret}, AllowPrivate: true, MaxInFlight: 4,
		Ordering: consumer.Ordering(ordering),
	}
}

// manyBucket makes a secrets key (written to dir/keys, the consumer's
// --secrets-key-file) and opens the subscriptions bucket on js at
// replicas replicas with it.
func manyBucket(ctx context.Context, dir string, js jetstream.JetStream, replicas int) (*consumer.SubscriptionStore, string, error) {
	key, err := consumer.GenerateSecretsKey("bench")
	if err != nil {
		return nil, "", err
	}
	keyFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		return nil, "", err
	}
	ring, err := consumer.ParseSecretsKeyring(key)
	if err != nil {
		return nil, "", err
	}
	store, err := consumer.OpenSubscriptionStore(ctx, js, consumer.SubscriptionStoreConfig{Keys: ring, Replicas: replicas})
	if err != nil {
		return nil, "", err
	}
	return store, keyFile, nil
}

// manyConsumerArgs are the arguments of the consumer process of a many
// row: its subscriptions from the bucket, secrets from keyFile, at nodes
// replicas.
func manyConsumerArgs(urls, keyFile string, nodes int) []string {
	return []string{"run",
		"--nats-url", urls, "--subscriptions-from", "kv", "--secrets-key-file", keyFile, "--ops-addr", "", "--log-level", "warn",
		"--stream-replicas", strconv.Itoa(nodes), "--subscriptions-bucket-replicas", strconv.Itoa(nodes),
	}
}

// manyTempDirs makes a many case's scratch directory and, in it, the
// JetStream server's store ("nats"); the caller removes dir.
func manyTempDirs() (dir, srvDir string, err error) {
	dir, err = os.MkdirTemp("", "jsbridge-bench-many-")
	if err != nil {
		return "", "", err
	}
	srvDir = filepath.Join(dir, "nats")
	if err := os.MkdirAll(srvDir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return dir, srvDir, nil
}

func (e *env) manyMeasure(ctx context.Context, c manyCase) (manyFigures, error) {
	var f manyFigures
	dir, srvDir, err := manyTempDirs()
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	bus, err := e.startChildBus(ctx, srvDir, c.nodes)
	if err != nil {
		return f, err
	}
	defer bus.stop(30 * time.Second)
	srv, urls, js := bus.proc, bus.urls, bus.js
	store, keyFile, err := manyBucket(ctx, dir, js, c.nodes)
	if err != nil {
		return f, err
	}
	sk, err := newPathSink()
	if err != nil {
		return f, err
	}
	defer sk.srv.Close()
	raw := make([]byte, 24)
	_, _ = rand.Read(raw)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(raw)

	// The subscriptions, in the bucket before the consumer starts.
	began := time.Now()
	if err := parallel(ctx, c.subs, 16, func(i int) error {
		_, err := store.Create(ctx, manySub(i, sk.url, secret, c.ordering(i)), false)
		return err
	}); err != nil {
		return f, err
	}
	fmt.Printf("bench: many: %d subscriptions written to the bucket in %s\n", c.subs, time.Since(began).Round(time.Millisecond))

	start := time.Now()
	args := manyConsumerArgs(urls, keyFile, c.nodes)
	ops := 0
	if e.cfg.ProfileDir != "" {
		if ops, err = proc.FreePort(); err != nil {
			return f, err
		}
		args = append(args, "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--pprof")
	}
	p, err := e.procs.Start("consumer", e.cfg.Bin+"/consumer", args)
	if err != nil {
		return f, err
	}
	defer p.Stop(60 * time.Second)

	timeout := 2*time.Minute + time.Duration(c.subs)*60*time.Millisecond
	// Every subscription delivering: one event for each, published now,
	// until each reached its endpoint.
	if err := parallel(ctx, c.subs, 16, func(i int) error { return publishMany(ctx, js, i) }); err != nil {
		return f, err
	}
	last, reached, err := sk.waitPaths(ctx, c.subs, timeout)
	if err != nil {
		return f, err
	}
	f.reached, f.delivering = reached, last-start.Sub(sk.since)
	fmt.Printf("bench: many: %d of %d subscriptions delivering after %s\n", reached, c.subs, f.delivering.Round(time.Millisecond))

	// Idle: no events; both processes' CPU over the window, then RSS.
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return f, err
	}
	sc0, err1 := processCPU(srv.Pid())
	cc0, err2 := processCPU(p.Pid())
	if err := errors.Join(err1, err2); err != nil {
		return f, err
	}
	window := e.manyIdleWindow()
	if ops != 0 {
		// The idle consumer's CPU profile (-profile-dir), from 0.5 s in.
		e.profile(fmt.Sprintf("many-%d-%dnode-consumer-idle", c.subs, c.nodes), ops)
	}
	if err := sleepCtx(ctx, window); err != nil {
		return f, err
	}
	sc1, err1 := processCPU(srv.Pid())
	cc1, err2 := processCPU(p.Pid())
	if err := errors.Join(err1, err2); err != nil {
		return f, err
	}
	f.serverCPU = float64(sc1-sc0) / float64(window)
	f.consCPU = float64(cc1-cc0) / float64(window)
	if f.serverRSS, err = currentRSS(srv.Pid()); err != nil {
		return f, err
	}
	if f.consRSS, err = currentRSS(p.Pid()); err != nil {
		return f, err
	}
	f.consumers = -1 // the server does not answer
	for range 5 {
		if ai, err := js.AccountInfo(ctx); err == nil {
			f.consumers = ai.Consumers
			break
		}
	}

	// A change: add one subscription, publish its event at once.
	added := manySub(c.subs, sk.url, secret, c.ordering(c.subs))
	added.Start = consumer.Start{Policy: consumer.StartTime, Time: time.Now()}
	t0 := time.Now()
	f.add, f.resume = -1, -1
	if _, err := store.Create(ctx, added, false); err != nil {
		// The server does not answer: no change can be measured.
		fmt.Printf("bench: many: add: %v\n", err)
		return f, ctx.Err()
	}
	if err := publishMany(ctx, js, c.subs); err != nil {
		fmt.Printf("bench: many: publish: %v\n", err)
		return f, ctx.Err()
	}
	if f.add, err = sk.waitMore(ctx, added.Name, 0, manyChangeTimeout); err != nil {
		if ctx.Err() != nil {
			return f, err
		}
		fmt.Printf("bench: many: added subscription: %v\n", err)
		f.add = -1
	} else {
		f.add -= t0.Sub(sk.since)
	}

	// Another: pause subscription 1, publish its event, resume it.
	name := manySub(1, sk.url, secret, c.ordering(1)).Name
	before := sk.requests(name)
	got, err := store.Get(ctx, name)
	if err != nil {
		fmt.Printf("bench: many: pause: %v\n", err)
		return f, ctx.Err()
	}
	rev, err := store.SetPaused(ctx, name, true, got.Revision)
	if err != nil {
		fmt.Printf("bench: many: pause: %v\n", err)
		return f, ctx.Err()
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil { // the pause applied
		return f, err
	}
	if err := publishMany(ctx, js, 1); err != nil {
		fmt.Printf("bench: many: publish: %v\n", err)
		return f, ctx.Err()
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return f, err
	}
	if sk.requests(name) > before {
		return f, fmt.Errorf("paused subscription %s received its event", name)
	}
	t1 := time.Now()
	if _, err := store.SetPaused(ctx, name, false, rev); err != nil {
		fmt.Printf("bench: many: resume: %v\n", err)
		return f, ctx.Err()
	}
	if f.resume, err = sk.waitMore(ctx, name, before, manyChangeTimeout); err != nil {
		if ctx.Err() != nil {
			return f, err
		}
		fmt.Printf("bench: many: resumed subscription: %v\n", err)
		f.resume = -1
	} else {
		f.resume -= t1.Sub(sk.since)
	}
	return f, nil
}
