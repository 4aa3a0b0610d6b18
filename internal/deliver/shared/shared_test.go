package shared_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

const streams = 100

// receiver is a real webhook endpoint: it verifies every request's
// signature (and an ordered one's order signature) and records, per
// subscription (its path), the event ids received and, for the ordered
// one, each stream's last version processed and any break in the
// version chain.
type receiver struct {
	t      testing.TB
	verify *webhook.Verifier
	srv    *httptest.Server

	mu       sync.Mutex
	ids      map[string]map[string]bool // path → event id → received
	last     map[string]int64           // ordered: stream → last version processed
	breaks   []string                   // ordered: chain or order breaks
	dupes    map[string]int             // path → requests of an event received before
	badSigns int
}

func newReceiver(t testing.TB, secret string) *receiver {
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	rc := &receiver{t: t, verify: v, ids: map[string]map[string]bool{}, last: map[string]int64{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("webhook-id")
	if err := rc.verify.Verify(r.Header, body); err != nil {
		rc.mu.Lock()
		rc.badSigns++
		rc.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if r.URL.Path == "/ordered" {
		if msg, ok := rc.order(r.Header); !ok {
			rc.breaks = append(rc.breaks, msg)
		}
	}
	if rc.ids[r.URL.Path] == nil {
		rc.ids[r.URL.Path] = map[string]bool{}
	}
	if rc.ids[r.URL.Path][id] {
		if rc.dupes == nil {
			rc.dupes = map[string]int{}
		}
		rc.dupes[r.URL.Path]++
	}
	rc.ids[r.URL.Path][id] = true
}

// duplicates returns how many requests path got for an event it had
// received already.
func (rc *receiver) duplicates(path string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.dupes[path]
}

// order checks an ordered webhook's chain (caller holds mu): a version
// already processed is a duplicate (answered 2xx, as a gate does); any
// other must name the last version processed as its predecessor and be
// the next one (no dead letters here: none may be skipped).
func (rc *receiver) order(h http.Header) (string, bool) {
	stream, err := wire.DecodeHeaderValue(h.Get(wire.HeaderSubject))
	if err != nil {
		return err.Error(), false
	}
	v, err := strconv.ParseInt(h.Get(wire.HeaderStreamVersion), 10, 64)
	if err != nil {
		return "no version: " + err.Error(), false
	}
	prev, err := wire.ParsePreviousVersion(h.Get(wire.HeaderPreviousVersion))
	if err != nil {
		return err.Error(), false
	}
	p, _ := strconv.Atoi(h.Get(wire.HeaderPartition))
	epoch, _ := strconv.ParseUint(h.Get(wire.HeaderLeaseEpoch), 10, 64)
	f := webhook.OrderFields{Stream: stream, Version: v, Previous: prev, Partition: p, Epoch: epoch}
	if err := rc.verify.VerifyOrder(h, f); err != nil {
		return fmt.Sprintf("%s v%d: order signature: %v", stream, v, err), false
	}
	last, seen := rc.last[stream]
	if !seen {
		last = -1
	}
	switch {
	case v <= last:
		return "", true // a duplicate
	case prev != last || v != last+1:
		return fmt.Sprintf("%s: version %d names %d, last processed %d", stream, v, prev, last), false
	}
	rc.last[stream] = v
	return "", true
}

// received returns how many distinct events path received.
func (rc *receiver) received(path string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.ids[path])
}

// missing returns the events of ids 1 to n path did not receive, by
// partition.
func (rc *receiver) missing(path string, n int) map[int][]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[int][]int{}
	for k := range n {
		if !rc.ids[path][event.FormatID(int64(k+1))] {
			p := wire.StreamPartition(fmt.Sprintf("order-%d", k%streams), 16)
			out[p] = append(out[p], k+1)
		}
	}
	return out
}

func (rc *receiver) problems() (breaks []string, badSigns int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.breaks...), rc.badSigns
}

// world is an embedded JetStream with the events stream, the receiver,
// and the subscriptions.
type world struct {
	srv  *embedded.Server
	js   jetstream.JetStream
	rc   *receiver
	subs []subscription.Subscription
	next int // events published
	// opts, when set, edits each replica's Config and Deps before New.
	opts func(*shared.Config, *shared.Deps)
}

func newWorld(t testing.TB) *world {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	w := &world{srv: srv, js: connect(t, srv)}
	_, err = w.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	secret, err := webhook.GenerateSecret()
	require.NoError(t, err)
	w.rc = newReceiver(t, secret)
	for _, s := range []struct {
		name     string
		ordering subscription.Ordering
	}{{"ordered", subscription.OrderingStream}, {"unordered", subscription.OrderingNone}} {
		w.subs = append(w.subs, subscription.Subscription{Name: s.name, FilterSubjects: []string{"events.>"},
			URL: w.rc.srv.URL + "/" + s.name, Secrets: []string{secret}, Body: subscription.BodyBinary,
			Ordering: s.ordering, AllowPrivate: true, Start: subscription.Start{Policy: subscription.StartAll}})
	}
	return w
}

func connect(t testing.TB, srv *embedded.Server) jetstream.JetStream {
	t.Helper()
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// publish stores n more events as the bridge does (forward.Message),
// round robin over the streams, each stream's versions from 0.
func (w *world) publish(t testing.TB, n int) {
	t.Helper()
	for range n {
		k := w.next
		e := event.Event{ID: int64(k + 1), Stream: fmt.Sprintf("order-%d", k%streams), Version: int64(k / streams),
			Name: "Placed", Data: []byte(fmt.Sprintf(`{"k":%d}`, k)), Created: time.Now()}
		_, err := w.js.PublishMsg(t.Context(), forward.Message(e, forward.Config{}))
		require.NoError(t, err)
		w.next++
	}
}

// replica starts a replica of the shared engine on its own connection;
// it is stopped at cleanup unless the test stops it first.
func (w *world) replica(t testing.TB, id string) *shared.Replica {
	t.Helper()
	r, _ := w.replicaConn(t, id)
	return r
}

// replicaConn is replica, with the replica's connection.
func (w *world) replicaConn(t testing.TB, id string) (*shared.Replica, *nats.Conn) {
	t.Helper()
	nc, err := w.srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()})).With("replica", id)
	}
	cfg, deps := shared.Config{Archetype: base.New(nil, log, id), LeaseTTL: 2 * time.Second}, shared.Deps{JetStream: js, Subscriptions: w.subs}
	if w.opts != nil {
		w.opts(&cfg, &deps)
	}
	r, err := shared.New(cfg, deps)
	require.NoError(t, err)
	require.NoError(t, r.Start(t.Context()))
	t.Cleanup(r.Stop)
	return r, nc
}

// delivered waits until both subscriptions received every event
// published, and checks the ordered one's chains.
func (w *world) delivered(t testing.TB, rs ...*shared.Replica) {
	t.Helper()
	if !assert.Eventually(t, func() bool {
		return w.rc.received("/ordered") == w.next && w.rc.received("/unordered") == w.next
	}, 90*time.Second, 20*time.Millisecond, "every event to each subscription") {
		for _, path := range []string{"/ordered", "/unordered"} {
			t.Logf("%s: missing by partition %v", path, w.rc.missing(path, w.next))
		}
		for i, r := range rs {
			t.Logf("replica %d: %+v", i, r.Status())
		}
		t.FailNow()
	}
	breaks, bad := w.rc.problems()
	require.Empty(t, breaks, "the ordered subscription's chains")
	require.Zero(t, bad, "requests whose signature did not verify")
}

func TestTwoReplicasDeliverEveryEventInOrderAndOneStopsGracefully(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas, and delivers 3,000 events twice")
	}
	w := newWorld(t)
	start := time.Now()
	a := w.replica(t, "replica-a")
	w.publish(t, 1000)
	b := w.replica(t, "replica-b")
	w.publish(t, 1000)
	w.delivered(t, a, b)
	t.Logf("2,000 events to both subscriptions, a replica joining: %v", time.Since(start))
	require.Eventually(t, func() bool { return len(a.Owned())+len(b.Owned()) == 16 && len(b.Owned()) > 0 },
		10*time.Second, 20*time.Millisecond, "the partitions shared: a %v, b %v", a.Owned(), b.Owned())

	start = time.Now()
	a.Stop()
	t.Logf("a stopped gracefully: %v", time.Since(start))
	w.publish(t, 1000)
	w.delivered(t, b)
	t.Logf("1,000 more, every partition on b: %v since the stop", time.Since(start))
	require.Len(t, b.Owned(), 16, "the replica left holds every partition")
}

// logLevel is the replicas' log level under -v: JSBRIDGE_TEST_DEBUG=1
// shows the claims and releases.
func logLevel() slog.Level {
	if os.Getenv("JSBRIDGE_TEST_DEBUG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

func TestReplicaWhoseLeasesAreLostClaimsAgainAndOrderHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas")
	}
	w := newWorld(t)
	a := w.replica(t, "replica-a")
	b := w.replica(t, "replica-b")
	w.publish(t, 500)
	sharedEvenly(t, a, b)

	// Replica a's leases go behind its back, as an expiry on the server
	// would: its next renewal finds each key changed and loses the
	// partition at once (owner.ErrLeaseLost), while its fan-outs run;
	// the share gives them to a again, a claim after the lost one.
	leases, err := w.js.KeyValue(t.Context(), wire.DefaultLeaseBucket)
	require.NoError(t, err)
	lost := a.Owned()
	for _, p := range lost {
		require.NoError(t, leases.Delete(t.Context(), owner.LeaseKey(p)))
	}
	w.publish(t, 1000)
	w.delivered(t, a, b)
	// Claimed again: each lost partition's lease key made anew (a Create
	// after the delete), and the share whole again.
	require.Eventually(t, func() bool {
		for _, p := range lost {
			if _, err := leases.Get(t.Context(), owner.LeaseKey(p)); err != nil {
				return false
			}
		}
		return len(a.Owned())+len(b.Owned()) == 16
	}, 10*time.Second, 20*time.Millisecond, "every partition owned again: lost %v; a %v, b %v", lost, a.Owned(), b.Owned())
}

// sharedEvenly waits until the two replicas a and b share the 16 partitions,
// each holding its quota (owner.Share: 8 each). Replica a, started
// first, may hold all 16 before b's first round: "a holds some and the
// sum is 16" is true then, before anything was shared.
func sharedEvenly(t *testing.T, a, b *shared.Replica) {
	t.Helper()
	require.Eventually(t, func() bool { return len(a.Owned()) == 8 && len(b.Owned()) == 8 },
		10*time.Second, 20*time.Millisecond, "the partitions shared, 8 each: a %v, b %v", a.Owned(), b.Owned())
}

func TestReplicaCutOffLosesItsPartitionsAndTheOtherTakesOverInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas, and waits for leases to expire (2 s)")
	}
	w := newWorld(t)
	a, anc := w.replicaConn(t, "replica-a")
	b := w.replica(t, "replica-b")
	w.publish(t, 500)
	sharedEvenly(t, a, b)

	// a is cut off from NATS while it runs and its fan-outs send: it
	// renews nothing, its fences stop its POSTs at the lease deadline,
	// and b claims its partitions once their keys expired on the server.
	anc.Close()
	start := time.Now()
	w.publish(t, 1000)
	w.delivered(t, b)
	t.Logf("1,500 events delivered %v after a was cut off", time.Since(start))
	require.Eventually(t, func() bool { return len(b.Owned()) == 16 }, 10*time.Second, 20*time.Millisecond,
		"b holds every partition: %v", b.Owned())
}
