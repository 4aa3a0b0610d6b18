package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// failoverFigures are what the failover test measures and logs.
type failoverFigures struct {
	kills          int
	recover        []time.Duration // per kill: until JetStream stored the bridge's next event
	catchUp        []time.Duration // per restart: until the node's replica reached the leader's last sequence
	maxRecoverWait time.Duration
}

// failoverSizes are the failover test's sizes and schedule.
type failoverSizes struct {
	streams      int              // source streams, order-0 … order-(streams-1)
	round        time.Duration    // the producer appends one event to every stream each round
	kills        int              // stream-leader kills
	killEvery    [2]time.Duration // a kill every [min, max) after the last; zero: once deliveries went on since it
	restartAfter time.Duration    // a killed node restarts this long after its kill; zero: once publishing is back
	processes    bool             // nodes as processes, SIGKILLed (natsCluster); else in-process, shut down
	logLevel     string           // the ordered replicas' --log-level
}

// failoverTestSizes are the sizes under make test: 20 streams at 200
// events/s, 5 kills, each restarted as soon as publishing is back.
var failoverTestSizes = failoverSizes{streams: 20, round: 100 * time.Millisecond, kills: 5, logLevel: "info"}

// failoverSizesFor returns the soak's sizes when JSBRIDGE_SOAK=1 (make
// soak): 100 streams at 300 events/s, the EVENTS leader killed every 8–12 s
// and restarted 5 s later, JSBRIDGE_SOAK_KILLS times (default 20), the
// nodes processes killed with SIGKILL, the ordered replicas logging at
// debug (a stall's log then says what each partition did; none of those
// lines is per event on the normal path); failoverTestSizes otherwise.
func failoverSizesFor(t *testing.T) failoverSizes {
	t.Helper()
	if os.Getenv("JSBRIDGE_SOAK") != "1" {
		return failoverTestSizes
	}
	kills := 20
	if v := os.Getenv("JSBRIDGE_SOAK_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "JSBRIDGE_SOAK_KILLS=%q", v)
		require.Positive(t, n, "JSBRIDGE_SOAK_KILLS=%q", v)
		kills = n
	}
	return failoverSizes{streams: 100, round: time.Second / 3, kills: kills,
		killEvery: [2]time.Duration{8 * time.Second, 12 * time.Second}, restartAfter: 5 * time.Second, processes: true, logLevel: "debug"}
}

// saveOutputs writes every process's output to dir (JSBRIDGE_SOAK_LOGS,
// when set) at the test's end, so a soak run's hand-overs, fences and
// successor waits can be read after an inversion.
func saveOutputs(t *testing.T, outs map[string]fmt.Stringer) {
	dir := os.Getenv("JSBRIDGE_SOAK_LOGS")
	if dir == "" {
		return
	}
	t.Cleanup(func() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Logf("save process outputs: %v", err)
			return
		}
		for name, out := range outs {
			if err := os.WriteFile(filepath.Join(dir, name+".log"), []byte(out.String()), 0o644); err != nil {
				t.Logf("save process outputs: %v", err)
			}
		}
	})
}

// Three JetStream nodes, the EVENTS stream, the DLQ and the consumers'
// buckets at R3; two bridge processes; two replicas of an ordered
// subscription (ordering stream), all connected to the three client
// URLs; a producer appending all along. The node leading the EVENTS
// stream is killed and restarted from its store, over and over, while
// the bridges drain and the consumers deliver. Afterwards JetStream holds
// every event once, each stream in version order; the ordered receiver
// (package webhook with its Postgres idempotency store, behind an order
// gate in Postgres: the version chain) committed every event's effect
// once and in order, and got each stream's first POSTs in version order;
// every restarted node's replica caught up with the leader. JSBRIDGE_SOAK=1 runs the soak's sizes (failoverSizesFor).
//
// Under make test the nodes are in-process (embedded.StartCluster): a kill
// is the node's Shutdown, which closes its connections and its store. In
// the soak they are processes (natsCluster), and a kill is SIGKILL.
func TestClusterFailoverStreamLeaderKilled(t *testing.T) {
	t.Parallel()
	sz := failoverSizesFor(t)
	streams := sz.streams
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema}
	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	st, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)

	var cluster failoverNodes
	if sz.processes {
		cluster = startNATSCluster(t)
	} else {
		cluster = embeddedNodes{jsbridgetest.StartCluster(t, embedded.ClusterConfig{})}
	}
	nc, err := nats.Connect(cluster.ClientURLs(), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ordered, osrv := newGatedReceiver(t, pool, schema, "ordered")

	var bridges []*bridgeProc
	for range 2 {
		bridges = append(bridges, startBridgeProc(t, env, "--nats-url", cluster.ClientURLs(), "--stream-replicas", "3", "--ops-addr", "",
			"--poll-interval", "100ms", "--lease", "10s", "--publish-timeout", "2s"))
	}
	bridgeOutput := func() string { return bridges[0].output() + "\n--- second bridge:\n" + bridges[1].output() }
	consumerEnv := append(env, "JSBRIDGE_SECRET="+testSecret)
	// Two replicas of the ordered subscription deliver every stream in
	// version order (--ordering stream: partitions shared by leases, the
	// hand-over fence), with up to 64 deliveries at once over the streams:
	// a delivery lost with a dying server or a moved consumer leader holds
	// its partition back until it is redelivered.
	var orderedProcs []*proc
	for range 2 {
		orderedProcs = append(orderedProcs, startProc(t, consumerEnv, "consumer", "run",
			"--nats-url", cluster.ClientURLs(), "--stream-replicas", "3", "--ops-addr", "",
			"--start", "all", "--name", "ordered", "--url", osrv.URL, "--allow-private", "--filter", "events.>", "--ordering", "stream",
			"--ack-wait", "5s", "--timeout", "2s", "--backoff", "200ms", "--log-level", sz.logLevel))
	}
	orderedOutput := func() string {
		return orderedProcs[0].out.String() + "\n--- second ordered replica:\n" + orderedProcs[1].out.String()
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("JSBRIDGE_SOAK_LOGS") == "" {
			t.Logf("ordered consumer output:\n%s", orderedOutput())
		}
	})
	saveOutputs(t, map[string]fmt.Stringer{"bridge-1": bridges[0].out, "bridge-2": bridges[1].out,
		"ordered-1": orderedProcs[0].out, "ordered-2": orderedProcs[1].out})
	receivers := []receiverRun{{ordered, streams, orderedOutput}}

	// The producer appends one event to every stream each round.
	var rounds atomic.Int64
	stop := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		defer close(produced)
		for v := 0; ; v++ {
			select {
			case <-stop:
				return
			case <-time.After(sz.round):
			}
			if _, err := pool.Exec(context.Background(), "INSERT INTO "+schema+`.events (stream, version, name, data)
SELECT 'order-' || g, $1::bigint, 'OrderNoted', json_build_object('v', $1::bigint)::jsonb FROM generate_series(0, $2 - 1) g ORDER BY g`, v, streams); err != nil {
				produced <- err
				return
			}
			rounds.Add(1)
		}
	}()
	require.Eventually(t, func() bool { return jsMessages(js) >= uint64(10*streams) }, 60*time.Second, 20*time.Millisecond,
		"the bridges forward before the first kill; bridges:\n%s", bridgeOutput())
	// Two ordered replicas first share their partitions (claims,
	// releases, fences): under the whole suite's load that took more
	// than 60 s once, so the wait fails on a 60 s stall, not a deadline.
	for _, r := range receivers {
		require.True(t, waitProgress(func() bool { return r.rc.distinct() >= 5*r.streams }, r.rc.distinct, 60*time.Second, 5*time.Minute),
			"the %s receiver gets events before the first kill; consumer:\n%s", r.rc.name, r.out())
	}

	delivered := func() int {
		n := 0
		for _, r := range receivers {
			n += r.rc.distinct()
		}
		return n
	}
	fig := failoverFigures{}
	var lastKill time.Time
	for range sz.kills {
		if sz.killEvery[0] == 0 {
			// Each kill comes while the bridges forward and the consumers
			// deliver: every receiver has processed more since the last one.
			seen := make([]int, len(receivers))
			for i, r := range receivers {
				seen[i] = r.rc.distinct()
			}
			require.True(t, waitProgress(func() bool {
				for i, r := range receivers {
					if r.rc.distinct() < seen[i]+2*r.streams {
						return false
					}
				}
				return true
			}, delivered, 60*time.Second, 5*time.Minute), "deliveries go on between kills")
		} else if !lastKill.IsZero() {
			// The soak's schedule is what it tests: a kill every 8–12 s.
			span := sz.killEvery[1] - sz.killEvery[0]
			time.Sleep(time.Until(lastKill.Add(sz.killEvery[0] + rand.N(span))))
		}
		leader := cluster.leader(t, wire.DefaultEventsStream)
		cluster.kill(t, leader)
		killed := time.Now()
		lastKill = killed
		fig.kills++
		// Publishing is back when the new leader stores a message past
		// what it held when it was elected: the bridges' publishes got
		// through again (the producer appends every round, so this is at
		// most that much late).
		elected := cluster.leader(t, wire.DefaultEventsStream)
		require.NotEqual(t, leader, elected)
		base, ok := cluster.lastSeq(elected, wire.DefaultEventsStream)
		require.True(t, ok, "%s's replica of %s", elected, wire.DefaultEventsStream)
		require.Eventually(t, func() bool { return lastSeq(js) > base }, 60*time.Second, 20*time.Millisecond,
			"no event stored after killing %s (new leader %s at sequence %d); bridges:\n%s", leader, elected, base, bridgeOutput())
		fig.recover = append(fig.recover, time.Since(killed))

		time.Sleep(time.Until(killed.Add(sz.restartAfter))) // the soak's schedule: restart ~5 s after the kill
		cluster.restart(t, leader)
		restarted := time.Now()
		target := lastSeq(js)
		require.Eventually(t, func() bool {
			s, ok := cluster.lastSeq(leader, wire.DefaultEventsStream)
			return ok && s >= target
		}, 60*time.Second, 20*time.Millisecond, "%s's replica catches up to sequence %d", leader, target)
		fig.catchUp = append(fig.catchUp, time.Since(restarted))
	}

	killsDone := time.Now()
	close(stop)
	require.NoError(t, <-produced)
	want := int(rounds.Load()) * streams
	require.Eventually(t, func() bool {
		appended, forwarded, err := st.Totals(t.Context())
		return err == nil && appended == int64(want) && forwarded == appended
	}, 60*time.Second, 50*time.Millisecond, "every watermark at its head; bridges:\n%s", bridgeOutput())
	for _, r := range receivers {
		// As long as it makes progress: a loaded machine makes the
		// run longer, a stall still fails.
		n := int(rounds.Load()) * r.streams
		if !waitProgress(func() bool { return r.rc.distinct() == n }, r.rc.distinct, 60*time.Second, 5*time.Minute) {
			// What held it: the partitions' records and the streams
			// that stopped short, first.
			report := ""
			if r.rc == ordered {
				report = stallReport(t, js, pool, schema, ordered, streams, rounds.Load()-1) + "\n"
			}
			require.Failf(t, "receiver stalled", "the %s receiver processed %d of %d events (%d missing), then none for 60 s (or 5 min passed);\n%sconsumer:\n%s",
				r.rc.name, r.rc.distinct(), n, n-r.rc.distinct(), report, r.out())
		}
	}

	t.Logf("bridges and receivers done %v after the last kill's catch-up", time.Since(killsDone).Round(time.Millisecond))

	// JetStream: every event once, every stream in version order (0 lost,
	// 0 stored twice, 0 out of order).
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = rounds.Load() - 1
	}
	requireExactlyOnceInOrder(t, js, heads)

	// The receiver: every event processed once (the Postgres idempotency
	// store turns every redelivery into a 204); the ordered subscription's
	// first POSTs and processing in version order for every stream.
	versions := eventVersions(t, pool, schema)
	ord := ordered.check(t, versions, true)
	orderedOut := orderedOutput()
	// How often partitions changed hands: taken, released, and stopped
	// by a lease lost or a renewal deadline passed.
	t.Logf("ordered consumer: %d partitions taken, %d released, %d leases lost, %d lease deadlines passed",
		strings.Count(orderedOut, "partition taken"), strings.Count(orderedOut, "releasing partition"),
		strings.Count(orderedOut, "partition lease lost"), strings.Count(orderedOut, "partition lease deadline passed"))
	for _, d := range fig.recover {
		fig.maxRecoverWait = max(fig.maxRecoverWait, d)
	}
	t.Logf("failover figures: %d events in %d streams, %d stream-leader kills; lost 0, stored twice 0, out of order 0 (JetStream); "+
		"ordered receiver (gated): first-POST inversions %d, processed %d, processed out of order %d, processed twice %d, redelivered POSTs %d, gate answers %v; "+
		"publishing back after %v (max %v); restarted replica caught up after %v",
		want, streams, fig.kills, ord.firstPostInversions, ord.processed, ord.outOfOrder, ord.twice, ord.redelivered, ordered.gateAnswers(),
		roundAll(fig.recover), fig.maxRecoverWait.Round(time.Millisecond), roundAll(fig.catchUp))
	// The gated receiver's effects, written in the transaction that moved
	// each stream's position: every event once.
	var effects, distinctEffects int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*), count(DISTINCT event_id) FROM "+schema+".ordered_effects").Scan(&effects, &distinctEffects))
	require.Equal(t, want, effects, "effects the gated receiver committed (distinct %d)", distinctEffects)
	require.Equal(t, want, distinctEffects, "distinct events whose effect the gated receiver committed")
	require.Zero(t, ord.firstPostInversions, "first POSTs the ordered receiver got after a later version of their stream")
	require.Zero(t, ord.outOfOrder, "events the ordered receiver processed out of order")
	require.Zero(t, ord.twice, "events the ordered receiver processed twice")

	// Every node's replica holds what the leader holds.
	require.Eventually(t, func() bool { return cluster.inSync(wire.DefaultEventsStream) }, 30*time.Second, 20*time.Millisecond,
		"every node's replica of %s equals the leader's", wire.DefaultEventsStream)

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

// receiverRun is a receiver of the failover test with the number of
// streams its subscription takes and its consumer processes' output.
type receiverRun struct {
	rc      *orderedReceiver
	streams int
	out     func() string
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

func roundAll(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return "[" + strings.Join(slices.Clip(parts), " ") + "]"
}
