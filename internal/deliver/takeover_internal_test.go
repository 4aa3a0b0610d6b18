package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// A take-over from a frozen owner with unacked events (docs/ordering.md,
// "Reset on take-over"). The first replica owns both partitions and
// delivers to a gated receiver; at its 12th ack (some streams acked above
// the ack floor, a slow stream's head in flight, the rest pulled or in its
// lanes) its NATS connection stops passing anything either way (a proxy
// holds what it reads, as a frozen process's socket does), while its POSTs
// still reach the receiver. Its lease expires; the second replica, on a
// fake clock run at twice real time, takes both partitions over. AckWait
// is a minute: the take-over may not wait for it. It passes the fence
// and delivers every event, each processed once and in order by the gate,
// before the server's AckWait (real time) or the second replica's clock
// moved AckWait.
func TestATakeOverFromAFrozenOwnerDoesNotWaitAckWait(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes a replica and waits out its lease (about 6 s)")
	}
	t.Parallel()
	tk := frozenTakeOver(t)
	t.Logf("every event processed %s after the take-over started (the second replica's clock moved %s; AckWait %s)",
		tk.took.Round(time.Millisecond), tk.advanced.Round(time.Millisecond), tk.sub.AckWait)
	require.Less(t, tk.took, tk.sub.AckWait/2, "the take-over did not wait for the frozen owner's unacked events to come back")
	require.Less(t, tk.advanced, tk.sub.AckWait, "nor did its clock move AckWait")
	require.True(t, tk.secondLog.has("partition consumer reset to its ack floor"), "the new owner reset the partition consumers")
}

// The former owner of TestATakeOverFromAFrozenOwnerDoesNotWaitAckWait
// wakes after the new owner's reset: what its connection held goes out
// (its late ack, a delivered-record write, pull requests under its old
// pin), and it acks, Naks and sends InProgress again for every event it
// had acked before the freeze (old delivery sequences of events no longer
// pending, or pending on the new owner). Nothing moves wrong: it POSTs
// nothing more under its former claims (past its deadline, its record
// taken), none of those events is sent again, and events written
// afterwards are processed once and in order (by the new owner, or by
// the woken one once it claimed a partition anew, under a new epoch:
// the two share the partitions out again).
func TestAFormerOwnerWakingAfterTheResetMovesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes a replica, waits out its lease, wakes it (about 8 s)")
	}
	t.Parallel()
	tk := frozenTakeOver(t)
	posts := tk.rc.postCount()
	wokeAt := time.Now()
	tk.proxy.resume()
	for _, m := range tk.acked() {
		_ = m.Nak()
		_ = m.InProgress()
		_ = m.Ack()
	}
	require.Eventually(t, func() bool { return tk.firstLog.has("lease is lost") || tk.firstLog.has("partition lease lost") },
		20*time.Second, 10*time.Millisecond, "the woken owner learns its lease is lost")
	tk.publish(t, 6, 9)
	require.Eventually(t, func() bool { return tk.rc.processedAll(tk.streams, 9) }, 30*time.Second, 10*time.Millisecond,
		"the events written after the wake-up are processed: %v", tk.rc.processedVersions())
	tk.rc.requireChains(t, tk.streams, 9)
	require.Equal(t, posts+len(tk.streams)*3, tk.rc.postCount(), "only the new events were POSTed: nothing acked before was sent again")
	require.Zero(t, tk.rc.staleFrom("first", wokeAt), "the woken owner POSTed nothing under its former claims (it may claim a partition anew: a rebalance)")
}

// takeOver is what frozenTakeOver leaves: the frozen first replica's proxy
// and log, the receiver, and the take-over's figures.
type takeOver struct {
	sub       subscription.Subscription
	rc        *chainReceiver
	proxy     *holdProxy
	firstLog  *msgLog
	secondLog *msgLog
	streams   []string
	publish   func(t *testing.T, from, to int64)
	// took is the real time from the second replica's start to every
	// event processed; advanced how far its fake clock moved meanwhile.
	took, advanced time.Duration
	mu             sync.Mutex
	ackedMsgs      []jetstream.Msg // the messages the first replica acked (or tried to)
}

func (tk *takeOver) acked() []jetstream.Msg {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return append([]jetstream.Msg(nil), tk.ackedMsgs...)
}

// frozenTakeOver runs the first replica until it freezes with events
// unacked, waits for its leases to expire, and runs the second replica
// until every event (6 versions of each stream) was processed.
func frozenTakeOver(t *testing.T) *takeOver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	srv, js := startJetStreamServer(t)
	proxy := newHoldProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	frozenNC, err := nats.Connect("nats://"+proxy.addr(), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(frozenNC.Close)
	frozenJS, err := jetstream.New(frozenNC)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)

	tk := &takeOver{proxy: proxy, firstLog: &msgLog{}, secondLog: &msgLog{}}
	for i := range 8 {
		tk.streams = append(tk.streams, fmt.Sprintf("order-%d", i))
	}
	tk.rc = newChainReceiver(t, func(stream string) time.Duration {
		if stream == "order-0" {
			return 300 * time.Millisecond // its head in flight keeps the ack floor low
		}
		return 10 * time.Millisecond
	})
	var nextID atomic.Int64
	tk.publish = func(t *testing.T, from, to int64) {
		for v := from; v < to; v++ {
			for _, st := range tk.streams {
				id := nextID.Add(1)
				tk.rc.expect(event.FormatID(id), st, v)
				e := event.Event{ID: id, Stream: st, Version: v, Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()}
				_, err := js.PublishMsg(ctx, forward.Message(e, forward.Config{}))
				require.NoError(t, err)
			}
		}
	}
	tk.sub = subscription.Subscription{
		Name: "takeover", FilterSubjects: []string{"events.order.>"}, URL: tk.rc.URL, AllowPrivate: true,
		Secrets: []string{chainSecret}, Ordering: subscription.OrderingStream, Start: subscription.Start{Policy: subscription.StartAll},
		AckWait: time.Minute, Timeout: 2 * time.Second, MaxInFlight: 4,
	}
	run := func(js jetstream.JetStream, cfg Config) {
		cfg.Partitions, cfg.LeaseTTL = 2, 4*time.Second
		c, err := New(js, cfg, tk.sub)
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(rctx) }()
		t.Cleanup(func() { stop(); <-done })
	}

	// The first replica freezes at its 12th ack: that ack stays in the
	// proxy with everything else it sends from then on.
	var acks atomic.Int32
	frozen := make(chan struct{})
	run(frozenJS, Config{ReplicaID: "first", Logger: slog.New(tk.firstLog), sendAck: func(m jetstream.Msg) error {
		tk.mu.Lock()
		tk.ackedMsgs = append(tk.ackedMsgs, m)
		tk.mu.Unlock()
		if acks.Add(1) == 12 {
			proxy.block()
			close(frozen)
		}
		return m.Ack()
	}})
	tk.publish(t, 0, 6)
	select {
	case <-frozen:
	case <-ctx.Done():
		t.Fatal("the first replica never acked 12 events")
	}
	info, err := js.Consumer(ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(tk.sub.Name, 0))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		i, err := info.Info(ctx)
		return err == nil && i.NumAckPending > 0
	}, 10*time.Second, 10*time.Millisecond, "the frozen owner left events unacked")
	leases, err := js.KeyValue(ctx, wire.DefaultLeaseBucket)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for p := range 2 {
			if _, err := leases.Get(ctx, wire.LeaseKey(tk.sub.Name, p)); err == nil {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "the frozen owner's leases expire")

	// The second replica, on a fake clock at twice real time.
	clock := clockwork.NewFakeClock()
	var advanced atomic.Int64
	tick := time.NewTicker(10 * time.Millisecond)
	stopTick := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopTick:
				return
			case <-tick.C:
				clock.Advance(20 * time.Millisecond)
				advanced.Add(int64(20 * time.Millisecond))
			}
		}
	}()
	t.Cleanup(func() { tick.Stop(); close(stopTick) })
	started := time.Now()
	run(js, Config{ReplicaID: "second", Clock: clock, Logger: slog.New(tk.secondLog)})
	require.Eventually(t, func() bool { return tk.rc.processedAll(tk.streams, 6) }, 50*time.Second, 5*time.Millisecond,
		"every event processed: %v", tk.rc.processedVersions())
	tk.took, tk.advanced = time.Since(started), time.Duration(advanced.Load())
	tk.rc.requireChains(t, tk.streams, 6)
	return tk
}

// chainSecret signs the take-over tests' webhooks.
var chainSecret = "whsec_" + strings.Repeat("MDEyMzQ1Njc4OWFiY2RlZg==", 1)

// chainReceiver is a receiver as the docs tell one to write it
// (webhook.Handler, its order gate on a memory store requiring the
// version chain): it records the versions its handler processed per
// stream, and every POST's replica and time.
type chainReceiver struct {
	*httptest.Server
	mu        sync.Mutex
	events    map[string]orderedAt // event id → stream and version
	processed map[string][]int64
	wrong     []string // processed requests whose predecessor was not the last processed
	posts     []postAt
}

type orderedAt struct {
	stream  string
	version int64
}

type postAt struct {
	replica string
	epoch   string // Jsbridge-Lease-Epoch
	at      time.Time
}

func newChainReceiver(t *testing.T, delay func(stream string) time.Duration) *chainReceiver {
	t.Helper()
	rc := &chainReceiver{events: map[string]orderedAt{}, processed: map[string][]int64{}}
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{chainSecret})
	require.NoError(t, err)
	gate := webhook.NewOrderGate(webhook.NewMemoryOrderStore(), webhook.WithGateRequireHeaders(), webhook.WithGateLogger(slog.New(slog.DiscardHandler)))
	h := webhook.Handler(v, webhook.NewMemoryStore(1<<12), time.Hour, func(_ context.Context, r *http.Request, _ []byte) error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		e := rc.events[r.Header.Get(wire.HeaderIdempotencyKey)]
		want := wire.PreviousNone
		if p := rc.processed[e.stream]; len(p) > 0 {
			want = wire.FormatPreviousVersion(p[len(p)-1])
		}
		if got := r.Header.Get(wire.HeaderPreviousVersion); got != want {
			rc.wrong = append(rc.wrong, fmt.Sprintf("%s v%d: previous %q, last processed %q", e.stream, e.version, got, want))
		}
		rc.processed[e.stream] = append(rc.processed[e.stream], e.version)
		return nil
	}, webhook.WithOrderGate(gate), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		e := rc.events[r.Header.Get(wire.HeaderIdempotencyKey)]
		rc.posts = append(rc.posts, postAt{replica: r.Header.Get(wire.HeaderReplica), epoch: r.Header.Get(wire.HeaderLeaseEpoch), at: time.Now()})
		rc.mu.Unlock()
		time.Sleep(delay(e.stream))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *chainReceiver) expect(id, stream string, version int64) {
	rc.mu.Lock()
	rc.events[id] = orderedAt{stream, version}
	rc.mu.Unlock()
}

func (rc *chainReceiver) processedVersions() map[string][]int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string][]int64{}
	for k, v := range rc.processed {
		out[k] = append([]int64(nil), v...)
	}
	return out
}

// processedAll reports whether at least n versions of every stream were
// processed.
func (rc *chainReceiver) processedAll(streams []string, n int) bool {
	got := rc.processedVersions()
	for _, st := range streams {
		if len(got[st]) < n {
			return false
		}
	}
	return true
}

// requireChains checks that every stream's versions 0..n-1 were processed
// once each, in order, each naming the last processed as its predecessor.
func (rc *chainReceiver) requireChains(t *testing.T, streams []string, n int) {
	t.Helper()
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i)
	}
	got := rc.processedVersions()
	for _, st := range streams {
		require.Equal(t, want, got[st], "stream %s: each version processed once, in order", st)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Empty(t, rc.wrong, "every processed request names the last processed version")
}

func (rc *chainReceiver) postCount() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.posts)
}

// staleFrom counts the POSTs replica sent since since under a lease
// epoch it had used before since: as the zombie of its former claims.
func (rc *chainReceiver) staleFrom(replica string, since time.Time) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	old := map[string]bool{}
	for _, p := range rc.posts {
		if p.replica == replica && p.at.Before(since) {
			old[p.epoch] = true
		}
	}
	n := 0
	for _, p := range rc.posts {
		if p.replica == replica && !p.at.Before(since) && old[p.epoch] {
			n++
		}
	}
	return n
}

// msgLog is a slog handler that keeps the messages logged.
type msgLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *msgLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *msgLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *msgLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *msgLog) WithGroup(string) slog.Handler      { return l }

// has reports whether a message containing s was logged.
func (l *msgLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// holdProxy forwards TCP connections to a target until blocked: then it
// passes nothing either way and holds what it read (connections stay
// open), as the socket of a frozen process does, until resumed.
type holdProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{} // closed while forwarding
}

func newHoldProxy(t *testing.T, target string) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &holdProxy{ln: ln, target: target, open: make(chan struct{})}
	close(p.open)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *holdProxy) addr() string { return p.ln.Addr().String() }

func (p *holdProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *holdProxy) block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = make(chan struct{})
}

func (p *holdProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.open)
}

func (p *holdProxy) serve(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				<-p.gate()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
}

// A reset at a take-over clears JetStream's delivery counts: an event the
// consumer had delivered before it comes again with NumDelivered 1. It
// still reads its failed attempts (resetThrough), so MaxDeliver bounds its
// POSTs across any number of resets; an event first delivered after the
// reset reads nothing, as before.
func TestAResetDoesNotGiveAnEventMoreAttempts(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	log := slog.New(slog.DiscardHandler)
	before := failedAttempts{kv: kv, sub: "orders", log: log}
	failing := newFakeMsg("order-1", 3, 40)
	failing.md.NumDelivered = 1
	attempt, recorded := before.first(failing, "7")
	require.Equal(t, 1, attempt)
	require.False(t, recorded)
	before.failed("7", 1)
	failing.md.NumDelivered = 2
	attempt, _ = before.first(failing, "7")
	require.Equal(t, 2, attempt)
	before.failed("7", 2)

	// The next owner reset the consumer, which had delivered up to 50.
	after := failedAttempts{kv: kv, sub: "orders", log: log, resetThrough: resetMark(50)}
	failing.md.NumDelivered = 1
	require.True(t, after.redelivered(failing))
	attempt, recorded = after.first(failing, "7")
	require.Equal(t, 3, attempt, "its two failed attempts still count after the reset")
	require.True(t, recorded)
	fresh := newFakeMsg("order-2", 0, 51)
	fresh.md.NumDelivered = 1
	require.False(t, after.redelivered(fresh), "first delivered after the reset")
	attempt, recorded = after.first(fresh, "8")
	require.Equal(t, 1, attempt)
	require.False(t, recorded)
}

// A take-over with nothing pending on the partition consumer (the former
// owner stopped gracefully with every event settled) costs one consumer
// info and no reset: the consumer's delivery sequence goes on from where
// it was.
func TestATakeOverWithNothingPendingDoesNotReset(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two owners one after the other (about 3 s)")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := startJetStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	streams := []string{"order-a", "order-b", "order-c"}
	rc := newChainReceiver(t, func(string) time.Duration { return 0 })
	var nextID int64
	publish := func(from, to int64) {
		for v := from; v < to; v++ {
			for _, st := range streams {
				nextID++
				rc.expect(event.FormatID(nextID), st, v)
				e := event.Event{ID: nextID, Stream: st, Version: v, Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()}
				_, err := js.PublishMsg(ctx, forward.Message(e, forward.Config{}))
				require.NoError(t, err)
			}
		}
	}
	s := subscription.Subscription{
		Name: "idle", FilterSubjects: []string{"events.order.>"}, URL: rc.URL, AllowPrivate: true,
		Secrets: []string{chainSecret}, Ordering: subscription.OrderingStream, Start: subscription.Start{Policy: subscription.StartAll},
		AckWait: time.Minute, Timeout: 2 * time.Second,
	}
	run := func(id string, log *msgLog) (stop func()) {
		c, err := New(js, Config{ReplicaID: id, Partitions: 1, LeaseTTL: time.Second, Logger: slog.New(log)}, s)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(rctx) }()
		return func() { cancel(); <-done }
	}
	var cons jetstream.Consumer // the partition consumer, once the first owner made it
	pending := func() (jetstream.ConsumerInfo, bool) {
		i, err := cons.Info(ctx)
		return *i, err == nil && i.NumAckPending == 0
	}
	stopFirst := run("first", &msgLog{})
	publish(0, 4)
	require.Eventually(t, func() bool { return rc.processedAll(streams, 4) }, 20*time.Second, 10*time.Millisecond)
	cons, err = js.Consumer(ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(s.Name, 0))
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := pending(); return ok }, 10*time.Second, 10*time.Millisecond, "every ack landed")
	stopFirst()
	before, _ := pending()

	second := &msgLog{}
	defer run("second", second)()
	publish(4, 6)
	require.Eventually(t, func() bool { return rc.processedAll(streams, 6) }, 20*time.Second, 10*time.Millisecond)
	rc.requireChains(t, streams, 6)
	require.True(t, second.has("partition taken"))
	require.False(t, second.has("reset to its ack floor"), "nothing was pending: no reset")
	after, _ := pending()
	require.Greater(t, after.Delivered.Consumer, before.Delivered.Consumer, "the delivery sequence went on (a reset starts it again at 1)")
}

// On a JetStream cluster the reset is replicated through the consumer's
// Raft group and answered once applied: when resetToAckFloor returns,
// the consumer (R3) has nothing pending and hands out everything above
// its ack floor at once, in stream order, those acked out of order above
// the floor included (what the delivered record covers), far sooner than
// AckWait (a minute). With nothing pending it resets nothing.
func TestAResetOnAClusterIsAppliedWhenAnswered(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := embedded.StartCluster(embedded.ClusterConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(cl.Shutdown)
	nc, err := cl.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	copyName := wire.OrderedStream("EVENTS")
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: copyName, Subjects: []string{"ordered.events.>"}, Replicas: 3})
	require.NoError(t, err)
	cons, err := js.CreateConsumer(ctx, copyName, jetstream.ConsumerConfig{
		Durable: wire.PartitionDurable("orders", 0), AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, Replicas: 3,
	})
	require.NoError(t, err)
	for v := range 6 {
		_, err := js.Publish(ctx, fmt.Sprintf("ordered.events.0.order.order-%d.OrderNoted", v%2), nil)
		require.NoError(t, err)
	}
	// fetch takes 6 messages, acking 2 and 4 (out of order, above the
	// floor), or all of them.
	fetch := func(all bool) []uint64 {
		t.Helper()
		batch, err := cons.Fetch(6, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		var seqs []uint64
		for m := range batch.Messages() {
			md, err := m.Metadata()
			require.NoError(t, err)
			require.EqualValues(t, 1, md.NumDelivered, "seq %d", md.Sequence.Stream)
			seqs = append(seqs, md.Sequence.Stream)
			if all || md.Sequence.Stream == 2 || md.Sequence.Stream == 4 {
				require.NoError(t, m.DoubleAck(ctx))
			}
		}
		return seqs
	}
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, fetch(false))

	or := &orderedRunner{
		r: &runner{sub: subscription.Subscription{Name: "orders"}, log: slog.New(slog.DiscardHandler), js: js},
		o: &ordering{cfg: Config{Stream: "EVENTS"}}, cons: []jetstream.Consumer{cons},
	}
	require.EqualValues(t, 6, or.resetToAckFloor(ctx, 0), "reset: the last sequence delivered before it")
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.NumAckPending, "applied when answered: nothing pending")
	require.Zero(t, info.AckFloor.Stream)
	began := time.Now()
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, fetch(true), "everything above the floor again, in stream order")
	require.Less(t, time.Since(began), 10*time.Second, "at once, not after AckWait")
	require.Zero(t, or.resetToAckFloor(ctx, 0), "nothing pending: no reset")
	info, err = cons.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, info.AckFloor.Stream)
	require.EqualValues(t, 6, info.Delivered.Consumer, "not reset (a reset starts the delivery sequence again at 0)")
}
