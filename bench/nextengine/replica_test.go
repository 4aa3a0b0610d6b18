package nextengine

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// e7Streams is how many source streams the load of E7 spreads over.
const e7Streams = 10_000

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// streamToken returns the third token of subject, the stream's under a
// one-token prefix ("events.<cat>.<stream>.<name>", and the same with a
// fifth token), or "" when it has fewer.
func streamToken(subject string) string {
	_, rest, ok := strings.Cut(subject, ".")
	if !ok {
		return ""
	}
	if _, rest, ok = strings.Cut(rest, "."); !ok {
		return ""
	}
	tok, _, _ := strings.Cut(rest, ".")
	return tok
}

// partitionOf is the in-process filter's step for one message: the
// partition of its stream, as the transform would have stored it.
func partitionOf(subject string) int {
	return wire.Partition(streamToken(subject), partitions)
}

// fnvPartition is wire.Partition without the hash.Hash value and the
// []byte copy: fnv32a of tok modulo n, written out.
func fnvPartition(tok string, n int) int {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(tok); i++ {
		h ^= uint32(tok[i])
		h *= prime32
	}
	return int(h % uint32(n))
}

// connectAs connects to node first (then the others, for reconnects),
// under the profiler label part, which the connection's goroutines
// inherit.
func (c *cluster) connectAs(t *testing.T, first int, part string) *nats.Conn {
	t.Helper()
	var urls []string
	for i := range c.opts {
		o := c.opts[(first+i)%len(c.opts)]
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	var nc *nats.Conn
	var err error
	pprof.Do(context.Background(), pprof.Labels(partLabel, part), func(context.Context) {
		nc, err = nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond))
	})
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// replica is one consumer replica of E7: its own connection, the
// partitions it owns, and what its readers delivered.
type replica struct {
	name      string
	js        jetstream.JetStream
	owned     [partitions]bool
	delivered atomic.Int64
	kept      atomic.Int64
	head      atomic.Uint64 // stream sequence of the last delivery
}

// read starts an ordered consumer of filter on r's connection from
// sequence from (0: the next message on), under r's profiler label,
// counting every delivery and those it keeps: all of them, or with
// filtering only those of r's own partitions (the in-process filter). It
// returns the server hosting the consumer and a stop that ends the read
// and deletes the consumer.
func (r *replica) read(t *testing.T, filter string, filtering bool, from uint64) (host string, stop func()) {
	t.Helper()
	ctx := context.Background()
	var oc jetstream.Consumer
	var it jetstream.MessagesContext
	var err error
	pprof.Do(ctx, pprof.Labels(partLabel, r.name), func(context.Context) {
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter},
			DeliverPolicy: jetstream.DeliverNewPolicy, InactiveThreshold: 30 * time.Second}
		if from > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
		}
		oc, err = r.js.OrderedConsumer(ctx, "EVENTS", cfg)
		if err != nil {
			return
		}
		if it, err = oc.Messages(); err != nil {
			return
		}
		go func() {
			for {
				m, err := it.Next()
				if err != nil {
					return
				}
				if md, err := m.Metadata(); err == nil {
					r.head.Store(md.Sequence.Stream)
				}
				r.delivered.Add(1)
				if !filtering || r.owned[partitionOf(m.Subject())] {
					r.kept.Add(1)
				}
			}
		}()
	})
	require.NoError(t, err)
	if info := oc.CachedInfo(); info != nil && info.Cluster != nil {
		host = info.Cluster.Leader
	}
	return host, func() {
		it.Stop()
		if info := oc.CachedInfo(); info != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = r.js.DeleteConsumer(ctx, "EVENTS", info.Name)
		}
	}
}

// publisher is E7's load: rate events a second, open loop (late ticks
// catch up), round robin over e7Streams streams of 100 categories, each
// event the message forward.Message builds (the bridge's headers, a
// fresh Nats-Msg-Id) with 512 B of data, published async on a connection
// of its own under the label "publisher".
type publisher struct {
	js                jetstream.JetStream
	published, failed atomic.Int64
	stop, done        chan struct{}
}

// halt stops the steady load and waits for its goroutine.
func (p *publisher) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// burst publishes n events as fast as the server takes them (the
// backlog of E7's delivery-cost phase) and waits for their PubAcks.
func (p *publisher) burst(t *testing.T, n int) {
	t.Helper()
	data := []byte(`{"pad":"` + strings.Repeat("x", 500) + `"}`)
	for i := range n {
		m := forward.Message(event.Event{ID: int64(1_000_000_000 + i), Stream: fmt.Sprintf("c%d-%d", i%100, i%e7Streams),
			Name: "Happened", Data: data, Created: time.Now()}, forward.Config{})
		for {
			if _, err := p.js.PublishMsgAsync(m); err == nil {
				break
			}
			<-p.js.PublishAsyncComplete()
		}
	}
	select {
	case <-p.js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		t.Fatal("the backlog's publishes not acknowledged")
	}
}

func startPublisher(t *testing.T, c *cluster, rate int) *publisher {
	t.Helper()
	p := &publisher{stop: make(chan struct{}), done: make(chan struct{})}
	nc := c.connectAs(t, 0, "publisher")
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) {
		p.failed.Add(1)
	}))
	require.NoError(t, err)
	p.js = js
	streams := make([]string, e7Streams)
	for k := range streams {
		streams[k] = fmt.Sprintf("c%d-%d", k%100, k)
	}
	data := []byte(`{"pad":"` + strings.Repeat("x", 500) + `"}`)
	pprof.Do(context.Background(), pprof.Labels(partLabel, "publisher"), func(context.Context) {
		go func() {
			defer close(p.done)
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			start := time.Now()
			var n int64
			for {
				select {
				case <-p.stop:
					return
				case <-tick.C:
				}
				due := int64(time.Since(start).Seconds() * float64(rate))
				for ; n < due; n++ {
					k := int(n % e7Streams)
					m := forward.Message(event.Event{ID: n + 1, Stream: streams[k], Version: n / e7Streams,
						Name: "Happened", Data: data, Created: time.Now()}, forward.Config{})
					for {
						if _, err := js.PublishMsgAsync(m); err == nil {
							break
						}
						select { // too many outstanding: let some be acknowledged
						case <-js.PublishAsyncComplete():
						case <-time.After(time.Second):
						case <-p.stop:
							return
						}
					}
					p.published.Add(1)
				}
			}
		}()
	})
	t.Cleanup(p.halt)
	return p
}

// e7Window is one measured window of E7.
type e7Window struct {
	variant                    string
	wall, process              time.Duration
	parts                      map[string]time.Duration
	published, delivered, kept int64
}

func (w e7Window) core(d time.Duration) float64 { return float64(d) / float64(w.wall) * 100 }

func (w e7Window) perSecond(n int64) float64 { return float64(n) / w.wall.Seconds() }

// servers is the CPU of the three nodes together: their connections'
// goroutines (by node) and those nats-server labels itself (no node).
func (w e7Window) servers() time.Duration {
	return w.parts["n1"] + w.parts["n2"] + w.parts["n3"] + w.parts[serverPart]
}

// replicas is the CPU of the replicas' clients together.
func (w e7Window) replicas() time.Duration {
	var d time.Duration
	for part, v := range w.parts {
		if strings.HasPrefix(part, "replica-") {
			d += v
		}
	}
	return d
}

func (w e7Window) String() string {
	var profiled time.Duration
	for _, v := range w.parts {
		profiled += v
	}
	return fmt.Sprintf("%s: %.0f published/s, %.0f deliveries/s (%.0f kept/s); process %.1f %% of a core: "+
		"servers %.1f (connections by node: n1 %.1f, n2 %.1f, n3 %.1f; streams, consumers and Raft, no node: %.1f), "+
		"publisher %.1f, replicas %.1f (a %.1f, b %.1f, c %.1f), unlabelled (runtime, GC, timers) %.1f "+
		"(the profile saw %.0f %% of the process's CPU)",
		w.variant, w.perSecond(w.published), w.perSecond(w.delivered), w.perSecond(w.kept), w.core(w.process),
		w.core(w.servers()), w.core(w.parts["n1"]), w.core(w.parts["n2"]), w.core(w.parts["n3"]), w.core(w.parts[serverPart]),
		w.core(w.parts["publisher"]),
		w.core(w.replicas()), w.core(w.parts["replica-a"]), w.core(w.parts["replica-b"]), w.core(w.parts["replica-c"]),
		w.core(w.parts[""]), float64(profiled)/float64(w.process)*100)
}

// TestPerReplicaReaders (E7) compares, on an in-process 3-node cluster
// with EVENTS at R3 under a steady load (1,000 events/s over 10,000
// streams, NEXTENGINE_RATE), in one run and in alternating windows
// (NEXTENGINE_WINDOW, default 20 s; NEXTENGINE_ROUNDS, default 2):
//
//	(c)  the ingest alone, EVENTS as it is today (no transform);
//	(a)  three per-replica readers of events.>, each an ordered consumer
//	     on its replica's own connection, keeping in process the events of
//	     the replica's partitions (wire.Partition mod 16, p mod 3);
//	(c') the ingest alone, EVENTS with the partition transform;
//	(b)  sixteen partition readers of events.*.*.*.<p> under the
//	     transform (E2's layout), spread over the three connections.
//
// The CPU of each node, of the publisher and of each replica's client is
// split from one CPU profile of the process per window by goroutine
// labels (cpuByPart): each node is started, and each connection made,
// under a label its goroutines inherit. Then a take-over catch-up: a
// partition's floor 5 s behind the head, read up to the new owner's live
// reader's head (i) by a short-lived ordered consumer of events.> from
// the floor and (ii) by batched direct gets.
func TestPerReplicaReaders(t *testing.T) {
	experiment(t)
	window := envDuration("NEXTENGINE_WINDOW", 20*time.Second)
	rounds := envInt("NEXTENGINE_ROUNDS", 2)
	rate := envInt("NEXTENGINE_RATE", 1000)
	c := startCluster(t, 3)
	js, err := jetstream.New(c.connect(t))
	require.NoError(t, err)
	ctx := context.Background()
	settle(t, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"},
			Storage: jetstream.FileStorage, Replicas: 3, AllowDirect: true})
		return err
	})
	transformed := false
	setTransform := func(on bool) {
		if on == transformed {
			return
		}
		s, err := js.Stream(ctx, "EVENTS")
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.SubjectTransform = nil
		if on {
			cfg.SubjectTransform = partitionTransform()
		}
		_, err = js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
		transformed = on
	}

	reps := make([]*replica, 3)
	for i := range reps {
		name := "replica-" + string(rune('a'+i))
		rjs, err := jetstream.New(c.connectAs(t, i, name))
		require.NoError(t, err)
		reps[i] = &replica{name: name, js: rjs}
		for p := range partitions {
			reps[i].owned[p] = p%3 == i
		}
	}
	counts := func() (delivered, kept int64) {
		for _, r := range reps {
			delivered += r.delivered.Load()
			kept += r.kept.Load()
		}
		return delivered, kept
	}
	startReaders := func(variant string, from uint64) func() {
		var stops []func()
		hosts := map[string]int{}
		switch variant {
		case "a":
			for _, r := range reps {
				host, stop := r.read(t, "events.>", true, from)
				hosts[host]++
				stops = append(stops, stop)
			}
		case "b":
			for p := range partitions {
				host, stop := reps[p%3].read(t, "events.*.*.*."+strconv.Itoa(p), false, from)
				hosts[host]++
				stops = append(stops, stop)
			}
		}
		if len(stops) > 0 {
			t.Logf("(%s) %d readers, hosted (consumers per node): %v", variant, len(stops), hosts)
		}
		return func() {
			for _, s := range stops {
				s()
			}
		}
	}

	pub := startPublisher(t, c, rate)
	time.Sleep(3 * time.Second) // elections and the first publishes settle
	t.Logf("E7: %d events/s over %d streams, %v windows, %d rounds; the machine is shared (load average: %s)",
		rate, e7Streams, window, rounds, loadAverage())

	measure := func(round int, variant string) e7Window {
		p0 := pub.published.Load()
		d0, k0 := counts()
		w0 := time.Now()
		parts, process, err := cpuProfile(fmt.Sprintf("e7-%d-%s", round+1, strings.ReplaceAll(variant, "'", "t")),
			func() { time.Sleep(window) }) // the window itself
		require.NoError(t, err)
		d1, k1 := counts()
		w := e7Window{variant: variant, wall: time.Since(w0), process: process, parts: parts,
			published: pub.published.Load() - p0, delivered: d1 - d0, kept: k1 - k0}
		t.Log(w)
		return w
	}
	byVariant := map[string][]e7Window{}
	for round := range rounds {
		order := []string{"c", "a", "c'", "b"}
		if round%2 == 1 {
			order = []string{"c'", "b", "c", "a"}
		}
		for _, v := range order {
			setTransform(v == "b" || v == "c'")
			stop := startReaders(strings.TrimSuffix(v, "'"), 0)
			time.Sleep(3 * time.Second) // readers created, caught up with "new"
			byVariant[v] = append(byVariant[v], measure(round, v))
			stop()
		}
	}
	for i := range rounds {
		for _, pair := range [][2]string{{"a", "c"}, {"b", "c'"}} {
			v, base := byVariant[pair[0]][i], byVariant[pair[1]][i]
			srv := v.core(v.servers()) - base.core(base.servers())
			perDelivery := func(d time.Duration) float64 {
				return float64(d.Microseconds()) / float64(max(v.delivered, 1))
			}
			extra := time.Duration(float64(v.servers()) - float64(base.servers())*float64(v.wall)/float64(base.wall))
			t.Logf("round %d, (%s) − (%s): servers %+.1f %% of a core (n1 %+.1f, n2 %+.1f, n3 %+.1f, no node %+.1f), replicas' clients %.1f %%, process %+.1f %%; "+
				"per delivery: servers %.1f µs, client %.1f µs; deliveries %.0f/s for %.0f events/s",
				i+1, pair[0], pair[1], srv,
				v.core(v.parts["n1"])-base.core(base.parts["n1"]), v.core(v.parts["n2"])-base.core(base.parts["n2"]),
				v.core(v.parts["n3"])-base.core(base.parts["n3"]), v.core(v.parts[serverPart])-base.core(base.parts[serverPart]),
				v.core(v.replicas()),
				v.core(v.process)-base.core(base.process),
				perDelivery(extra), perDelivery(v.replicas()), v.perSecond(v.delivered), v.perSecond(v.published))
		}
	}

	// Take-over catch-up: replica a takes partition p it did not own;
	// p's floor is 5 s behind the head; it reads (floor, H], H its live
	// reader's head at the take-over, and keeps p's events.
	setTransform(false)
	stop := startReaders("a", 0)
	defer stop()
	time.Sleep(3 * time.Second)
	newOwner := reps[0]
	ways := []struct {
		name string
		read func(floor, head uint64, p int) (read, kept, requests int)
	}{
		{"a short-lived reader of events.>", func(floor, head uint64, p int) (int, int, int) {
			return catchUpByReader(t, newOwner.js, floor, head, p)
		}},
		{"batched direct gets (256) by sequence", func(floor, head uint64, p int) (int, int, int) {
			return catchUpByDirectGet(t, newOwner.js.Conn(), floor, head, p, "")
		}},
		{"batched direct gets (256) with next_by_subj events.>", func(floor, head uint64, p int) (int, int, int) {
			return catchUpByDirectGet(t, newOwner.js.Conn(), floor, head, p, "events.>")
		}},
	}
	// catchUp reads (floor, head] every way, the order rotating with i,
	// and logs the time, the events read and kept, and the process's CPU
	// over the read (the live load's included when it runs).
	catchUp := func(what string, i, p int, floor, head uint64) {
		var order []int
		for k := range ways {
			order = append(order, (i+k)%len(ways))
		}
		for _, k := range order {
			c0, w0 := cpu(), time.Now()
			read, kept, requests := ways[k].read(floor, head, p)
			wall, used := time.Since(w0), cpu()-c0
			t.Logf("catch-up %s %d, partition %d, (%d, %d] (%d events) by %s: %v, read %d, kept %d, %d requests; "+
				"process CPU %v (%.1f µs per event read)",
				what, i+1, p, floor, head, head-floor, ways[k].name, wall.Round(time.Microsecond), read, kept, requests,
				used.Round(time.Microsecond), float64(used.Nanoseconds())/1000/float64(max(read, 1)))
			require.Equal(t, int(head-floor), read, "every event of (floor, head] read once")
		}
	}
	for i, p := range []int{1, 2, 4, 5} {
		// The floor is 5 s of events behind the new owner's reader's head
		// (counted in events: the reader may lag the stream on a loaded
		// machine).
		time.Sleep(5 * time.Second) // the live load goes on between take-overs
		head := newOwner.head.Load()
		catchUp("under the live load", i, p, head-uint64(5*rate), head)
	}

	// What a delivery costs without the ingest beside it: the steady load
	// stopped, a backlog stored under the transform (so that both shapes
	// can read it), read from its first sequence by (a) and by (b),
	// alternating, twice; the process's CPU per delivery and its split.
	stop()
	pub.halt()
	t.Logf("publishes failed: %d", pub.failed.Load())
	setTransform(true)
	s, err := js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	from := info.State.LastSeq + 1
	backlog := envInt("NEXTENGINE_BACKLOG", 30_000)
	pub.burst(t, backlog)
	time.Sleep(2 * time.Second) // the followers store the last of it
	for round := range 2 {
		order := []string{"a", "b"}
		if round == 1 {
			order = []string{"b", "a"}
		}
		for _, v := range order {
			want := int64(backlog)
			if v == "a" {
				want *= 3
			}
			d0, _ := counts()
			stopReaders := func() {}
			w0 := time.Now()
			parts, process, err := cpuProfile(fmt.Sprintf("backlog-%d-%s", round+1, v), func() {
				stopReaders = startReaders(v, from)
				for end := time.Now().Add(5 * time.Minute); time.Now().Before(end); {
					if d, _ := counts(); d-d0 >= want {
						return
					}
					time.Sleep(20 * time.Millisecond) // polling the readers' progress
				}
			})
			w := e7Window{variant: "backlog " + v, wall: time.Since(w0), process: process, parts: parts}
			stopReaders()
			require.NoError(t, err)
			d1, _ := counts()
			w.delivered = d1 - d0
			require.GreaterOrEqual(t, w.delivered, want, "every reader read the backlog")
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(w.delivered) }
			t.Logf("backlog of %d events read by (%s): %d deliveries in %v; CPU per delivery: process %.1f µs, "+
				"servers %.1f µs (n1 %.1f, n2 %.1f, n3 %.1f, no node %.1f), clients %.1f µs, unlabelled %.1f µs",
				backlog, v, w.delivered, w.wall.Round(time.Millisecond), per(process), per(w.servers()),
				per(parts["n1"]), per(parts["n2"]), per(parts["n3"]), per(parts[serverPart]), per(w.replicas()), per(parts[""]))
		}
	}
	// The same catch-ups without the live load, over ranges of the
	// backlog: the process's CPU is the catch-up's alone.
	for i, p := range []int{1, 2, 4, 5} {
		floor := from - 1 + uint64(i*6*rate)
		if head := floor + uint64(5*rate); head < from+uint64(backlog) {
			catchUp("without the live load", i, p, floor, head)
		}
	}
}

// catchUpByReader reads (floor, head] of EVENTS through an ordered
// consumer of events.> created for it, and keeps the events of
// partition p. It returns the events read and kept, and 1 (one consumer).
func catchUpByReader(t *testing.T, js jetstream.JetStream, floor, head uint64, p int) (read, kept, requests int) {
	ctx := context.Background()
	oc, err := js.OrderedConsumer(ctx, "EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"events.>"},
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: floor + 1, InactiveThreshold: 30 * time.Second})
	require.NoError(t, err)
	it, err := oc.Messages()
	require.NoError(t, err)
	defer func() {
		it.Stop()
		if info := oc.CachedInfo(); info != nil {
			_ = js.DeleteConsumer(ctx, "EVENTS", info.Name)
		}
	}()
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		m, err := it.Next(jetstream.NextContext(wait))
		require.NoError(t, err)
		md, err := m.Metadata()
		require.NoError(t, err)
		if md.Sequence.Stream > head {
			return read, kept, 1
		}
		read++
		if partitionOf(m.Subject()) == p {
			kept++
		}
		if md.Sequence.Stream == head {
			return read, kept, 1
		}
	}
}

// catchUpByDirectGet reads (floor, head] of EVENTS by batched direct gets
// (256 a request), by sequence alone or with next_by_subj filter,
// reading again when an answer ends below head (a follower behind), and
// keeps the events of partition p. It returns the events read and kept
// and the requests made.
func catchUpByDirectGet(t *testing.T, nc *nats.Conn, floor, head uint64, p int, filter string) (read, kept, requests int) {
	for from := floor + 1; from <= head; {
		req := map[string]any{"seq": from, "batch": 256}
		if filter != "" {
			req["next_by_subj"] = filter
		}
		msgs, err := directBatch(nc, "EVENTS", req)
		require.NoError(t, err)
		requests++
		require.Less(t, requests, 10_000, "direct gets make no progress")
		for _, m := range msgs {
			seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			require.NoError(t, err)
			if seq > head {
				return read, kept, requests
			}
			read++
			if partitionOf(m.Header.Get("Nats-Subject")) == p {
				kept++
			}
			from = seq + 1
		}
	}
	return read, kept, requests
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// BenchmarkPartitionFilter is the per-replica reader's own cost per
// delivered event beyond receiving it: the stream token of the subject,
// its partition (fnv32a mod 16), and whether this replica owns it, by
// wire.SubjectPartition, by the bench's own token cut and hash, and by
// hash/fnv as wire.Partition hashed before (a hash.Hash value and a
// []byte copy of the token). Ten thousand subjects as E7 publishes them;
// the replica owns every third partition.
func BenchmarkPartitionFilter(b *testing.B) {
	subjects := make([]string, e7Streams)
	for k := range subjects {
		subjects[k] = wire.Subject("events", fmt.Sprintf("c%d-%d", k%100, k), "Happened")
		if got, want := fnvPartition(streamToken(subjects[k]), partitions), partitionOf(subjects[k]); got != want {
			b.Fatalf("%s: fnvPartition %d, wire.Partition %d", subjects[k], got, want)
		}
	}
	var owned [partitions]bool
	for p := 0; p < partitions; p += 3 {
		owned[p] = true
	}
	// On the shared machine ns/op counts the time the benchmark waited
	// for a core; cpu-ns/op is the process's CPU time per op.
	run := func(part func(string) int) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			kept := 0
			c0 := cpu()
			for i := 0; b.Loop(); i++ {
				if owned[part(subjects[i%len(subjects)])] {
					kept++
				}
			}
			b.ReportMetric(float64((cpu()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			if kept == 0 {
				b.Fatal("kept nothing")
			}
		}
	}
	b.Run("wire.SubjectPartition", run(func(s string) int {
		p, _ := wire.SubjectPartition("events", s, partitions)
		return p
	}))
	b.Run("fnv32a written out", run(func(s string) int { return fnvPartition(streamToken(s), partitions) }))
	b.Run("hash/fnv (wire.Partition before SubjectPartition)", func(b *testing.B) {
		h := fnv.New32a()
		run(func(s string) int {
			h.Reset()
			_, _ = h.Write([]byte(streamToken(s)))
			return int(h.Sum32() % partitions)
		})(b)
	})
}
