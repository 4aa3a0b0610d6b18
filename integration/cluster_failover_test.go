package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
	"github.com/jsbridge/jsbridge/wire"
)

// orderedReceiver is a receiver built as a user would build one: package
// webhook's handler over the Postgres idempotency store (pgstore). It
// records every event id its processing function ran for, in the order it
// ran, so the test can count what was processed twice and check each
// stream's order.
type orderedReceiver struct {
	name      string
	mu        sync.Mutex
	processed []string       // event ids, in the order processed
	times     map[string]int // event id -> times processed
}

func newOrderedReceiver(t *testing.T, pool *pgxpool.Pool, schema, name string) (*orderedReceiver, *httptest.Server) {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	idem, err := pgstore.New(pool, pgstore.WithTable(schema+"."+name+"_idempotency"))
	require.NoError(t, err)
	require.NoError(t, idem.Migrate(t.Context()))
	rc := &orderedReceiver{name: name, times: map[string]int{}}
	h := webhook.Handler(v, idem, time.Hour, func(_ context.Context, r *http.Request, _ []byte) error {
		id := r.Header.Get("Idempotency-Key")
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.processed = append(rc.processed, id)
		rc.times[id]++
		return nil
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return rc, srv
}

func (rc *orderedReceiver) distinct() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.times)
}

// receiverFigures count what a receiver processed: in all, more than once,
// and after a later version of its stream.
type receiverFigures struct{ processed, twice, outOfOrder int }

// check counts, against versions (event id -> stream and version), the
// events processed more than once and those processed after a later
// version of their stream. With every event processed once, none of the
// latter means each stream was processed in version order. Every
// processed event must be one of versions.
func (rc *orderedReceiver) check(t *testing.T, versions map[string]streamVersion) receiverFigures {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	f := receiverFigures{processed: len(rc.processed)}
	for id, n := range rc.times {
		if n > 1 {
			f.twice++
			t.Logf("%s receiver: event %s processed %d times", rc.name, id, n)
		}
	}
	next := map[string]int64{}
	for _, id := range rc.processed {
		sv, ok := versions[id]
		require.True(t, ok, "the %s receiver processed event %s, which Postgres does not hold", rc.name, id)
		if sv.version < next[sv.stream] {
			f.outOfOrder++
			t.Logf("%s receiver: stream %s: version %d processed after version %d", rc.name, sv.stream, sv.version, next[sv.stream]-1)
		}
		next[sv.stream] = max(next[sv.stream], sv.version+1)
	}
	return f
}

// failoverFigures are what the failover test measures and logs.
type failoverFigures struct {
	kills          int
	recover        []time.Duration // per kill: until JetStream stored the bridge's next event
	catchUp        []time.Duration // per restart: until the node's replica reached the leader's last sequence
	maxRecoverWait time.Duration
}

// Three JetStream nodes, the EVENTS stream, the DLQ and the durable
// consumers at R3; a bridge process and three consumer processes (two
// with ordering none, one of them one message at a time, and one with
// ordering stream) connected to all three client URLs; a producer
// appending all along. The node leading the EVENTS stream is shut down (as
// a kill: no leadership hand-over) and restarted from its store, over and
// over, while the bridge drains and the consumers deliver. Afterwards
// JetStream holds every event once, each stream in version order (EVENTS
// and its partitioned copy); every receiver (package webhook with its
// Postgres idempotency store) processed every event once; the strict and
// the ordered subscriptions' receivers saw each stream in version order;
// every restarted node's replica caught up with the leader.
func TestClusterFailoverStreamLeaderKilled(t *testing.T) {
	t.Parallel()
	const (
		streams       = 20
		strictStreams = 2
		kills         = 5
	)
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema}
	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	st, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)

	cluster := jsbridgetest.StartCluster(t, embedded.ClusterConfig{})
	_, js := jsbridgetest.ConnectCluster(t, cluster)
	rc, rsrv := newOrderedReceiver(t, pool, schema, "parallel")
	strict, ssrv := newOrderedReceiver(t, pool, schema, "strict")
	ordered, osrv := newOrderedReceiver(t, pool, schema, "ordered")

	bridge := startBridgeProc(t, env, "--nats-url", cluster.ClientURLs(), "--replicas", "3", "--ops-addr", "",
		"--poll-interval", "100ms", "--lease", "10s", "--publish-timeout", "2s")
	consumer := startProc(t, append(env, "JSBRIDGE_SECRET="+testSecret), "consumer", "run",
		"--nats-url", cluster.ClientURLs(), "--replicas", "3", "--ops-addr", "",
		"--name", "failover", "--url", rsrv.URL, "--allow-private", "--filter", "events.>", "--ordering", "none",
		"--ack-wait", "5s", "--timeout", "2s", "--backoff", "200ms")
	// The ordered subscription delivers every stream in version order
	// (--ordering stream: partitions, leases, the hand-over fence), with
	// up to 64 deliveries at once over the streams: a delivery lost with
	// a dying server or a moved consumer leader holds its partition back
	// until it is redelivered.
	orderedConsumer := startProc(t, append(env, "JSBRIDGE_SECRET="+testSecret), "consumer", "run",
		"--nats-url", cluster.ClientURLs(), "--replicas", "3", "--ops-addr", "",
		"--name", "ordered", "--url", osrv.URL, "--allow-private", "--filter", "events.>", "--ordering", "stream",
		"--ack-wait", "5s", "--timeout", "2s", "--backoff", "200ms")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ordered consumer output:\n%s", orderedConsumer.out.String())
		}
	})
	// The strict subscription has one message out at a time (MaxAckPending
	// 1): a message lost on its way to the consumer (sent by a node as it
	// died) holds the next back until it is redelivered after AckWait, so
	// the receiver sees every stream in order even across a failover. It
	// takes strictStreams of the streams: one delivery at a time is slow.
	var strictFilters []string
	for s := range strictStreams {
		strictFilters = append(strictFilters, wire.StreamFilter(wire.DefaultEventsPrefix, fmt.Sprintf("order-%d", s)))
	}
	strictConsumer := startProc(t, append(env, "JSBRIDGE_SECRET="+testSecret), "consumer", "run",
		"--nats-url", cluster.ClientURLs(), "--replicas", "3", "--ops-addr", "",
		"--name", "strict", "--url", ssrv.URL, "--allow-private", "--filter", strings.Join(strictFilters, ","), "--ordering", "none",
		"--ack-wait", "3s", "--timeout", "1400ms", "--backoff", "200ms", "--max-in-flight", "1", "--max-ack-pending", "1")

	// The producer appends one event to every stream each 100 ms.
	var rounds atomic.Int64
	stop := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		defer close(produced)
		for v := 0; ; v++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := pool.Exec(context.Background(), "INSERT INTO "+schema+`.events (stream, version, name, data)
SELECT 'order-' || g, $1::bigint, 'OrderNoted', json_build_object('v', $1::bigint)::jsonb FROM generate_series(0, $2 - 1) g ORDER BY g`, v, streams); err != nil {
				produced <- err
				return
			}
			rounds.Add(1)
		}
	}()
	require.Eventually(t, func() bool { return jsMessages(js) >= 10*streams }, 60*time.Second, 20*time.Millisecond,
		"the bridge forwards before the first kill; bridge:\n%s", bridge.output())
	require.Eventually(t, func() bool { return rc.distinct() >= 5*streams }, 60*time.Second, 20*time.Millisecond,
		"the consumer delivers before the first kill; consumer:\n%s", consumer.out.String())

	delivered := func() int { return rc.distinct() + strict.distinct() + ordered.distinct() }
	fig := failoverFigures{}
	for range kills {
		// Each kill comes while the bridge forwards and the consumers
		// deliver: the receivers have processed more since the last one.
		seen, seenStrict, seenOrdered := rc.distinct(), strict.distinct(), ordered.distinct()
		require.True(t, waitProgress(func() bool {
			return rc.distinct() >= seen+2*streams && strict.distinct() >= seenStrict+2*strictStreams && ordered.distinct() >= seenOrdered+2*streams
		}, delivered, 60*time.Second, 5*time.Minute), "deliveries go on between kills")
		leader := waitStreamLeader(t, cluster, wire.DefaultEventsStream)
		leader.Shutdown()
		killed := time.Now()
		fig.kills++
		// Publishing is back when the new leader stores a message past
		// what it held when it was elected: the bridge's publishes got
		// through again (the producer appends every 100 ms, so this is at
		// most that much late).
		elected := waitStreamLeader(t, cluster, wire.DefaultEventsStream)
		require.NotEqual(t, leader.Name(), elected.Name())
		base, ok, err := elected.LocalStreamState(wire.DefaultEventsStream)
		require.NoError(t, err)
		require.True(t, ok)
		require.Eventually(t, func() bool { return lastSeq(js) > base.LastSeq }, 60*time.Second, 20*time.Millisecond,
			"no event stored after killing %s (new leader %s at sequence %d); bridge:\n%s", leader.Name(), elected.Name(), base.LastSeq, bridge.output())
		fig.recover = append(fig.recover, time.Since(killed))

		require.NoError(t, leader.Restart())
		restarted := time.Now()
		target := lastSeq(js)
		require.Eventually(t, func() bool {
			s, ok, err := leader.LocalStreamState(wire.DefaultEventsStream)
			return err == nil && ok && s.LastSeq >= target
		}, 60*time.Second, 20*time.Millisecond, "%s's replica catches up to sequence %d", leader.Name(), target)
		fig.catchUp = append(fig.catchUp, time.Since(restarted))
	}

	killsDone := time.Now()
	close(stop)
	require.NoError(t, <-produced)
	want := int(rounds.Load()) * streams
	require.Eventually(t, func() bool {
		appended, forwarded, err := st.Totals(t.Context())
		return err == nil && appended == int64(want) && forwarded == appended
	}, 60*time.Second, 50*time.Millisecond, "every watermark at its head; bridge:\n%s", bridge.output())
	for _, r := range []struct {
		rc   *orderedReceiver
		want int
		out  fmt.Stringer
	}{{rc, want, consumer.out}, {strict, int(rounds.Load()) * strictStreams, strictConsumer.out}, {ordered, want, orderedConsumer.out}} {
		// As long as it makes progress: one delivery at a time (the
		// strict subscription) is slow on a loaded machine.
		require.True(t, waitProgress(func() bool { return r.rc.distinct() == r.want }, r.rc.distinct, 60*time.Second, 5*time.Minute),
			"the %s receiver processed %d of %d events, then none for 60 s (or 5 min passed); consumer:\n%s", r.rc.name, r.rc.distinct(), r.want, r.out)
	}

	t.Logf("bridge and receivers done %v after the last kill's catch-up", time.Since(killsDone).Round(time.Millisecond))

	// JetStream: every event once, every stream in version order (0 lost,
	// 0 stored twice, 0 out of order).
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = rounds.Load() - 1
	}
	requireExactlyOnceInOrder(t, js, heads)
	// The ordered subscription's partitioned copy (sourced from EVENTS
	// through the kills) holds every event once, each stream in order.
	copyName := wire.OrderedStream(wire.DefaultEventsStream)
	require.Eventually(t, func() bool { return streamMessages(js, copyName) == uint64(want) }, 60*time.Second, 50*time.Millisecond,
		"%s holds every event", copyName)
	requireStreamExactlyOnceInOrder(t, js, copyName, heads)

	// The receivers: every event processed once (the Postgres idempotency
	// store turns every redelivery into a 204); the strict and the ordered
	// subscriptions' every stream in version order. The parallel one
	// (ordering none) runs up to 64 deliveries at once with 1000 out: a
	// message lost in transit at a kill comes back after AckWait, behind
	// its stream's later versions (it keeps a stream's order only while
	// nothing is redelivered), so its order is measured, not required.
	versions := eventVersions(t, pool, schema)
	par := rc.check(t, versions)
	str := strict.check(t, versions)
	ord := ordered.check(t, versions)
	require.Zero(t, par.twice, "events the parallel receiver processed twice")
	require.Zero(t, str.twice, "events the strict receiver processed twice")
	require.Zero(t, str.outOfOrder, "events the strict receiver processed out of order")
	require.Zero(t, ord.twice, "events the ordered receiver processed twice")
	require.Zero(t, ord.outOfOrder, "events the ordered receiver processed out of order")

	// Every node's replica holds what the leader holds.
	leader := waitStreamLeader(t, cluster, wire.DefaultEventsStream)
	leaderState, ok, err := leader.LocalStreamState(wire.DefaultEventsStream)
	require.NoError(t, err)
	require.True(t, ok)
	for _, n := range cluster.Nodes() {
		require.Eventually(t, func() bool {
			s, ok, err := n.LocalStreamState(wire.DefaultEventsStream)
			return err == nil && ok && s == leaderState
		}, 30*time.Second, 20*time.Millisecond, "%s's replica equals the leader's %+v", n.Name(), leaderState)
	}

	// How often the ordered subscription's partitions went behind the
	// fence again (a lost delivery, or a new consumer leader numbering
	// deliveries again), and how often a stream's later events waited
	// for an earlier one that had not arrived when the fence passed.
	orderedOut := orderedConsumer.out.String()
	t.Logf("ordered consumer: %d lost deliveries seen, %d delivery sequences gone back, %d streams waited for a lost event, %d client buffer overflows",
		strings.Count(orderedOut, "never arrived"), strings.Count(orderedOut, "delivery sequence went back"),
		strings.Count(orderedOut, "has not arrived (lost on its way?)"), strings.Count(orderedOut, "slow consumer"))
	for _, d := range fig.recover {
		fig.maxRecoverWait = max(fig.maxRecoverWait, d)
	}
	t.Logf("failover figures: %d events in %d streams, %d stream-leader kills; lost 0, stored twice 0, out of order 0 (JetStream); "+
		"receivers: parallel processed %d, twice %d, out of order %d; strict processed %d, twice %d, out of order %d; "+
		"ordered processed %d, twice %d, out of order %d; publishing back after %v (max %v); restarted replica caught up after %v",
		want, streams, fig.kills, par.processed, par.twice, par.outOfOrder, str.processed, str.twice, str.outOfOrder,
		ord.processed, ord.twice, ord.outOfOrder, roundAll(fig.recover), fig.maxRecoverWait.Round(time.Millisecond), roundAll(fig.catchUp))
	// bridge verify, against the cluster, agrees: nothing missing, stored
	// twice, out of order or different.
	out, stderr, code := verifyCLI(t, append(env, "NATS_URL="+cluster.ClientURLs()))
	require.Equal(t, 0, code, "verify after the kills: %s%s", out, stderr)
	require.Contains(t, out, fmt.Sprintf("verified %d events of %d streams", want, streams))
	t.Logf("verify against the R3 cluster: %s", strings.TrimSpace(out))

	s, err := js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	require.Equal(t, 3, s.CachedInfo().Config.Replicas, "the bridge created the EVENTS stream R3")
}

// waitStreamLeader waits until a running node leads the JetStream stream.
func waitStreamLeader(t *testing.T, c *embedded.Cluster, stream string) *embedded.Node {
	t.Helper()
	var leader *embedded.Node
	require.Eventually(t, func() bool { leader = c.StreamLeader(stream); return leader != nil }, 30*time.Second, 20*time.Millisecond,
		"a leader of %s", stream)
	return leader
}

// lastSeq returns the EVENTS stream's last sequence as its leader answers
// (0 while no leader answers).
func lastSeq(js jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.LastSeq
}

type streamVersion struct {
	stream  string
	version int64
}

// eventVersions maps every event id (as webhooks carry it) to its stream
// and version.
func eventVersions(t *testing.T, pool *pgxpool.Pool, schema string) map[string]streamVersion {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT id, stream, version FROM "+schema+".events")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]streamVersion{}
	for rows.Next() {
		var id int64
		var sv streamVersion
		require.NoError(t, rows.Scan(&id, &sv.stream, &sv.version))
		out[event.FormatID(id)] = sv
	}
	require.NoError(t, rows.Err())
	return out
}

func roundAll(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return "[" + strings.Join(slices.Clip(parts), " ") + "]"
}
