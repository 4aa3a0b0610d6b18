package nextengine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/wire"
)

// cluster is three nats-server nodes in this process, routed on loopback
// (embedded.StartCluster's shape, with the servers at hand so that the
// experiment can count their Raft groups).
type cluster struct {
	servers []*server.Server
	opts    []*server.Options
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	dir := t.TempDir()
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := range n {
		clientPorts[i], routePorts[i] = freePort(t), freePort(t)
	}
	c := &cluster{}
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[j]))
			}
		}
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: clientPorts[i],
			JetStream: true, StoreDir: filepath.Join(dir, strconv.Itoa(i)), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "x", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		}
		o.JetStreamLimits.DefaultMaxConsumers = -1
		// Each node runs under a profiler label of its name, inherited by
		// every goroutine it starts, so that one process's CPU profile can
		// be split by node (cpuByPart).
		var s *server.Server
		var err error
		pprof.Do(context.Background(), pprof.Labels(partLabel, o.ServerName), func(context.Context) {
			if s, err = server.NewServer(o); err == nil {
				go s.Start()
			}
		})
		require.NoError(t, err)
		c.servers = append(c.servers, s)
		c.opts = append(c.opts, o)
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			if s != nil {
				s.Shutdown()
			}
		}
	})
	for _, s := range c.servers {
		require.True(t, s.ReadyForConnections(30*time.Second))
	}
	// A meta leader that answers the API.
	nc := c.connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
	return c
}

// settle runs a creation until the new cluster takes it: right after its
// meta leader answers, a cluster may still refuse a replicated asset for a
// moment (its peers not yet all known).
func settle(t *testing.T, create func() error) {
	t.Helper()
	var err error
	for range 50 {
		if err = create(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond) // polling a condition the cluster reaches by itself
	}
	require.NoError(t, err)
}

func (c *cluster) urls() string {
	var u []string
	for _, o := range c.opts {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(u, ",")
}

func (c *cluster) connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// raftGroups counts the Raft groups each running server runs (its
// Raftz), by kind: meta, stream (S-…), consumer (C-…).
func (c *cluster) raftGroups() map[string]int {
	out := map[string]int{}
	for _, s := range c.servers {
		if s == nil || !s.Running() {
			continue
		}
		rz := s.Raftz(&server.RaftzOptions{AccountFilter: "$G"})
		if rz == nil {
			continue
		}
		for _, groups := range *rz {
			for name := range groups {
				switch {
				case strings.HasPrefix(name, "S-"):
					out["stream"]++
				case strings.HasPrefix(name, "C-"):
					out["consumer"]++
				default:
					out["other"]++
				}
			}
		}
	}
	return out
}

// cpu is this process's user + system CPU time.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// idle measures this process's CPU over d as a share of one core.
func idle(d time.Duration) float64 {
	c0, w0 := cpu(), time.Now()
	time.Sleep(d) // the measurement window itself, not a wait for a condition
	return float64(cpu()-c0) / float64(time.Since(w0)) * 100
}

func idleWindow() time.Duration {
	if v := os.Getenv("NEXTENGINE_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err == nil {
			return d
		}
	}
	return 20 * time.Second
}

func durableCount() int {
	if v := os.Getenv("NEXTENGINE_DURABLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err == nil {
			return n
		}
	}
	return 200
}

// TestSharedReadersOnACluster measures, on an in-process 3-node cluster
// with EVENTS at R3 (the partition transform on) and the engine's four
// KV buckets at R3:
//   - the Raft groups and the idle CPU of the layout alone, of 16 R1
//     AckNone readers (nats.go's ordered consumer, one per partition, a
//     pull waiting on each), and of N R3 durable pull consumers with a
//     pull waiting on each (today's layout, one per subscription);
//   - one position write: sequential compare-and-set updates of a 2 KB
//     and a 16 KB value in an R3 bucket (latency, CPU of the process);
//   - a reader whose server is shut down: how long until it delivers
//     again.
func TestSharedReadersOnACluster(t *testing.T) {
	experiment(t)
	c := startCluster(t, 3)
	nc := c.connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	window := idleWindow()

	settle(t, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"},
			Storage: jetstream.FileStorage, Replicas: 3, SubjectTransform: partitionTransform(), AllowDirect: true})
		return err
	})
	buckets := []jetstream.KeyValueConfig{
		{Bucket: "jsbridge_leases", TTL: 10 * time.Second, Replicas: 3},
		{Bucket: "jsbridge_positions", Replicas: 3},
		{Bucket: "jsbridge_endpoint_health", Replicas: 3},
		{Bucket: "jsbridge_subscriptions", Replicas: 3},
	}
	var kvs []jetstream.KeyValue
	for _, b := range buckets {
		settle(t, func() error {
			kv, err := js.CreateKeyValue(ctx, b)
			if err == nil {
				kvs = append(kvs, kv)
			}
			return err
		})
	}
	time.Sleep(3 * time.Second) // let elections settle before measuring
	t.Logf("layout alone: raft groups %v, idle CPU %.1f %% of a core (3 servers, this process)", c.raftGroups(), idle(window))

	// 16 readers, one per partition, each with a pull waiting.
	var got atomic.Int64
	var readers []jetstream.MessagesContext
	for p := range partitions {
		oc, err := js.OrderedConsumer(ctx, "EVENTS", jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"events.*.*.*." + strconv.Itoa(p)}})
		require.NoError(t, err)
		it, err := oc.Messages()
		require.NoError(t, err)
		readers = append(readers, it)
		go func() {
			for {
				if _, err := it.Next(); err != nil {
					return
				}
				got.Add(1)
			}
		}()
	}
	time.Sleep(3 * time.Second)
	t.Logf("+ 16 R1 readers: raft groups %v, idle CPU %.1f %% of a core", c.raftGroups(), idle(window))

	// Deliveries reach the readers.
	for i := range 64 {
		_, err := js.Publish(ctx, fmt.Sprintf("events.c.c-%d.Happened", i), []byte("{}"))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return got.Load() == 64 }, 10*time.Second, 20*time.Millisecond)

	// One position write on R3.
	for _, size := range []int{2 << 10, 16 << 10} {
		kv := kvs[1]
		val := make([]byte, size)
		rev, err := kv.Put(ctx, "pos.p0", val)
		require.NoError(t, err)
		const writes = 2000
		lat := make([]time.Duration, 0, writes)
		c0, w0 := cpu(), time.Now()
		var landed, refused atomic.Int64
		for range writes {
			t0 := time.Now()
			rev, err = commit(ctx, kv, "pos.p0", val, rev, &landed, &refused)
			require.NoError(t, err)
			lat = append(lat, time.Since(t0))
		}
		wall := time.Since(w0)
		used := cpu() - c0
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("position write (%d B, CAS update, R3): p50 %v p99 %v, %.0f writes/s sequential, CPU %.0f µs per write (3 servers and the client)",
			size, lat[writes/2], lat[writes*99/100], float64(writes)/wall.Seconds(), float64(used.Microseconds())/writes)
	}

	// Today's layout for comparison: N R3 durables, each with a pull
	// waiting (the per-subscription durables of ordering none).
	n := durableCount()
	var its []jetstream.MessagesContext
	t0 := time.Now()
	for i := range n {
		cons, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("sub%d", i), FilterSubject: fmt.Sprintf("events.m%d.>", i),
			AckPolicy: jetstream.AckExplicitPolicy, Replicas: 3})
		require.NoError(t, err)
		it, err := cons.Messages()
		require.NoError(t, err)
		its = append(its, it)
	}
	t.Logf("%d R3 durables created and pulling in %v", n, time.Since(t0).Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	t.Logf("+ %d R3 durables: raft groups %v, idle CPU %.1f %% of a core", n, c.raftGroups(), idle(window))
	for _, it := range its {
		it.Stop()
	}

	// A reader whose server goes away: find the server hosting reader 0's
	// current consumer, shut it down, publish to partition 0, and time the
	// delivery.
	names, err := listConsumers(ctx, js)
	require.NoError(t, err)
	var host string
	for _, name := range names {
		ci, err := js.Consumer(ctx, "EVENTS", name)
		if err != nil {
			continue
		}
		info := ci.CachedInfo()
		if info.Config.FilterSubject == "events.*.*.*.0" && info.Cluster != nil {
			host = info.Cluster.Leader
		}
	}
	require.NotEmpty(t, host, "the server hosting reader 0")
	stream0 := streamInPartition(0)
	before := got.Load()
	for i, s := range c.servers {
		if s.Name() == host {
			s.Shutdown()
			c.servers[i] = nil
		}
	}
	killed := time.Now()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.Publish(ctx, "events.c."+stream0+".Happened", []byte("{}"))
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)
	published := time.Since(killed)
	require.Eventually(t, func() bool { return got.Load() > before }, 60*time.Second, 20*time.Millisecond)
	t.Logf("reader 0's server %s shut down: publish accepted again after %v, reader 0 delivered after %v",
		host, published.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	for _, r := range readers {
		r.Stop()
	}
}

func listConsumers(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	s, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		return nil, err
	}
	l := s.ConsumerNames(ctx)
	var out []string
	for n := range l.Name() {
		out = append(out, n)
	}
	return out, l.Err()
}

// streamInPartition names a stream token the transform maps to partition p.
func streamInPartition(p int) string {
	for i := 0; ; i++ {
		s := fmt.Sprintf("c-%d", i)
		if wire.Partition(s, partitions) == p {
			return s
		}
	}
}

// commit is one position write: a compare-and-set update of key on rev.
// Two refusals are not conflicts: a compare-and-set whose answer was lost
// but which landed (nats.go retried the publish while a leader moved)
// fails on its own revision, and a clustered stream refuses an
// expected-last-sequence write while an earlier write of the same subject
// is still being applied (nats-server jetstream_batching.go
// checkMsgHeadersPreClusteredProposal, "If the subject is already in
// process, block"), with the key still at the revision written on. So a
// refusal reads the key back: moved past rev, the write landed (the
// engine's claim token tells its own from another owner's; the
// experiments have no other writer); still at rev, it writes again.
func commit(ctx context.Context, kv jetstream.KeyValue, key string, val []byte, rev uint64, landed, refused *atomic.Int64) (uint64, error) {
	for range 10 {
		r, err := kv.Update(ctx, key, val, rev)
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return r, err
		}
		e, gerr := kv.Get(ctx, key)
		if gerr != nil {
			return rev, gerr
		}
		if e.Revision() > rev {
			landed.Add(1)
			return e.Revision(), nil
		}
		refused.Add(1)
	}
	return rev, fmt.Errorf("%s: refused 10 times at revision %d", key, rev)
}

// TestPositionWriteCost puts one position write on R3 beside a publish to
// an R3 stream, sequential and with 16 writers at once (one per
// partition, as the owners would): latency and the CPU of the process (3
// servers and the client) per operation.
func TestPositionWriteCost(t *testing.T) {
	experiment(t)
	c := startCluster(t, 3)
	nc := c.connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	settle(t, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"},
			Storage: jetstream.FileStorage, Replicas: 3, SubjectTransform: partitionTransform()})
		return err
	})
	var kv jetstream.KeyValue
	settle(t, func() (err error) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "jsbridge_positions", Replicas: 3})
		return err
	})
	time.Sleep(3 * time.Second) // elections settle
	val := make([]byte, 2<<10)

	run := func(name string, writers, each int, op func(w, i int) error) {
		c0, w0 := cpu(), time.Now()
		errs := make(chan error, writers)
		lat := make(chan time.Duration, writers*each)
		for w := range writers {
			go func() {
				for i := range each {
					t0 := time.Now()
					if err := op(w, i); err != nil {
						errs <- err
						return
					}
					lat <- time.Since(t0)
				}
				errs <- nil
			}()
		}
		for range writers {
			require.NoError(t, <-errs)
		}
		wall, used := time.Since(w0), cpu()-c0
		close(lat)
		var all []time.Duration
		for d := range lat {
			all = append(all, d)
		}
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		n := writers * each
		t.Logf("%s: %d ops, %d at once: p50 %v p99 %v, %.0f ops/s, CPU %.0f µs per op",
			name, n, writers, all[n/2].Round(time.Microsecond), all[n*99/100].Round(time.Microsecond),
			float64(n)/wall.Seconds(), float64(used.Microseconds())/float64(n))
	}

	revs := make([]uint64, 16)
	for p := range 16 {
		revs[p], err = kv.Put(ctx, fmt.Sprintf("pos.p%d", p), val)
		require.NoError(t, err)
	}
	var landed, refused atomic.Int64
	update := func(key string, w int) (err error) {
		revs[w], err = commit(ctx, kv, key, val, revs[w], &landed, &refused)
		return err
	}
	run("position write (2 KB CAS update, R3)", 1, 2000, func(_, _ int) error {
		return update("pos.p0", 0)
	})
	run("position write (2 KB CAS update, R3)", 16, 500, func(w, _ int) error {
		return update(fmt.Sprintf("pos.p%d", w), w)
	})
	t.Logf("compare-and-set writes whose answer was lost but which landed: %d; refused while the key was at their revision (tried again): %d",
		landed.Load(), refused.Load())
	body := make([]byte, 512)
	run("EVENTS publish (512 B, R3, waiting for the PubAck)", 1, 2000, func(_, i int) error {
		_, err := js.Publish(ctx, fmt.Sprintf("events.c.c-%d.Happened", i), body)
		return err
	})
	run("EVENTS publish (512 B, R3, waiting for the PubAck)", 16, 500, func(w, i int) error {
		_, err := js.Publish(ctx, fmt.Sprintf("events.c.c-%d-%d.Happened", w, i), body)
		return err
	})
}
