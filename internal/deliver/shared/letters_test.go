package shared_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// gate is a real webhook endpoint for the dead-letter and health tests:
// it verifies every signature, answers what answer says (0: 204), and,
// for the ordered subscriptions' paths, checks each stream's version
// chain as a receiver's order gate does: a version at or below the last
// one processed is a duplicate; any other must name the last one
// processed as its predecessor (dead-lettered versions are skipped, so
// versions may jump).
type gate struct {
	verify  *webhook.Verifier
	srv     *httptest.Server
	ordered map[string]bool // paths of ordered subscriptions

	mu       sync.Mutex
	answer   func(path, id string) int
	accepted map[string]map[string]int     // path → event id → 2xx answers (duplicates included)
	at       map[string]time.Time          // path + " " + event id → first accepted
	posts    map[string]int                // path + " " + event id → requests, answered anyhow
	epochs   map[string][]string           // path + " " + event id → the lease epoch of each 2xx
	last     map[string]map[string]int64   // ordered path → stream → last version processed
	named    map[string]map[string][]int64 // ordered path → stream → [version, previous] of each version processed
	breaks   []string
	refused  map[int]time.Time // status → first answered
	badSigns int
}

func newGate(t *testing.T, secret string, ordered ...string) *gate {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	g := &gate{verify: v, ordered: map[string]bool{}, accepted: map[string]map[string]int{},
		at: map[string]time.Time{}, posts: map[string]int{}, epochs: map[string][]string{}, last: map[string]map[string]int64{}, named: map[string]map[string][]int64{}, refused: map[int]time.Time{}}
	for _, p := range ordered {
		g.ordered["/"+p] = true
	}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gate) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.verify.Verify(r.Header, body); err != nil {
		g.badSigns++
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	id := r.Header.Get("webhook-id")
	g.posts[r.URL.Path+" "+id]++
	if g.answer != nil {
		if status := g.answer(r.URL.Path, id); status != 0 {
			if _, ok := g.refused[status]; !ok {
				g.refused[status] = time.Now()
			}
			if status == http.StatusConflict {
				w.Header().Set(wire.HeaderOrder, wire.OrderGap) // an order gate waiting for an earlier version
			}
			w.WriteHeader(status)
			return
		}
	}
	if g.ordered[r.URL.Path] {
		if msg := g.order(r.URL.Path, r.Header); msg != "" {
			g.breaks = append(g.breaks, r.URL.Path+": "+msg)
		}
	}
	if g.accepted[r.URL.Path] == nil {
		g.accepted[r.URL.Path] = map[string]int{}
	}
	g.epochs[r.URL.Path+" "+id] = append(g.epochs[r.URL.Path+" "+id], r.Header.Get(wire.HeaderLeaseEpoch))
	if g.accepted[r.URL.Path][id]++; g.accepted[r.URL.Path][id] == 1 {
		g.at[r.URL.Path+" "+id] = time.Now()
	}
	w.WriteHeader(http.StatusNoContent)
}

// order checks an ordered webhook's chain (g.mu held) and returns what
// breaks it ("" when nothing does).
func (g *gate) order(path string, h http.Header) string {
	stream, err := wire.DecodeHeaderValue(h.Get(wire.HeaderSubject))
	if err != nil {
		return err.Error()
	}
	v, err := strconv.ParseInt(h.Get(wire.HeaderStreamVersion), 10, 64)
	if err != nil {
		return "no version: " + err.Error()
	}
	prev, err := wire.ParsePreviousVersion(h.Get(wire.HeaderPreviousVersion))
	if err != nil {
		return err.Error()
	}
	p, _ := strconv.Atoi(h.Get(wire.HeaderPartition))
	epoch, _ := strconv.ParseUint(h.Get(wire.HeaderLeaseEpoch), 10, 64)
	if err := g.verify.VerifyOrder(h, webhook.OrderFields{Stream: stream, Version: v, Previous: prev, Partition: p, Epoch: epoch}); err != nil {
		return fmt.Sprintf("%s v%d: order signature: %v", stream, v, err)
	}
	if g.last[path] == nil {
		g.last[path], g.named[path] = map[string]int64{}, map[string][]int64{}
	}
	last, seen := g.last[path][stream]
	if !seen {
		last = fanout.NoPrevious
	}
	switch {
	case v <= last:
		return "" // a duplicate: answered 2xx, not processed
	case prev != last:
		return fmt.Sprintf("%s: version %d names %d, last processed %d", stream, v, prev, last)
	}
	g.last[path][stream] = v
	g.named[path][stream] = append(g.named[path][stream], v, prev)
	return ""
}

// received returns how many distinct events path accepted.
func (g *gate) received(path string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.accepted["/"+path])
}

// has reports whether path accepted event id.
func (g *gate) has(path, id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.accepted["/"+path][id] > 0
}

// postsOf returns how many requests path got for event id.
func (g *gate) postsOf(path, id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.posts["/"+path+" "+id]
}

// acceptedAt returns when path first accepted event id (zero: never).
func (g *gate) acceptedAt(path, id string) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.at["/"+path+" "+id]
}

// chain returns the [version, previous] pairs path processed of stream.
func (g *gate) chain(path, stream string) []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int64(nil), g.named["/"+path][stream]...)
}

// duplicates returns the events path accepted more than once, with the
// lease epochs they were sent under, and those of them sent twice under
// one epoch: a partition's owner sends an event it settled again only
// when the partition changed hands before its commit (at least once,
// the next owner's epoch), never twice under one claim.
func (g *gate) duplicates(path string) (all map[string][]string, oneEpoch []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	all = map[string][]string{}
	for id, n := range g.accepted["/"+path] {
		if n < 2 {
			continue
		}
		epochs := g.epochs["/"+path+" "+id]
		all[id] = epochs
		seen := map[string]bool{}
		for _, e := range epochs {
			if seen[e] {
				oneEpoch = append(oneEpoch, id)
				break
			}
			seen[e] = true
		}
	}
	return all, oneEpoch
}

func (g *gate) problems() (breaks []string, badSigns int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.breaks...), g.badSigns
}

func (g *gate) setAnswer(fn func(path, id string) int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answer = fn
}

// gateWorld is a world whose subscriptions (name → ordering and dead
// letter policy) all deliver to one gate, with the dead-letter stream
// provisioned and given to every replica.
func gateWorld(t *testing.T, subs ...subscription.Subscription) (*world, *gate, *deadletter.DLQ) {
	t.Helper()
	w := newWorld(t)
	secret := w.subs[0].Secrets[0]
	var ordered []string
	for _, s := range subs {
		if s.Ordering != subscription.OrderingNone {
			ordered = append(ordered, s.Name)
		}
	}
	g := newGate(t, secret, ordered...)
	w.subs = nil
	for _, s := range subs {
		s.FilterSubjects, s.URL, s.Secrets = []string{"events.>"}, g.srv.URL+"/"+s.Name, []string{secret}
		// From the events stream's first event: "new" would start at
		// the replica's first claim, past events published meanwhile.
		s.Body, s.AllowPrivate, s.Start = subscription.BodyBinary, true, subscription.Start{Policy: subscription.StartAll}
		w.subs = append(w.subs, s)
	}
	q := deadletter.New(w.js, deadletter.Config{})
	require.NoError(t, q.Provision(t.Context()))
	w.opts = func(c *shared.Config, d *shared.Deps) {
		// The default TTL: under -race on a loaded machine 2 s leases
		// expire between renewals, and the partitions move all the time.
		c.LeaseTTL = owner.DefaultLeaseTTL
		d.DeadLetters = q
	}
	return w, g, q
}

// id is the event id of the k-th event world.publish stored (from 0):
// stream order-<k mod streams>, version k / streams, events stream
// sequence k+1.
func id(k int) string { return event.FormatID(int64(k + 1)) }

func TestDeadLetterIsStoredAndItsStreamGoesOnOrParks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica")
	}
	w, g, q := gateWorld(t,
		subscription.Subscription{Name: "skip", Ordering: subscription.OrderingStream, OnDeadLetter: subscription.DeadLetterSkip},
		subscription.Subscription{Name: "park", Ordering: subscription.OrderingStream, OnDeadLetter: subscription.DeadLetterPark},
		subscription.Subscription{Name: "unordered", Ordering: subscription.OrderingNone})
	const refused = 103 // order-3, version 1
	g.setAnswer(func(_, got string) int {
		if got == id(refused) {
			return http.StatusBadRequest
		}
		return 0
	})
	reg := prometheus.NewRegistry()
	gateOpts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		gateOpts(c, d)
		d.Registerer = reg
	}
	r := w.replica(t, "replica-a")
	published := time.Now()
	w.publish(t, 4*streams)

	// Every event but the refused one, and for park every event of
	// order-3 from it on.
	require.Eventually(t, func() bool {
		return g.received("skip") == 4*streams-1 && g.received("unordered") == 4*streams-1 && g.received("park") == 4*streams-3
	}, 60*time.Second, 20*time.Millisecond, "skip %d, unordered %d, park %d; %+v",
		g.received("skip"), g.received("unordered"), g.received("park"), r.Status())
	breaks, bad := g.problems()
	require.Empty(t, breaks, "the chains")
	require.Zero(t, bad)
	assert.Equal(t, []int64{0, fanout.NoPrevious, 2, 0, 3, 2}, g.chain("skip", "order-3"),
		"order-3's version 2 names version 0, the dead-lettered version's own predecessor")
	for _, k := range []int{refused, refused + streams, refused + 2*streams} {
		assert.False(t, g.has("park", id(k)), "park: order-3's event %s after the dead letter is held", id(k))
	}

	// The letters, as the old engine stores them.
	events, err := w.js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	orig, err := events.GetMsg(t.Context(), refused+1)
	require.NoError(t, err)
	for _, sub := range []string{"skip", "park", "unordered"} {
		var got []deadletter.Stored
		require.Eventually(t, func() bool {
			got, err = q.List(t.Context(), sub)
			return err == nil && len(got) > 0
		}, 5*time.Second, 20*time.Millisecond, "%s's dead letter", sub)
		require.Len(t, got, 1, sub)
		dl := got[0]
		assert.Equal(t, sub, dl.Subscription)
		assert.Equal(t, breaker.Endpoint(g.srv.URL+"/"+sub), dl.Endpoint)
		assert.Equal(t, id(refused), dl.EventID)
		assert.Equal(t, orig.Subject, dl.Subject)
		assert.Equal(t, uint64(refused+1), dl.StreamSeq)
		assert.Equal(t, http.StatusBadRequest, dl.Status)
		assert.Equal(t, 1, dl.Attempts)
		assert.Equal(t, orig.Data, dl.Data, "the event's data, byte for byte")
		assert.WithinDuration(t, orig.Time, dl.PublishedAt, time.Millisecond)
		for k := range orig.Header {
			if wire.IsCEHeader(k) || k == wire.HeaderContentType {
				assert.Equal(t, orig.Header.Get(k), dl.Header.Get(k), "%s: header %s", sub, k)
			}
		}
		assert.Empty(t, dl.Header.Get(wire.HeaderExpectedLastSubjectSequence), "no publish precondition of the original")
		if sub == "unordered" {
			assert.Empty(t, dl.PreviousVersion+dl.Partition+dl.LeaseEpoch, "no chain headers")
			continue
		}
		assert.Equal(t, "0", dl.PreviousVersion, "%s: the predecessor its attempt named", sub)
		assert.Equal(t, strconv.Itoa(wire.StreamPartition("order-3", 16)), dl.Partition)
		assert.NotEmpty(t, dl.LeaseEpoch)
	}

	// park set order-3 aside in its partition's record.
	require.Eventually(t, func() bool { return parkedAside(t, w, "park", "events.order.order-3", refused+1) },
		5*time.Second, 20*time.Millisecond, "park's aside of order-3 from the dead-lettered event")

	// The aside-age gauges: park's oldest held-back event is the dead
	// letter, stored after published; the others hold nothing back; the
	// events stream's MaxAge as it is when first scraped.
	cfg := events.CachedInfo().Config
	cfg.MaxAge = time.Hour
	_, err = w.js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return promregtest.Value(t, reg, "jsbridge_consumer_streams_parked", "subscription", "park") == 1
	}, 5*time.Second, 20*time.Millisecond, "park's parked gauge")
	age := promregtest.Value(t, reg, "jsbridge_consumer_streams_aside_oldest_age_seconds", "subscription", "park")
	assert.Greater(t, age, 0.0, "park holds back order-3's dead letter")
	assert.LessOrEqual(t, age, time.Since(published).Seconds(), "stored after the publish began")
	for _, sub := range []string{"skip", "unordered"} {
		assert.Equal(t, 1, promregtest.Series(t, reg, "jsbridge_consumer_streams_aside_oldest_age_seconds", "subscription", sub), "subscription %s has its series", sub) // Value reads 0 for a series not there
		assert.Zero(t, promregtest.Value(t, reg, "jsbridge_consumer_streams_aside_oldest_age_seconds", "subscription", sub), sub)
	}
	assert.Equal(t, time.Hour.Seconds(), promregtest.Value(t, reg, "jsbridge_consumer_events_max_age_seconds"))
}

// flakyLetters is the dead-letter stream failing its first fails writes
// (as a stream out of reach would), then storing them.
type flakyLetters struct {
	q *deadletter.DLQ

	mu     sync.Mutex
	fails  int
	tries  int
	stored time.Time // when the first letter was stored
}

func (f *flakyLetters) DeadLetter(ctx context.Context, dl deadletter.Letter) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	if f.tries <= f.fails {
		return errors.New("dead-letter stream out of reach")
	}
	if err := f.q.DeadLetter(ctx, dl); err != nil {
		return err
	}
	if f.stored.IsZero() {
		f.stored = time.Now()
	}
	return nil
}

func TestDeadLetterNotStoredHoldsItsStreamUntilItIs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica, and waits for two retries (1.5 s)")
	}
	w, g, q := gateWorld(t, subscription.Subscription{Name: "skip", Ordering: subscription.OrderingStream, OnDeadLetter: subscription.DeadLetterSkip})
	flaky := &flakyLetters{q: q, fails: 2}
	w.opts = func(_ *shared.Config, d *shared.Deps) { d.DeadLetters = flaky }
	const refused = 3 // order-3, version 0
	g.setAnswer(func(_, got string) int {
		if got == id(refused) {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	w.replica(t, "replica-a")
	w.publish(t, 2*streams)
	require.Eventually(t, func() bool { return g.received("skip") == 2*streams-1 }, 60*time.Second, 20*time.Millisecond)
	flaky.mu.Lock()
	tries, stored := flaky.tries, flaky.stored
	flaky.mu.Unlock()
	assert.Equal(t, 3, tries, "two failed writes, then the letter stored")
	next := g.acceptedAt("skip", id(refused+streams))
	assert.True(t, next.After(stored), "order-3's version 1 went out after the letter was stored (%v), not before (%v)", stored, next)
	assert.Equal(t, []int64{1, fanout.NoPrevious}, g.chain("skip", "order-3"), "version 1 names none: version 0 was not delivered")
	got, err := q.List(t.Context(), "skip")
	require.NoError(t, err)
	require.Len(t, got, 1, "stored once")
	breaks, _ := g.problems()
	require.Empty(t, breaks)
}

func TestChainStepsOverADeadLetterAfterAHandOver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas")
	}
	w, g, _ := gateWorld(t,
		subscription.Subscription{Name: "skip", Ordering: subscription.OrderingStream, OnDeadLetter: subscription.DeadLetterSkip})
	const refused = 103 // order-3, version 1
	g.setAnswer(func(_, got string) int {
		if got == id(refused) {
			return http.StatusBadRequest
		}
		return 0
	})
	a := w.replica(t, "replica-a")
	w.publish(t, 2*streams)
	require.Eventually(t, func() bool { return g.received("skip") == 2*streams-1 }, 60*time.Second, 20*time.Millisecond)

	// The record of order-3's partition forgets the stream once its floor
	// passed it: the next owner has no entry for it and looks its
	// predecessor up on the events stream, where the last event before
	// version 2 is the dead-lettered version 1.
	kv, err := w.js.KeyValue(t.Context(), position.DefaultBucket)
	require.NoError(t, err)
	p := wire.StreamPartition("order-3", 16)
	require.Eventually(t, func() bool {
		all, err := position.ReadAll(t.Context(), kv)
		if err != nil {
			return false
		}
		for _, st := range all {
			if st.Partition == p {
				_, has := st.Record.Streams["events.order.order-3"]
				return st.Record.Floor >= refused+1 && !has && len(st.Record.Ahead) == 0
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the floor of partition %d passes the dead-lettered event", p)
	sk, err := deadletter.ReadSkipped(t.Context(), kv, "skip", "events.order.order-3")
	require.NoError(t, err)
	require.Equal(t, []deadletter.SkippedVersion{{Version: 1, Previous: 0}}, sk.Versions, "the dead-lettered version, in the positions bucket")

	a.Stop()
	w.replica(t, "replica-b")
	w.publish(t, streams)
	require.Eventually(t, func() bool { return g.received("skip") == 3*streams-1 }, 60*time.Second, 20*time.Millisecond)
	breaks, bad := g.problems()
	require.Empty(t, breaks, "no gap after the dead letter, on the replica that took over")
	require.Zero(t, bad)
	assert.Equal(t, []int64{0, fanout.NoPrevious, 2, 0}, g.chain("skip", "order-3"),
		"version 2, the first of order-3 on the new owner, names version 0: the dead-lettered version 1 is stepped over")
}

// disabledEverywhere reports whether sub has a cursor in StateDisabled
// on every partition each replica has taken (and each took some).
func disabledEverywhere(sub string, rs ...*shared.Replica) bool {
	for _, r := range rs {
		st := r.Status()
		if len(st) == 0 {
			return false
		}
		for _, p := range st {
			if p.Behind[sub] != fanout.StateDisabled {
				return false
			}
		}
	}
	return true
}

// serving reports whether r owns partitions, has taken each on its
// reader and releases none.
func serving(r *shared.Replica) bool {
	return len(r.Owned()) > 0 && len(r.Status()) == len(r.Owned())
}

// runningEverywhere reports whether sub has a cursor in StateDisabled on
// no partition of the replicas.
func runningEverywhere(sub string, rs ...*shared.Replica) bool {
	for _, r := range rs {
		for _, p := range r.Status() {
			if p.Behind[sub] == fanout.StateDisabled {
				return false
			}
		}
	}
	return true
}

func TestGoneDisablesTheSubscriptionOnEveryReplicaAndEnableResumesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and three replicas")
	}
	w, g, _ := gateWorld(t,
		subscription.Subscription{Name: "ordered", Ordering: subscription.OrderingStream},
		subscription.Subscription{Name: "unordered", Ordering: subscription.OrderingNone})
	opts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		opts(c, d)
		c.Health.OpsWebhookURL, c.Health.OpsWebhookSecret = g.srv.URL+"/ops", w.subs[0].Secrets[0]
	}
	const gone = 5 // order-5, version 0
	goneOnce := true
	g.setAnswer(func(path, got string) int {
		if path == "/ordered" && got == id(gone) && goneOnce {
			return http.StatusGone
		}
		return 0
	})
	a := w.replica(t, "replica-a")
	b := w.replica(t, "replica-b")
	// Both serve a share before the 410: a, started first, takes all 16
	// and releases half at its next lease round (LeaseTTL/4 later, 2.5 s
	// here), so a disable timed before that would time the move.
	require.Eventually(t, func() bool { return serving(a) && serving(b) && len(a.Owned())+len(b.Owned()) == 16 },
		30*time.Second, 20*time.Millisecond, "the partitions shared: a %v, b %v", a.Owned(), b.Owned())
	w.publish(t, streams)

	// The 410, answered to one replica's attempt, disables the
	// subscription on both, on the partitions each already serves.
	require.Eventually(t, func() bool { return disabledEverywhere("ordered", a, b) }, 10*time.Second, 5*time.Millisecond,
		"ordered disabled on every partition: a %+v, b %+v", a.Status(), b.Status())
	g.mu.Lock()
	first := g.refused[http.StatusGone]
	goneOnce = false
	g.mu.Unlock()
	took := time.Since(first)
	t.Logf("disabled on both replicas %v after the 410", took)
	bound := time.Second
	if raceEnabled {
		bound = 10 * time.Second // without -race: 17-66 ms, mostly the publish the 410 came during
	}
	assert.Less(t, took, bound, "disabled on both within a second of the 410 (10 s under -race)")
	assert.True(t, runningEverywhere("unordered", a, b), "the other subscription goes on")
	recs, err := health.ReadDisabled(t.Context(), w.js)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "ordered:"+health.ReasonGone, recs[0].Subscription+":"+recs[0].Reason)
	assert.Equal(t, http.StatusGone, recs[0].Status)

	// Nothing is sent to it while it is disabled, and a replica started
	// meanwhile starts it disabled.
	before := g.received("ordered")
	w.publish(t, streams)
	c := w.replica(t, "replica-c")
	require.Eventually(t, func() bool { return len(c.Owned()) > 0 && len(c.Status()) == len(c.Owned()) },
		20*time.Second, 20*time.Millisecond, "c takes partitions: %v", c.Owned())
	require.True(t, disabledEverywhere("ordered", a, b, c), "a %+v, b %+v, c %+v", a.Status(), b.Status(), c.Status())
	require.Eventually(t, func() bool { return g.received("unordered") == 2*streams }, 60*time.Second, 20*time.Millisecond)
	assert.Equal(t, before, g.received("ordered"), "nothing delivered to the disabled subscription")
	assert.False(t, g.has("ordered", id(gone)))

	// Enabled, it goes on from where it stopped on every replica, and
	// every event arrives once.
	enabled, err := health.Enable(t.Context(), w.js, "ordered")
	require.NoError(t, err)
	require.True(t, enabled)
	require.Eventually(t, func() bool { return runningEverywhere("ordered", a, b, c) }, 5*time.Second, 5*time.Millisecond)
	w.publish(t, streams)
	require.Eventually(t, func() bool { return g.received("ordered") == 3*streams && g.received("unordered") == 3*streams },
		60*time.Second, 20*time.Millisecond, "ordered %d, unordered %d; a %+v, b %+v, c %+v",
		g.received("ordered"), g.received("unordered"), a.Status(), b.Status(), c.Status())
	breaks, bad := g.problems()
	require.Empty(t, breaks)
	require.Zero(t, bad)
	dups, oneEpoch := g.duplicates("ordered")
	if len(dups) > 0 {
		t.Logf("accepted again after a partition changed hands (by lease epoch): %v", dups)
	}
	assert.Empty(t, oneEpoch, "every event of the disabled subscription arrives once from each owner")

	// Announced once: the ops event and the operational webhook.
	ops, err := w.js.Stream(t.Context(), wire.DefaultOpsStream)
	require.NoError(t, err)
	info, err := ops.Info(t.Context())
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.State.Msgs, "one ops.endpoint.disabled event")
	require.Eventually(t, func() bool { return g.received("ops") == 1 }, 10*time.Second, 20*time.Millisecond, "one operational webhook")
}

func TestFailureStreakDisablesTheSubscription(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica")
	}
	w, g, _ := gateWorld(t, subscription.Subscription{Name: "ordered", Ordering: subscription.OrderingStream,
		BackOff: []time.Duration{10 * time.Millisecond}})
	opts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		opts(c, d)
		c.Health.DisableAfter, c.Health.DisableMinFailures = time.Nanosecond, 3
	}
	g.setAnswer(func(string, string) int { return http.StatusInternalServerError })
	r := w.replica(t, "replica-a")
	w.publish(t, 1)
	require.Eventually(t, func() bool { return disabledEverywhere("ordered", r) }, 10*time.Second, 5*time.Millisecond,
		"disabled on every partition: %+v", r.Status())
	var recs []health.DisabledRecord
	require.Eventually(t, func() bool { // written to the bucket after this replica stopped it
		var err error
		recs, err = health.ReadDisabled(t.Context(), w.js)
		return err == nil && len(recs) == 1
	}, 5*time.Second, 5*time.Millisecond, "the disabled key")
	assert.Equal(t, health.ReasonFailing, recs[0].Reason)
	assert.Equal(t, 3, g.postsOf("ordered", id(0)), "disabled at the third failure; nothing sent after it")
}

func TestMaxDeliverCountsPostsNotAttemptsTheBreakerRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica")
	}
	w, g, q := gateWorld(t, subscription.Subscription{Name: "ordered", Ordering: subscription.OrderingStream,
		MaxDeliver: 3, BackOff: []time.Duration{10 * time.Millisecond}, OnDeadLetter: subscription.DeadLetterSkip})
	opts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		opts(c, d)
		c.Health.DisableAfter = -1
		// The breaker opens at each failure and lets a probe through
		// 300 ms later: between the POSTs (retried after 100 ms), attempts it
		// refuses.
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 300 * time.Millisecond}, nil, nil)
		require.NoError(t, err)
		d.Breakers = set
	}
	g.setAnswer(func(string, string) int { return http.StatusInternalServerError })
	w.replica(t, "replica-a")
	w.publish(t, 1)
	var got []deadletter.Stored
	require.Eventually(t, func() bool {
		var err error
		got, err = q.List(t.Context(), "ordered")
		return err == nil && len(got) == 1
	}, 10*time.Second, 10*time.Millisecond, "the dead letter")
	assert.Equal(t, 3, got[0].Attempts)
	assert.Equal(t, 3, g.postsOf("ordered", id(0)), "MaxDeliver POSTs, the attempts the open breaker refused not counted")
}

func TestPausedAndDisabledSubscriptionResumedStaysDisabledUntilEnabled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica")
	}
	w, g, _ := gateWorld(t, subscription.Subscription{Name: "ordered", Ordering: subscription.OrderingStream})
	r := w.replica(t, "replica-a")
	require.Eventually(t, func() bool { return len(r.Owned()) == 16 && len(r.Status()) == 16 }, 10*time.Second, 20*time.Millisecond)
	paused := func() bool {
		for _, p := range r.Status() {
			if p.Behind["ordered"] != fanout.StatePaused {
				return false
			}
		}
		return true
	}
	r.Pause("ordered")
	require.True(t, paused())
	require.NoError(t, health.SetDisabled(t.Context(), nil, w.js, "ordered", health.ReasonOperator))
	require.Eventually(t, func() bool { return r.Disabled("ordered") }, 5*time.Second, 5*time.Millisecond)
	require.True(t, paused(), "paused wins while both hold")

	require.NoError(t, r.Put(w.subs[0]))
	require.True(t, disabledEverywhere("ordered", r), "resumed, it is disabled still: %+v", r.Status())
	w.publish(t, streams)
	_, err := health.Enable(t.Context(), w.js, "ordered")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return g.received("ordered") == streams }, 30*time.Second, 20*time.Millisecond)
	assert.True(t, runningEverywhere("ordered", r))
}

// parkedAside reports whether sub's stream key stream is set aside as
// parked from sequence from in a partition record of the positions
// bucket.
func parkedAside(t *testing.T, w *world, sub, stream string, from uint64) bool {
	kv, err := w.js.KeyValue(t.Context(), position.DefaultBucket)
	if err != nil {
		return false
	}
	all, err := position.ReadAll(t.Context(), kv)
	if err != nil {
		return false
	}
	for _, st := range all {
		for _, a := range st.Record.Asides {
			if a.Sub == sub && a.Stream == stream && a.From == from && a.State == "parked" {
				return true
			}
		}
	}
	return false
}

func TestOrderGateRefusingTooLongDeadLettersAndParksTheStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica, and waits for the order-stuck bound (0.5 s)")
	}
	w, g, q := gateWorld(t,
		subscription.Subscription{Name: "skip", Ordering: subscription.OrderingStream, OnDeadLetter: subscription.DeadLetterSkip})
	opts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		opts(c, d)
		c.OrderStuckAfter = 500 * time.Millisecond
	}
	const refused = 103 // order-3, version 1
	g.setAnswer(func(_, got string) int {
		if got == id(refused) {
			return http.StatusConflict
		}
		return 0
	})
	start := time.Now()
	w.replica(t, "replica-a")
	w.publish(t, 3*streams)
	var got []deadletter.Stored
	require.Eventually(t, func() bool {
		var err error
		got, err = q.List(t.Context(), "skip")
		return err == nil && len(got) == 1
	}, 20*time.Second, 20*time.Millisecond, "the order-stuck head's dead letter")
	t.Logf("dead-lettered %v after the start, the gate refusing it %d times", time.Since(start), g.postsOf("skip", id(refused)))
	assert.Equal(t, id(refused), got[0].EventID)
	assert.Equal(t, http.StatusConflict, got[0].Status)
	assert.Contains(t, got[0].Reason, "order-stuck")
	assert.Equal(t, "0", got[0].PreviousVersion)
	assert.Greater(t, g.postsOf("skip", id(refused)), 1, "refused in place before it")
	require.Eventually(t, func() bool { return parkedAside(t, w, "skip", "events.order.order-3", refused+1) }, 5*time.Second, 20*time.Millisecond,
		"order-3 parked, although on_dead_letter is skip")
	require.Eventually(t, func() bool { return g.received("skip") == 3*streams-2 }, 30*time.Second, 20*time.Millisecond,
		"every other stream goes on: %d", g.received("skip"))
	assert.False(t, g.has("skip", id(refused+streams)), "order-3's next version is held")
	breaks, _ := g.problems()
	require.Empty(t, breaks)
}
