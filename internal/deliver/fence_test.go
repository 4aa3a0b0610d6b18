package deliver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// headerReceiver records the ordered-delivery headers of every request by
// event id and answers 204.
type headerReceiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []http.Header
}

func newHeaderReceiver(t *testing.T) *headerReceiver {
	rc := &headerReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		rc.got = append(rc.got, r.Header.Clone())
		rc.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *headerReceiver) headers() []http.Header {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]http.Header(nil), rc.got...)
}

// Every ordered webhook carries its stream's partition and the lease
// epoch: the revision of the KV Create that claimed the lease, unchanged
// by renewals. Unordered webhooks carry neither.
func TestOrderedWebhooksCarryPartitionAndLeaseEpoch(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	// The lease bucket, made as the consumer makes it, watched from its
	// first key on: the first revision of each lease key is its create
	// revision.
	// A 3 s lease: the test reads each lease's first revision as its
	// epoch, and a 1 s lease lost to a starved renewal under make test's
	// load (-race, load 20) was created anew with another epoch.
	kv, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultLeaseBucket, TTL: 3 * time.Second, Storage: jetstream.FileStorage, History: 1})
	require.NoError(t, err)
	w, err := kv.Watch(b.ctx, wire.LeaseFilter)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop() })
	var mu sync.Mutex
	created, last := map[string]uint64{}, map[string]uint64{}
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			mu.Lock()
			if _, ok := created[e.Key()]; !ok {
				created[e.Key()] = e.Revision()
			}
			last[e.Key()] = e.Revision()
			mu.Unlock()
		}
	}()

	ordered, unordered := newHeaderReceiver(t), newHeaderReceiver(t)
	none := sub("plain", unordered.URL)
	none.Ordering = subscription.OrderingNone
	b.runOrdered(t, deliver.Config{Partitions: 4, LeaseTTL: 3 * time.Second}, orderedSub("hdr", ordered.URL), none)
	streams := []string{"order-a", "order-b", "order-c", "order-d", "order-e", "order-f"}
	for _, s := range streams {
		b.publishStream(t, s, 0, 2)
	}
	require.Eventually(t, func() bool { return len(ordered.headers()) >= 12 && len(unordered.headers()) >= 12 }, 20*time.Second, 10*time.Millisecond)
	// Wait until every lease was renewed at least once, then publish more:
	// the epoch stays the create revision.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		renewed := 0
		for k, c := range created {
			if last[k] > c {
				renewed++
			}
		}
		return renewed == 4
	}, 20*time.Second, 10*time.Millisecond)
	for _, s := range streams {
		b.publishStream(t, s, 2, 3)
	}
	require.Eventually(t, func() bool { return len(ordered.headers()) >= 18 }, 20*time.Second, 10*time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	for _, h := range ordered.headers() {
		e := b.event(h.Get(wire.HeaderIdempotencyKey))
		p := wire.StreamPartition(e.stream, 4)
		require.Equal(t, strconv.Itoa(p), h.Get(wire.HeaderPartition), "partition of %s v%d", e.stream, e.version)
		want := created[wire.LeaseKey("hdr", p)]
		require.NotZero(t, want)
		require.Equal(t, strconv.FormatUint(want, 10), h.Get(wire.HeaderLeaseEpoch), "epoch of %s v%d: the lease's create revision", e.stream, e.version)
	}
	for _, h := range unordered.headers() {
		require.Empty(t, h.Get(wire.HeaderPartition), "unordered webhook")
		require.Empty(t, h.Get(wire.HeaderLeaseEpoch), "unordered webhook")
	}
}

// gateReceiver answers an order gate's 409s (Jsbridge-Order) for the
// attempts refuse picks, 204 otherwise, and records each request.
type gateReceiver struct {
	*httptest.Server
	b      *orderedBundle
	mu     sync.Mutex
	tries  map[string]int
	got    []gateAnswer
	refuse func(e orderedEvent, attempt int) string // "": 204
}

type gateAnswer struct {
	e     orderedEvent
	order string
	epoch string
}

func newGateReceiver(t *testing.T, b *orderedBundle, refuse func(e orderedEvent, attempt int) string) *gateReceiver {
	rc := &gateReceiver{b: b, tries: map[string]int{}, refuse: refuse}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		e := b.event(id)
		rc.mu.Lock()
		rc.tries[id]++
		order := rc.refuse(e, rc.tries[id])
		rc.got = append(rc.got, gateAnswer{e: e, order: order, epoch: r.Header.Get(wire.HeaderLeaseEpoch)})
		rc.mu.Unlock()
		if order == "" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set(wire.HeaderOrder, order)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusConflict)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *gateReceiver) answers() []gateAnswer {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]gateAnswer(nil), rc.got...)
}

// An order gate's gap and in-progress answers are retried in place past
// MaxDeliver and never dead-lettered; its stale-epoch answer stops the
// partition, which is claimed again under a new epoch and delivers the
// event then. Every stream ends accepted in order.
func TestOrderedGateAnswersAreRetriedNeverDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newGateReceiver(t, b, func(e orderedEvent, attempt int) string {
		switch {
		case e.stream == "order-gap" && e.version == 1 && attempt <= 4:
			return wire.OrderGap
		case e.stream == "order-busy" && e.version == 0 && attempt <= 4:
			return wire.OrderInProgress
		case e.stream == "order-stale" && e.version == 1 && attempt == 1:
			return wire.OrderStaleEpoch
		}
		return ""
	})
	dl := &deadLetters{}
	s := orderedSub("gated", rc.URL)
	s.MaxDeliver = 2
	s.BackOff = []time.Duration{50 * time.Millisecond}
	streams := []string{"order-gap", "order-busy", "order-stale"}
	for _, st := range streams {
		b.publishStream(t, st, 0, 3)
	}
	b.runOrdered(t, deliver.Config{DeadLetters: dl}, s)
	accepted := func() map[string][]int64 {
		out := map[string][]int64{}
		for _, a := range rc.answers() {
			if a.order == "" {
				out[a.e.stream] = append(out[a.e.stream], a.e.version)
			}
		}
		return out
	}
	require.Eventually(t, func() bool {
		acc := accepted()
		return len(acc["order-gap"]) >= 3 && len(acc["order-busy"]) >= 3 && len(acc["order-stale"]) >= 3
	}, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, dl.list(), "no gate answer is dead-lettered")
	for _, st := range streams {
		require.Equal(t, []int64{0, 1, 2}, dedup(accepted()[st]), "stream %s accepted in order", st)
	}
	// The stale-epoch answer released the partition: the event went out
	// again under a later epoch.
	var staleEpoch, nextEpoch uint64
	for _, a := range rc.answers() {
		if a.e.stream != "order-stale" || a.e.version != 1 {
			continue
		}
		ep, err := strconv.ParseUint(a.epoch, 10, 64)
		require.NoError(t, err)
		if a.order == wire.OrderStaleEpoch {
			staleEpoch = ep
		} else if nextEpoch == 0 {
			nextEpoch = ep
		}
	}
	require.NotZero(t, staleEpoch)
	require.Greater(t, nextEpoch, staleEpoch, "delivered after the stale answer under a new lease")
}

// dedup drops repeats of the previous value (an at-least-once duplicate).
func dedup(vs []int64) []int64 {
	var out []int64
	for _, v := range vs {
		if len(out) == 0 || out[len(out)-1] != v {
			out = append(out, v)
		}
	}
	return out
}

// Every partition consumer pulls pinned in one priority group, also one
// that existed without it (updated at start), and the lease owner holds
// the pin while it delivers.
func TestOrderedPartitionConsumersArePinnedToTheLeaseOwner(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newHeaderReceiver(t)
	s := orderedSub("pinned", rc.URL)
	cfg := deliver.Config{Partitions: 2, LeaseTTL: time.Second}
	c, err := deliver.New(b.js, cfg, s)
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))
	// As an older version made it: no priority group.
	stream := wire.OrderedStream("EVENTS")
	old, err := b.js.Consumer(b.ctx, stream, wire.PartitionDurable("pinned", 0))
	require.NoError(t, err)
	oc := old.CachedInfo().Config
	oc.PriorityGroups, oc.PriorityPolicy, oc.PinnedTTL = nil, jetstream.PriorityPolicyNone, 0
	_, err = b.js.UpdateConsumer(b.ctx, stream, oc)
	require.NoError(t, err)

	b.runOrdered(t, cfg, s)
	streams := []string{"order-a", "order-b", "order-c", "order-d"}
	for _, st := range streams {
		b.publishStream(t, st, 0, 2)
	}
	require.Eventually(t, func() bool { return len(rc.headers()) >= 8 }, 20*time.Second, 10*time.Millisecond)
	for p := range 2 {
		cons, err := b.js.Consumer(b.ctx, stream, wire.PartitionDurable("pinned", p))
		require.NoError(t, err)
		info := cons.CachedInfo()
		require.Equal(t, []string{"owner"}, info.Config.PriorityGroups, "partition %d", p)
		require.Equal(t, jetstream.PriorityPolicyPinned, info.Config.PriorityPolicy, "partition %d", p)
		require.GreaterOrEqual(t, info.Config.PinnedTTL, time.Second, "partition %d", p)
		require.Len(t, info.PriorityGroups, 1)
		require.NotEmpty(t, info.PriorityGroups[0].PinnedClientID, "partition %d: the owner is pinned", p)
	}
}

// A replica cut off from NATS (its connection closed) while it holds
// every partition with events in flight: it acks nothing more, and the
// other replica takes the partitions over after the lease TTL, unpins the
// cut-off one, and delivers once the cut-off replica's unacked events come
// back (AckWait). Every stream is accepted in order, none sent again after
// a later version of it.
func TestOrderedTakeoverFromACutOffReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a lease TTL")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	ncA, jsA := jsbridgetest.Connect(t, srv)
	_, jsB := jsbridgetest.Connect(t, srv)
	_, err := jsB.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	b := &orderedBundle{bundle: bundle{js: jsB, ctx: ctx}, events: map[string]orderedEvent{}, nextID: 1}

	var slow atomic.Bool
	slow.Store(true)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int {
		if slow.Load() {
			time.Sleep(100 * time.Millisecond)
		}
		return http.StatusNoContent
	})
	s := orderedSub("cutoff", rc.URL)
	s.AckWait = 5 * time.Second
	s.Timeout = 2 * time.Second
	cfg := deliver.Config{Partitions: 4, LeaseTTL: 2 * time.Second}
	run := func(js jetstream.JetStream, id string) {
		c := cfg
		c.ReplicaID = id
		bb := &orderedBundle{bundle: bundle{js: js, ctx: ctx}}
		bb.runOrdered(t, c, s)
	}
	run(jsA, "a")
	var streams []string
	for i := range 20 {
		streams = append(streams, fmt.Sprintf("order-%d", i))
	}
	for _, st := range streams {
		b.publishStream(t, st, 0, 5)
	}
	require.Eventually(t, func() bool { return len(rc.deliveries()) >= 10 }, 20*time.Second, 5*time.Millisecond)
	run(jsB, "b") // owns nothing yet: a holds every lease
	ncA.Close()   // a is cut off, its POSTs still reach the receiver
	cut := time.Now()
	slow.Store(false)
	require.Eventually(t, func() bool {
		acc := rc.accepted()
		for _, st := range streams {
			if len(dedup(acc[st])) < 5 {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond)
	took := time.Since(cut)
	t.Logf("every stream delivered %s after the cut (lease TTL %s, AckWait %s)", took.Round(10*time.Millisecond), cfg.LeaseTTL, s.AckWait)
	acc := rc.accepted()
	for _, st := range streams {
		// A version may come twice in a row (the cut-off replica's POST
		// whose ack it could not send), never after a later one.
		require.Equal(t, []int64{0, 1, 2, 3, 4}, dedup(acc[st]), "stream %s: accepted in version order", st)
	}
	require.Less(t, took, cfg.LeaseTTL+s.AckWait+5*time.Second, "taken over within the lease TTL and AckWait")
}
