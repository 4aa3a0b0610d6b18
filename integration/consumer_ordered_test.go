package integration

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
	"github.com/jsbridge/jsbridge/wire"
)

// orderWatch is a receiver-side check of ordered delivery. Events come from
// jsBundle.publish(first=1, n, streams): event id i+1 is version i/streams
// of stream i+1 mod streams. On every request it checks that version w of
// a stream arrives only when w-1 was accepted (2xx) before, and never after
// a later version was sent (a re-delivery of the latest one sent is fine);
// it records accepted versions per stream in order, and the replica and
// time span of every request.
//
// One re-delivery after a later version is not a problem: a request from
// a former owner whose lease epoch (Jsbridge-Lease-Epoch) is lower than
// the epoch the later version came under. That is a process stalled
// between its last lease check and the request's write for longer than
// the lease's last quarter (docs/ordering.md, "Two clocks": the process
// cannot see it), or a request written before its sender died and read
// by this receiver after the new owner's (a receiver starved of CPU
// reads its connections in any order). The order gate refuses such a
// request as stale-epoch; this watch counts it apart (stale) and the test
// logs it.
type orderWatch struct {
	streams int
	mu      sync.Mutex
	// per stream
	accepted  map[int][]int // versions answered 2xx, in order
	highest   map[int]int   // highest version accepted, -1 none
	sent      map[int]int   // highest version that arrived, -1 none
	sentEpoch map[int]uint64
	spans     map[int][]span
	problems  []string
	stale     []string
}

type span struct {
	replica    string
	start, end time.Time
}

func newOrderWatch(streams int) *orderWatch {
	return &orderWatch{streams: streams, accepted: map[int][]int{}, highest: map[int]int{}, sent: map[int]int{}, sentEpoch: map[int]uint64{}, spans: map[int][]span{}}
}

func (o *orderWatch) event(id string) (stream, version int) {
	n, _ := strconv.Atoi(id)
	return n % o.streams, (n - 1) / o.streams
}

// arrive checks request r (its Idempotency-Key and lease epoch); it
// returns the stream and version.
func (o *orderWatch) arrive(r *http.Request) (int, int) {
	s, v := o.event(r.Header.Get(wire.HeaderIdempotencyKey))
	epoch, epochErr := strconv.ParseUint(r.Header.Get(wire.HeaderLeaseEpoch), 10, 64)
	o.mu.Lock()
	defer o.mu.Unlock()
	hi, ok := o.highest[s]
	if !ok {
		hi = -1
	}
	sent, ok := o.sent[s]
	if !ok {
		sent = -1
	}
	if v > hi+1 {
		o.problems = append(o.problems, fmt.Sprintf("stream %d: version %d sent while version %d was not accepted", s, v, hi+1))
	}
	switch later, ok := o.sentEpoch[s]; {
	case v < sent && epochErr == nil && ok && epoch < later:
		o.stale = append(o.stale, fmt.Sprintf("stream %d: version %d (epoch %d, %s) after version %d (epoch %d)",
			s, v, epoch, r.Header.Get(wire.HeaderReplica), sent, later))
	case v < sent:
		o.problems = append(o.problems, fmt.Sprintf("stream %d: version %d sent again (epoch %s, %s) after version %d was sent (epoch %d)",
			s, v, r.Header.Get(wire.HeaderLeaseEpoch), r.Header.Get(wire.HeaderReplica), sent, later))
	}
	if v >= sent {
		o.sent[s] = v
		if epochErr == nil {
			o.sentEpoch[s] = epoch
		} else {
			delete(o.sentEpoch, s)
		}
	}
	return s, v
}

// answered records the response to a request for (s, v).
func (o *orderWatch) answered(s, v, status int, replica string, start time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if status/100 == 2 {
		hi, ok := o.highest[s]
		if !ok {
			hi = -1
		}
		if v > hi {
			o.highest[s] = v
			o.accepted[s] = append(o.accepted[s], v)
		}
	}
	o.spans[s] = append(o.spans[s], span{replica, start, time.Now()})
}

// slowReceiver is an httptest receiver that records every request in o
// and answers 204 after 0–20 ms: requests that last, so that two replicas
// delivering one stream at once would overlap.
func (o *orderWatch) slowReceiver(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s, ver := o.arrive(r)
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		w.WriteHeader(http.StatusNoContent)
		o.answered(s, ver, http.StatusNoContent, r.Header.Get(wire.HeaderReplica), start)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// requestsSince counts, per replica, the requests that started after at.
func (o *orderWatch) requestsSince(at time.Time) map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := map[string]int{}
	for _, spans := range o.spans {
		for _, s := range spans {
			if s.start.After(at) {
				n[s.replica]++
			}
		}
	}
	return n
}

func (o *orderWatch) acceptedCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, a := range o.accepted {
		n += len(a)
	}
	return n
}

// check fails on every problem seen, on a stream whose accepted versions are
// not 0..perStream-1, and, when noOverlap, on two replicas' requests of one
// stream overlapping in time.
func (o *orderWatch) check(t *testing.T, perStream int, noOverlap bool) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	errorEach(t, o.problems, 20)
	if len(o.stale) > 0 {
		t.Logf("%d requests of a former owner arrived after a later version sent under a newer epoch (an order gate answers them stale-epoch): %v",
			len(o.stale), o.stale[:min(len(o.stale), 10)])
	}
	short := 0
	for s := range o.streams {
		a := o.accepted[s]
		if len(a) != perStream {
			if short++; short <= 10 {
				t.Errorf("stream %d: %d versions accepted, want %d", s, len(a), perStream)
			}
			continue
		}
		for i, v := range a {
			if v != i {
				t.Errorf("stream %d: accepted versions %v, want 0..%d in order", s, a, perStream-1)
				break
			}
		}
	}
	if !noOverlap {
		return
	}
	overlaps := 0
	for s, spans := range o.spans {
		for i := range spans {
			for j := i + 1; j < len(spans); j++ {
				a, b := spans[i], spans[j]
				if a.replica != b.replica && a.start.Before(b.end) && b.start.Before(a.end) {
					overlaps++
					if overlaps <= 10 {
						t.Errorf("stream %d delivered by %s and %s at once (%s–%s, %s–%s)", s, a.replica, b.replica,
							a.start.Format("15:04:05.000"), a.end.Format("15:04:05.000"), b.start.Format("15:04:05.000"), b.end.Format("15:04:05.000"))
					}
				}
			}
		}
	}
}

// errorEach fails t with each of problems, the first most of them named.
func errorEach(t *testing.T, problems []string, most int) {
	t.Helper()
	for i, p := range problems {
		if i == most {
			t.Errorf("... and %d more", len(problems)-most)
			return
		}
		t.Error(p)
	}
}

// orderedArgs are a consumer process's flags for ordered delivery with
// short leases and AckWait, so hand-overs take seconds. Not shorter: with
// a 1 s lease TTL (a 500 ms budget per KV request) a replica under the
// whole suite's load (-race, load average above 10 on 2 cores) lost and
// claimed its leases over and over and the chaos test stalled.
func orderedArgs(url, receiver string, extra ...string) []string {
	return append([]string{"run", "--nats-url", url, "--start", "all", "--name", "ordered", "--url", receiver, "--allow-private",
		"--ordering", "stream", "--partitions", "8", "--lease-ttl", "2s", "--ack-wait", "4s", "--timeout", "1500ms",
		"--backoff", "50ms", "--max-deliver=-1", "--max-in-flight", "256", "--max-ack-pending", "2000",
		"--breaker-failures", "1000000", "--breaker-min-requests", "1000000", "--ops-addr", "", "--log-level", "warn"}, extra...)
}

// Three replicas deliver 500 streams × 40 events while one of them is
// SIGKILLed and restarted every few seconds and the endpoint fails 10 % of
// requests with 500. Every stream's versions are accepted in order, each
// once, and with the Postgres idempotency store none is processed twice.
func TestOrderedReplicasKilledAndRestartedKeepEveryStreamInOrder(t *testing.T) {
	t.Parallel()
	const (
		streams   = 500
		perStream = 40
		events    = streams * perStream
	)
	b := setupJetStream(t)
	pool := jsbridgetest.Pool(t)
	store, err := pgstore.New(pool, pgstore.WithTable(jsbridgetest.Schema(t, pool)+".webhook_idempotency"))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)

	watch := newOrderWatch(streams)
	var (
		mu        sync.Mutex
		processed = map[string]int{}
	)
	h := webhook.Handler(v, store, time.Hour, func(ctx context.Context, r *http.Request, _ []byte) error {
		mu.Lock()
		processed[r.Header.Get(wire.HeaderIdempotencyKey)]++
		mu.Unlock()
		return nil
	}, webhook.WithLease(3*time.Second), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	rsrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s, ver := watch.arrive(r)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		if rand.IntN(10) == 0 {
			rec.WriteHeader(http.StatusInternalServerError)
		} else {
			h.ServeHTTP(rec, r)
		}
		watch.answered(s, ver, rec.status, r.Header.Get(wire.HeaderReplica), start)
	}))
	t.Cleanup(rsrv.Close)

	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := orderedArgs(b.srv.ClientURL(), rsrv.URL, "--log-level", "info")
	start := func() *proc {
		p := startProc(t, env, "consumer", args...)
		// Up (its signal handler installed, NATS connected) before it
		// can be killed or stopped.
		require.True(t, waitFor(20*time.Second, func() bool { return strings.Contains(p.out.String(), "consumer started") }), "replica started:\n%s", p.out.String())
		return p
	}
	replicas := []*proc{start(), start(), start()}
	publishMany(t, b, events, streams)

	// A replica is killed and restarted every 3 s, or every sixth of the
	// events accepted if that comes first (the shared engine delivered
	// all 20,000 in under 7 s, one kill), once the receiver accepted 200
	// more events since the last restart: kills faster than a hand-over
	// (lease TTL, then AckWait for the dead replica's deliveries) would
	// only measure how slow the machine is. The run fails when no event
	// is accepted for 60 s.
	kills := 0
	stalled := false
	for watch.acceptedCount() < events {
		since := watch.acceptedCount()
		waitFor(3*time.Second, func() bool { return watch.acceptedCount() >= min(since+events/6, events) })
		if watch.acceptedCount() >= events {
			break
		}
		if !waitProgress(func() bool { return watch.acceptedCount() >= min(since+200, events) }, watch.acceptedCount, 60*time.Second, 5*time.Minute) {
			stalled = true
			break
		}
		if watch.acceptedCount() >= events {
			break
		}
		i := kills % len(replicas)
		replicas[i].kill(t)
		replicas[i] = start()
		kills++
	}
	if !stalled {
		stalled = !waitProgress(func() bool { return watch.acceptedCount() >= events }, watch.acceptedCount, 60*time.Second, 5*time.Minute)
	}
	t.Logf("%d kills and restarts; %d of %d events accepted", kills, watch.acceptedCount(), events)
	if stalled {
		for i, p := range replicas {
			t.Logf("replica %d output:\n%s", i, p.out.String())
		}
		t.Fatalf("%d of %d events accepted, then none for 60 s (or 5 min passed)", watch.acceptedCount(), events)
	}
	require.GreaterOrEqual(t, kills, 2, "the run was too short to kill a replica twice")
	watch.check(t, perStream, false)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, events, len(processed), "every event processed")
	for id, n := range processed {
		require.Equal(t, 1, n, "event %s processed %d times", id, n)
	}
}

// publishMany publishes events 1..n as jsBundle.publish does (event id i
// in stream order-<i mod streams>), 2,000 at a time (the async publish
// window).
func publishMany(t *testing.T, b *jsBundle, n, streams int) {
	t.Helper()
	for first := 1; first <= n; first += 2000 {
		b.publish(t, int64(first), min(2000, n-first+1), streams)
	}
}

// statusRecorder remembers the status written.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Two replicas deliver; a third is added mid-run and one of the first two
// stopped (SIGTERM): partitions move twice, and no stream is ever delivered
// by two replicas at once (the receiver compares the Jsbridge-Replica
// header and the time span of every request), every stream in order.
func TestOrderedReplicaAddedAndRemovedNeverDeliversAStreamFromTwo(t *testing.T) {
	t.Parallel()
	const (
		streams   = 200
		perStream = 30
		events    = streams * perStream
	)
	b := setupJetStream(t)
	watch := newOrderWatch(streams)
	rsrv := watch.slowReceiver(t)
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := orderedArgs(b.srv.ClientURL(), rsrv.URL, "--max-in-flight", "16")
	first := startProc(t, env, "consumer", append(args, "--replica-id", "r1")...)
	startProc(t, env, "consumer", append(args, "--replica-id", "r2")...)
	publishMany(t, b, events, streams)

	require.True(t, waitFor(time.Minute, func() bool { return watch.acceptedCount() >= events/4 }), "a quarter delivered")
	startProc(t, env, "consumer", append(args, "--replica-id", "r3")...)
	require.True(t, waitFor(time.Minute, func() bool { return watch.acceptedCount() >= events/2 }), "half delivered")
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-first.exited:
		require.NoError(t, first.err, "r1 after SIGTERM:\n%s", first.out.String())
	case <-time.After(20 * time.Second):
		t.Fatal("r1 did not exit after SIGTERM")
	}
	require.True(t, waitFor(2*time.Minute, func() bool { return watch.acceptedCount() >= events }), "all delivered: %d of %d", watch.acceptedCount(), events)
	watch.check(t, perStream, true)
	seen := map[string]bool{}
	for replica := range watch.requestsSince(time.Time{}) {
		seen[replica] = true
	}
	require.Equal(t, map[string]bool{"r1": true, "r2": true, "r3": true}, seen, "every replica delivered")
}

// With ordering none, two replicas still deliver every event, and they
// share the work: they own the partitions between them (their records'
// owners, as `consumer status` shows them).
func TestUnorderedReplicasDeliverEverything(t *testing.T) {
	t.Parallel()
	const events, streams = 2000, 50
	b := setupJetStream(t)
	h := newHits(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", b.srv.ClientURL(), "--start", "all", "--name", "unordered", "--url", h.URL, "--allow-private",
		"--ordering", "none", "--ops-addr", "", "--log-level", "warn"}
	startProc(t, env, "consumer", append(args, "--replica-id", "u1")...)
	startProc(t, env, "consumer", append(args, "--replica-id", "u2")...)
	b.publish(t, 1, events, streams)
	require.True(t, waitFor(time.Minute, func() bool { return h.distinct() == events }), "%d of %d delivered", h.distinct(), events)
	owners := map[string]int{}
	require.True(t, waitFor(time.Minute, func() bool {
		parts, err := consumer.ReadSharedPositions(b.ctx, b.js)
		if err != nil {
			return false
		}
		clear(owners)
		for _, p := range parts {
			owners[p.Record.Owner]++
		}
		return owners["u1"] > 0 && owners["u2"] > 0
	}), "both replicas own partitions: %v", owners)
}

// The operator's view of a parked stream, with the binaries: a 422 on
// version 3 of a stream parks it; `consumer dlq list` shows it,
// `consumer status` shows who
// owns the partitions, `consumer dlq skip` drops the head and versions
// 4–9 follow in order; a second stream parked the same way is replayed
// with `consumer dlq replay` once the endpoint is fixed: 3–9 in order.
func TestOrderedParkedStreamListSkipAndReplayCLI(t *testing.T) {
	t.Parallel()
	const streams, perStream = 2, 10
	b := setupJetStream(t)
	watch := newOrderWatch(streams)
	var fixed atomic.Bool
	rsrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s, v := watch.arrive(r)
		code := http.StatusNoContent
		if v == 3 && !fixed.Load() {
			code = http.StatusUnprocessableEntity
		}
		w.WriteHeader(code)
		watch.answered(s, v, code, r.Header.Get(wire.HeaderReplica), start)
	}))
	t.Cleanup(rsrv.Close)
	natsURL := b.srv.ClientURL()
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	sub := []string{"--nats-url", natsURL, "--name", "ordered", "--url", rsrv.URL, "--allow-private"}
	startProc(t, env, "consumer", orderedArgs(natsURL, rsrv.URL, "--replica-id", "only")...)
	b.publish(t, 1, streams*perStream, streams)

	// A parked stream's row: PARKED STREAM, SUBSCRIPTION, HEAD SEQ, HEAD
	// EVENT ID, PARKED SINCE.
	parkedRow := regexp.MustCompile(`(?m)^order-\d+\s+ordered\s+\d+\s+\d+\s+\d{4}-`)
	var letters []deadletter.Stored
	require.True(t, waitFor(30*time.Second, func() bool {
		out, err := cli(t, nil, "consumer", "dlq", "list", "--nats-url", natsURL)
		if err != nil || strings.Count(out, "order-") < 2 {
			return false
		}
		letters = dlqList(t, natsURL)
		rows := parkedRow.FindAllStringSubmatch(out, -1)
		return len(letters) == 2 && len(rows) == 2
	}), "both streams parked")
	out, err := cli(t, nil, "consumer", "dlq", "list", "--nats-url", natsURL)
	require.NoError(t, err, out)
	t.Logf("dlq list:\n%s", out)
	out, err = cli(t, nil, "consumer", "status", "--nats-url", natsURL)
	require.NoError(t, err, out)
	// The partitions are the replica's, not the subscription's: the
	// partitions table (PARTITION, OWNER, EPOCH).
	require.Len(t, regexp.MustCompile(`(?m)^\d+\s+only\s+\d+\s`).FindAllString(out, -1), 8, "its 8 partitions:\n%s", out)
	t.Logf("status:\n%s", out)

	// Skip the first stream's head, replay the second's.
	skip, replay := letters[0], letters[1]
	out, err = cli(t, nil, "consumer", "dlq", "skip", "--nats-url", natsURL, "--seq", fmt.Sprint(skip.Seq))
	require.NoError(t, err, out)
	fixed.Store(true)
	out, err = cli(t, env, "consumer", append([]string{"dlq", "replay", "--seq", fmt.Sprint(replay.Seq)}, sub...)...)
	require.NoError(t, err, out)
	require.True(t, waitFor(30*time.Second, func() bool { return watch.acceptedCount() == 2*perStream-1 }), "%d accepted", watch.acceptedCount())
	watch.mu.Lock()
	defer watch.mu.Unlock()
	skipped, _ := watch.event(skip.EventID)
	replayed, _ := watch.event(replay.EventID)
	// Version 4 of the skipped stream follows an unaccepted 3: that is
	// what skip means; nothing else may be out of order.
	require.Equal(t, []string{fmt.Sprintf("stream %d: version 4 sent while version 3 was not accepted", skipped)}, watch.problems)
	require.Equal(t, []int{0, 1, 2, 4, 5, 6, 7, 8, 9}, watch.accepted[skipped], "skip: 4–9 after 0–2")
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, watch.accepted[replayed], "replay: 3, then 4–9")
	require.Empty(t, dlqList(t, natsURL))
}

// A replica frozen (SIGSTOP) past its lease TTL and AckWait while it
// delivers: the other takes its partitions over, and when the frozen one
// wakes (SIGCONT) it starts no attempt on what it lost (its lease deadline
// passed, then its renewal finds the key taken), rejoins and takes a share
// of the events published after. No stream is delivered by two replicas at
// once, every stream in order.
func TestOrderedReplicaFrozenPastItsLeaseStartsNothingWhenItWakes(t *testing.T) {
	t.Parallel()
	const (
		streams   = 200
		perStream = 30 // before the freeze; as many again after the wake
		events    = streams * perStream
	)
	b := setupJetStream(t)
	watch := newOrderWatch(streams)
	rsrv := watch.slowReceiver(t)
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := orderedArgs(b.srv.ClientURL(), rsrv.URL, "--max-in-flight", "16", "--log-level", "info")
	frozen := startProc(t, env, "consumer", append(args, "--replica-id", "r1")...)
	startProc(t, env, "consumer", append(args, "--replica-id", "r2")...)
	publishMany(t, b, events, streams)

	require.True(t, waitProgress(func() bool { return watch.acceptedCount() >= events/4 }, watch.acceptedCount, 60*time.Second, 5*time.Minute), "a quarter delivered")
	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGSTOP))
	frozeAt := time.Now()
	t.Cleanup(func() { _ = frozen.cmd.Process.Signal(syscall.SIGCONT) })
	// Frozen for 6 s, past its lease TTL and AckWait (2 s and 4 s,
	// orderedArgs), while r2 takes its partitions over and delivers.
	// It wakes only once r2 holds every partition (consumer status, the
	// partitions table: PARTITION, OWNER, EPOCH), so that what r1 finds
	// on waking is a lease taken, whatever the load slowed.
	atFreeze := watch.acceptedCount()
	ownedByR2 := regexp.MustCompile(`(?m)^\d+\s+r2\s+\d+\s`)
	require.True(t, waitProgress(func() bool {
		if time.Since(frozeAt) <= 6*time.Second || watch.acceptedCount() < min(atFreeze+events/8, events) {
			return false
		}
		out, err := cli(t, nil, "consumer", "status", "--nats-url", b.srv.ClientURL())
		return err == nil && len(ownedByR2.FindAllString(out, -1)) == 8
	}, watch.acceptedCount, 60*time.Second, 5*time.Minute), "r2 delivers and holds every partition while r1 is frozen")
	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGCONT))
	wokeAt := time.Now()
	// The owner checks the deadline (two clocks) before a renewal finds
	// the key taken, and says which it found.
	require.True(t, waitFor(30*time.Second, func() bool {
		out := frozen.out.String()
		return strings.Contains(out, "partition lease lost") || strings.Contains(out, "partition lease deadline passed")
	}), "r1 finds its leases taken when it wakes:\n%s", frozen.out.String())
	for first := events + 1; first <= 2*events; first += 2000 {
		b.publish(t, int64(first), min(2000, 2*events-first+1), streams)
	}

	require.True(t, waitProgress(func() bool { return watch.acceptedCount() >= 2*events }, watch.acceptedCount, 60*time.Second, 5*time.Minute),
		"all delivered: %d of %d; r1:\n%s", watch.acceptedCount(), 2*events, frozen.out.String())
	watch.check(t, 2*perStream, true)
	afterWake := watch.requestsSince(wokeAt)["r1"]
	t.Logf("r1 frozen %s; %d of its requests after it woke", wokeAt.Sub(frozeAt).Round(time.Millisecond), afterWake)
	require.Positive(t, afterWake, "r1 rejoined and delivered again after it woke:\n%s", frozen.out.String())
}
