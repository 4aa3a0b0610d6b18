package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// upgradeReceiver is the endpoint of both subscriptions of the upgrade
// test (path /ordered and /unordered): it verifies every request's
// signature, answers as its phase says, and records per path which
// event ids it acknowledged (2xx) and in which phase, which ids it
// acknowledged in phase 1 and was sent again in phase 2, and for the
// ordered path every acknowledged request's place in its stream's
// version chain (version, the previous version it names, its lease
// epoch). Event id i is version (i-1)/streams of stream i mod streams
// (upgradePublish).
type upgradeReceiver struct {
	*httptest.Server
	streams int

	mu    sync.Mutex
	phase int
	// slowAbove: in phase 1, ids above it are answered after a delay
	// (the upgrade…Delay constants: the ordered path slower than the
	// unordered one, and slower still for the streams in slower), so
	// that the old engine is stopped with events still to deliver, with
	// the ordered subscription's other streams settled above its
	// partition floors (its delivered records), and with the unordered
	// subscription delivered past some of those floors.
	slowAbove int
	slower    map[int]bool
	// failing: in phase 1, the unordered path answers 503 for these ids
	// (retried, so pending at the stop, with later ids acked above them).
	failing map[int]bool
	// refused: in phase 1, the ordered path answers 422 for these ids
	// (dead-lettered at once, their stream parked).
	refused map[int]bool
	// unavailable: in phase 1, the ordered path answers 503 for these ids
	// (retried in place: their stream set aside).
	unavailable map[int]bool
	acked       map[string]map[int]int  // path → id → phase it was first acknowledged in
	resent      map[string]map[int]bool // path → ids acknowledged in phase 1 and received in phase 2
	links       map[int][]chainLink     // ordered: stream → acknowledged requests, in order
	bad         []string                // signature failures and malformed requests
}

// chainLink is one acknowledged ordered request.
type chainLink struct {
	version  int
	previous string
	epoch    uint64
	phase    int
}

const (
	upgradeUnorderedDelay     = 20 * time.Millisecond
	upgradeOrderedDelay       = 40 * time.Millisecond
	upgradeOrderedSlowerDelay = 300 * time.Millisecond
	pathOrdered               = "/ordered"
	pathUnordered             = "/unordered"
)

func newUpgradeReceiver(t *testing.T, streams int) *upgradeReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	rc := &upgradeReceiver{streams: streams, phase: 1, failing: map[int]bool{}, slower: map[int]bool{},
		acked:  map[string]map[int]int{pathOrdered: {}, pathUnordered: {}},
		resent: map[string]map[int]bool{pathOrdered: {}, pathUnordered: {}},
		links:  map[int][]chainLink{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		path := r.URL.Path
		id, idErr := strconv.Atoi(r.Header.Get(wire.HeaderIdempotencyKey))
		rc.mu.Lock()
		phase := rc.phase
		if err := v.Verify(r.Header, body); err != nil || idErr != nil || rc.acked[path] == nil {
			rc.bad = append(rc.bad, fmt.Sprintf("%s %s: signature %v, id %v", path, r.Header.Get(wire.HeaderIdempotencyKey), err, idErr))
			rc.mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if phase == 2 && rc.acked[path][id] == 1 {
			rc.resent[path][id] = true
		}
		fail := phase == 1 && path == pathUnordered && rc.failing[id]
		refuse := phase == 1 && path == pathOrdered && rc.refused[id]
		unavailable := phase == 1 && path == pathOrdered && rc.unavailable[id]
		var delay time.Duration
		switch {
		case phase != 1 || id <= rc.slowAbove:
		case path == pathOrdered && rc.slower[id%rc.streams]:
			delay = upgradeOrderedSlowerDelay
		case path == pathOrdered:
			delay = upgradeOrderedDelay
		default:
			delay = upgradeUnorderedDelay
		}
		rc.mu.Unlock()
		if fail || unavailable {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if refuse {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		time.Sleep(delay)
		rc.mu.Lock()
		if _, ok := rc.acked[path][id]; !ok {
			rc.acked[path][id] = phase
		}
		if path == pathOrdered {
			epoch, err := strconv.ParseUint(r.Header.Get(wire.HeaderLeaseEpoch), 10, 64)
			if err != nil {
				rc.bad = append(rc.bad, fmt.Sprintf("ordered %d: lease epoch %q", id, r.Header.Get(wire.HeaderLeaseEpoch)))
			}
			s := id % rc.streams
			rc.links[s] = append(rc.links[s], chainLink{version: (id - 1) / rc.streams, previous: r.Header.Get(wire.HeaderPreviousVersion), epoch: epoch, phase: phase})
		}
		rc.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// ackedCount is how many distinct ids path acknowledged.
func (rc *upgradeReceiver) ackedCount(path string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.acked[path])
}

func (rc *upgradeReceiver) setPhase(p int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.phase = p
}

// missing lists the ids of 1..n path has not acknowledged (at most 20).
func (rc *upgradeReceiver) missing(path string, n int) []int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []int
	for id := 1; id <= n && len(out) < 20; id++ {
		if _, ok := rc.acked[path][id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// chainProblems checks each ordered stream's acknowledged requests: the
// versions 0, 1, 2, … each once and in order, each naming the one before
// it (none before 0), and the lease epoch never going back, across both
// phases. A request without an epoch (0: `consumer dlq replay`'s, which
// carries no partition or epoch, docs/ordering.md) is not compared.
func (rc *upgradeReceiver) chainProblems(perStream int) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for s := range rc.streams {
		links := rc.links[s]
		if len(links) != perStream {
			out = append(out, fmt.Sprintf("stream order-%d: %d versions acknowledged, want %d", s, len(links), perStream))
		}
		var last chainLink // the last request that carried an epoch
		for i, l := range links {
			want := wire.PreviousNone
			if i > 0 {
				want = strconv.Itoa(links[i-1].version)
			}
			switch {
			case l.version != i:
				out = append(out, fmt.Sprintf("stream order-%d: acknowledgement %d is version %d (phase %d)", s, i, l.version, l.phase))
			case l.previous != want:
				out = append(out, fmt.Sprintf("stream order-%d: version %d (phase %d) names %q before it, want %q", s, l.version, l.phase, l.previous, want))
			case l.epoch != 0 && l.epoch < last.epoch:
				out = append(out, fmt.Sprintf("stream order-%d: version %d (phase %d) has lease epoch %d, below version %d's %d", s, l.version, l.phase, l.epoch, last.version, last.epoch))
			}
			if l.epoch != 0 {
				last = l
			}
		}
	}
	return out
}

// upgradePublish publishes events from..to as the bridge does: event id
// i in stream order-<i mod streams> at version (i-1)/streams, so each
// stream's versions are 0, 1, 2, … in id order.
func upgradePublish(t *testing.T, b *jsBundle, from, to, streams int) {
	t.Helper()
	var futures []jetstream.PubAckFuture
	for id := from; id <= to; id++ {
		e := event.Event{ID: int64(id), Stream: fmt.Sprintf("order-%d", id%streams), Version: int64((id - 1) / streams),
			Name: "OrderNoted", Data: fmt.Appendf(nil, `{"n":%d}`, id), Created: time.Now()}
		f, err := b.js.PublishMsgAsync(forward.Message(e, forward.Config{}))
		require.NoError(t, err)
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("publish ack timed out")
		}
	}
}

// migrateJSON runs `consumer migrate <args> --json`, requires it to
// succeed and decodes its stdout into v.
func migrateJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	stdout, stderr, err := migrateRun(t, v, args...)
	require.NoError(t, err, "consumer migrate %v\nstdout:\n%s\nstderr:\n%s", args, stdout, stderr)
}

// migrateRun runs `consumer migrate <args> --json`, decodes its stdout
// into v, and returns what it printed and how it exited.
func migrateRun(t *testing.T, v any, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), "consumer"), append([]string{"migrate", "--json"}, args...)...)
	cmd.Env = os.Environ()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	require.NoError(t, json.Unmarshal(out.Bytes(), v), "consumer migrate %v\nstdout:\n%s\nstderr:\n%s", args, out.String(), errOut.String())
	return out.String(), errOut.String(), err
}

// migrationPlan is the part of `consumer migrate --json`'s output the
// upgrade test reads.
type migrationPlan struct {
	Plan struct {
		Fingerprint   string `json:"fingerprint"`
		Subscriptions []struct {
			Name    string `json:"name"`
			Ordered bool   `json:"ordered"`
			Floor   uint64 `json:"floor"`
			Pending int    `json:"pending"`
			Resent  uint64 `json:"resent"`
			// Delivered is an unordered durable's last delivered
			// sequence.
			Delivered uint64 `json:"delivered"`
			// Partitions: an ordered subscription's; Settled counts
			// its streams settled above the partition's floor.
			Partitions []struct {
				Floor   uint64 `json:"floor"`
				Settled int    `json:"settled"`
			} `json:"partitions"`
		} `json:"subscriptions"`
		Refusals []any `json:"refusals"`
	} `json:"plan"`
	Result *struct {
		Done    bool `json:"Done"`
		Records int  `json:"Records"`
	} `json:"result"`
}

// resent is the plan's Resent of subscription name.
func (p *migrationPlan) resent(t *testing.T, name string) uint64 {
	t.Helper()
	for _, s := range p.Plan.Subscriptions {
		if s.Name == name {
			return s.Resent
		}
	}
	t.Fatalf("subscription %s is not in the plan: %+v", name, p.Plan.Subscriptions)
	return 0
}

// The upgrade from the per-subscription durables to the shared engine,
// process by process: the old engine (consumer run --engine durables)
// delivers an ordered and an unordered subscription part of a stream of
// events to a receiver verifying signatures, the unordered endpoint
// failing three events meanwhile (retried: pending, with later events
// acked above them) and a quarter of the ordered streams slower than the
// rest (so that the others settle above the partition floors); a
// cleanup tried while it runs is refused; it is stopped (SIGTERM) with
// events still to deliver, the unordered subscription past some of the
// ordered one's partition floors; consumer migrate plans (--dry-run) and
// applies the move; consumer run --engine shared delivers the rest;
// consumer migrate --cleanup deletes the old layout while it runs, and
// it goes on. No event is lost on either subscription; the ordered one's
// streams are acknowledged in version order, each version once, every
// request naming the version acknowledged before it and the lease epoch
// never going back, across the upgrade; and the events the receiver
// acknowledged to the old engine that the shared one sends again are
// exactly those the plan counted as re-sent, per subscription (none for
// the ordered one).
//
// With --read-pending the migration reads the unordered durable's
// pending set back, and then nothing the receiver acknowledged is sent
// again: a cursor the migration wrote with Above entries past its
// partition record's floor rejoins the shared read only once the head
// passed them (fanout's rejoin), not at once from the floor.
func TestMigrateFromPerSubscriptionDurables(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level: consumer processes of both engines, waits of seconds")
	}
	t.Parallel()
	t.Run("re-sent as counted", func(t *testing.T) {
		t.Parallel()
		testUpgrade(t, false)
	})
	t.Run("read-pending", func(t *testing.T) {
		t.Parallel()
		testUpgrade(t, true)
	})
}

// testUpgrade is TestMigrateFromPerSubscriptionDurables, the migration
// reading the unordered pending set back when readPending.
func testUpgrade(t *testing.T, readPending bool) {
	const (
		streams   = 20
		perStream = 50
		events    = streams * perStream // 1,000
		firstHalf = 400
		more      = 5 * streams // published after the cleanup
	)
	b := setupJetStream(t)
	rc := newUpgradeReceiver(t, streams)
	rc.slowAbove = firstHalf
	for _, id := range []int{50, 150, 250} {
		rc.failing[id] = true
	}
	for s := 3; s < streams; s += 4 {
		rc.slower[s] = true
	}
	cfg := filepath.Join(t.TempDir(), "subscriptions.yaml")
	common := `secrets_env: [JSBRIDGE_SECRET], allow_private: true, start: all, max_deliver: -1, backoff: [100ms], timeout: 2s, ack_wait: 5s`
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: ordered, filter_subjects: [events.>], url: %q, ordering: stream, %s}
  - {name: unordered, filter_subjects: [events.>], url: %q, ordering: none, max_in_flight: 16, %s}
`, rc.URL+pathOrdered, common, rc.URL+pathUnordered, common), 0o600))
	url := b.srv.ClientURL()
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", url, "--config", cfg, "--ops-addr", "", "--partitions", "8", "--lease-ttl", "2s", "--log-level", "info"}
	startConsumer := func(env []string) *proc {
		p := startProc(t, env, "consumer", args...)
		require.True(t, waitFor(30*time.Second, func() bool { return strings.Contains(p.out.String(), "consumer started") }), "consumer started:\n%s", p.out.String())
		return p
	}

	// Phase 1: the old engine.
	old := startConsumer(append(env, "JSBRIDGE_ENGINE=durables")) // whatever engine the suite runs the others on
	upgradePublish(t, b, 1, firstHalf, streams)
	require.True(t, waitFor(60*time.Second, func() bool {
		return rc.ackedCount(pathOrdered) == firstHalf && rc.ackedCount(pathUnordered) == firstHalf-len(rc.failing)
	}), "the old engine delivers the first %d events: ordered %d, unordered %d (3 failing)\n%s",
		firstHalf, rc.ackedCount(pathOrdered), rc.ackedCount(pathUnordered), old.out.String())
	var early struct {
		Cleanup struct {
			Refusals []string `json:"refusals"`
		} `json:"cleanup"`
		Deleted bool `json:"deleted"`
	}
	_, _, err := migrateRun(t, &early, "--nats-url", url, "--cleanup")
	require.Error(t, err, "a cleanup while the old engine runs, before the migration, is refused")
	require.False(t, early.Deleted)
	refusals := strings.Join(early.Cleanup.Refusals, "\n")
	require.Contains(t, refusals, "the migration was not applied")
	require.Contains(t, refusals, "a replica of the old engine still runs")
	upgradePublish(t, b, firstHalf+1, events, streams)
	require.True(t, waitFor(60*time.Second, func() bool {
		return rc.ackedCount(pathOrdered) >= firstHalf+50 && rc.ackedCount(pathUnordered) >= firstHalf+100
	}), "the old engine delivers some of the rest")
	require.NoError(t, old.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-old.exited:
		require.NoError(t, old.err, "the old engine's graceful stop:\n%s", old.out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the old engine did not stop within 30 s of SIGTERM:\n%s", old.out.String())
	}
	orderedBefore, unorderedBefore := rc.ackedCount(pathOrdered), rc.ackedCount(pathUnordered)
	t.Logf("the old engine stopped with %d ordered and %d unordered events acknowledged of %d", orderedBefore, unorderedBefore, events)
	require.Less(t, orderedBefore, events, "stopped with ordered events still to deliver")
	require.Less(t, unorderedBefore, events, "stopped with unordered events still to deliver")

	// The migration: planned, then applied.
	var dry, applied migrationPlan
	migrateArgs := []string{"--nats-url", url, "--partitions", "8"}
	if readPending {
		migrateArgs = append(migrateArgs, "--read-pending")
	}
	migrateJSON(t, &dry, append(migrateArgs, "--dry-run")...)
	require.Empty(t, dry.Plan.Refusals)
	require.Nil(t, dry.Result, "a dry run writes nothing")
	migrateJSON(t, &applied, migrateArgs...)
	require.Equal(t, dry.Plan.Fingerprint, applied.Plan.Fingerprint, "the dry run planned what was applied")
	require.NotNil(t, applied.Result)
	require.False(t, applied.Result.Done)
	t.Logf("plan: %+v", applied.Plan.Subscriptions)
	require.Zero(t, applied.resent(t, "ordered"), "an ordered subscription's move is exact")
	if readPending {
		require.Zero(t, applied.resent(t, "unordered"), "the pending set read back: the events acked above the floor are known")
	} else {
		require.Positive(t, applied.resent(t, "unordered"), "events acked above the unordered floor (the failing ones pending below them)")
	}
	settled := 0
	for _, s := range applied.Plan.Subscriptions {
		for _, p := range s.Partitions {
			settled += p.Settled
		}
	}
	require.Positive(t, settled, "ordered streams settled above their partition floors (the slower streams hold the floors)")
	var ahead bool // the unordered subscription delivered past an ordered partition's floor
	for _, s := range applied.Plan.Subscriptions {
		for _, o := range applied.Plan.Subscriptions {
			for _, p := range o.Partitions {
				ahead = ahead || (!s.Ordered && s.Delivered > p.Floor)
			}
		}
	}
	require.True(t, ahead, "the unordered subscription delivered past an ordered partition's floor: %+v", applied.Plan.Subscriptions)

	// Phase 2: the shared engine delivers the rest.
	rc.setPhase(2)
	shared := startConsumer(append(env, "JSBRIDGE_ENGINE=shared"))
	if !waitFor(90*time.Second, func() bool {
		return rc.ackedCount(pathOrdered) == events && rc.ackedCount(pathUnordered) == events
	}) {
		t.Fatalf("the shared engine delivers the rest: ordered %d of %d (missing %v), unordered %d of %d (missing %v)\n%s",
			rc.ackedCount(pathOrdered), events, rc.missing(pathOrdered, events), rc.ackedCount(pathUnordered), events, rc.missing(pathUnordered, events), shared.out.String())
	}

	// The old layout deleted while the shared engine runs: it goes on.
	var cleanup struct {
		Cleanup struct {
			Durables           []string `json:"durables"`
			Copy               string   `json:"copy"`
			PartitionConsumers []string `json:"partition_consumers"`
			ParkBucket         string   `json:"park_bucket"`
		} `json:"cleanup"`
		Deleted bool `json:"deleted"`
	}
	migrateJSON(t, &cleanup, "--nats-url", url, "--cleanup")
	require.True(t, cleanup.Deleted)
	require.Equal(t, []string{"unordered"}, cleanup.Cleanup.Durables)
	require.Equal(t, wire.OrderedStream(wire.DefaultEventsStream), cleanup.Cleanup.Copy)
	require.Len(t, cleanup.Cleanup.PartitionConsumers, 8)
	require.Equal(t, wire.DefaultParkBucket, cleanup.Cleanup.ParkBucket, "the park bucket, left empty, goes")
	_, err = b.js.KeyValue(b.ctx, wire.DefaultParkBucket)
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound)
	_, err = b.js.Stream(b.ctx, wire.OrderedStream(wire.DefaultEventsStream))
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	const total = events + more
	upgradePublish(t, b, events+1, total, streams)
	if !waitFor(60*time.Second, func() bool {
		return rc.ackedCount(pathOrdered) == total && rc.ackedCount(pathUnordered) == total
	}) {
		t.Fatalf("after the cleanup the shared engine delivers the next %d events: ordered %d, unordered %d of %d\n%s",
			total-events, rc.ackedCount(pathOrdered), rc.ackedCount(pathUnordered), total, shared.out.String())
	}

	rc.mu.Lock()
	bad := slices.Clone(rc.bad)
	resentOrdered, resentUnordered := len(rc.resent[pathOrdered]), len(rc.resent[pathUnordered])
	rc.mu.Unlock()
	rc.mu.Lock()
	var again []int
	for id := range rc.resent[pathUnordered] {
		again = append(again, id)
	}
	rc.mu.Unlock()
	slices.Sort(again)
	if uint64(len(again)) != applied.resent(t, "unordered") {
		t.Logf("unordered: acknowledged to the old engine and sent again (%d): %v", len(again), again)
	}
	require.Empty(t, bad, "requests that did not verify")
	require.Empty(t, rc.chainProblems(total/streams), "the ordered subscription's version chain across the upgrade")
	require.Equal(t, applied.resent(t, "ordered"), uint64(resentOrdered), "ordered: acknowledged to the old engine and sent again by the shared one")
	require.Equal(t, applied.resent(t, "unordered"), uint64(resentUnordered), "unordered: acknowledged to the old engine and sent again by the shared one")
}

// A stream the old engine parked behind a dead letter moves parked: the
// shared engine holds its later events (and delivers every other
// stream's), and `consumer dlq replay` of the head releases it, the
// shared engine then delivering the rest of the stream in order, its
// chain naming the replayed head (the replay itself carries no epoch:
// docs/ordering.md). The replay writes the unpark request
// (fanout.RequestUnpark) that the partition's owner applies.
func TestMigrateFromPerSubscriptionDurablesWithAParkedStream(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level: consumer processes of both engines, waits of seconds")
	}
	t.Parallel()
	const (
		streams   = 10
		perStream = 20
		events    = streams * perStream
		head      = 23 // order-3's version 2: refused (422) by the receiver in phase 1
		parkedAt  = head % streams
	)
	b := setupJetStream(t)
	rc := newUpgradeReceiver(t, streams)
	rc.slowAbove = events + 2*streams // never slow
	rc.refused = map[int]bool{head: true}
	cfg := filepath.Join(t.TempDir(), "subscriptions.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: ordered, filter_subjects: [events.>], url: %q, ordering: stream, on_dead_letter: park, secrets_env: [JSBRIDGE_SECRET], allow_private: true, start: all, max_deliver: -1, backoff: [100ms], timeout: 2s, ack_wait: 5s}
`, rc.URL+pathOrdered), 0o600))
	url := b.srv.ClientURL()
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", url, "--config", cfg, "--ops-addr", "", "--partitions", "8", "--lease-ttl", "2s", "--log-level", "info"}
	startConsumer := func(env []string) *proc {
		p := startProc(t, env, "consumer", args...)
		require.True(t, waitFor(30*time.Second, func() bool { return strings.Contains(p.out.String(), "consumer started") }), "consumer started:\n%s", p.out.String())
		return p
	}
	held := perStream - 2 // order-3's versions 2 (the head) and on
	notHeld := func(id int) bool { return id%streams != parkedAt || id < head }

	// Phase 1: the old engine dead-letters the head and parks its stream.
	old := startConsumer(append(env, "JSBRIDGE_ENGINE=durables")) // whatever engine the suite runs the others on
	upgradePublish(t, b, 1, events, streams)
	require.True(t, waitFor(60*time.Second, func() bool { return rc.ackedCount(pathOrdered) == events-held }),
		"the old engine delivers every event but the parked stream's from its head: %d of %d\n%s", rc.ackedCount(pathOrdered), events-held, old.out.String())
	require.NoError(t, old.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-old.exited:
		require.NoError(t, old.err, "the old engine's graceful stop:\n%s", old.out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the old engine did not stop within 30 s of SIGTERM:\n%s", old.out.String())
	}

	var applied struct {
		Plan struct {
			Subscriptions []struct {
				Asides []struct {
					State string `json:"state"`
					Head  string `json:"head"`
				} `json:"asides"`
			} `json:"subscriptions"`
		} `json:"plan"`
	}
	migrateJSON(t, &applied, "--nats-url", url, "--partitions", "8")
	require.Len(t, applied.Plan.Subscriptions, 1)
	require.Len(t, applied.Plan.Subscriptions[0].Asides, 1)
	require.Equal(t, "parked", applied.Plan.Subscriptions[0].Asides[0].State)
	require.Equal(t, strconv.Itoa(head), applied.Plan.Subscriptions[0].Asides[0].Head)

	// Phase 2: the shared engine holds the parked stream, and delivers
	// the other streams' next events.
	rc.setPhase(2)
	shared := startConsumer(append(env, "JSBRIDGE_ENGINE=shared"))
	upgradePublish(t, b, events+1, events+streams, streams)
	if !waitFor(60*time.Second, func() bool { return rc.ackedCount(pathOrdered) == events-held+streams-1 }) {
		t.Fatalf("the shared engine delivers the other streams' next events: %d of %d\n%s", rc.ackedCount(pathOrdered), events-held+streams-1, shared.out.String())
	}
	rc.mu.Lock()
	for id := range rc.acked[pathOrdered] {
		if !notHeld(id) {
			t.Errorf("event %d of the parked stream order-%d delivered before its head was replayed", id, parkedAt)
		}
	}
	rc.mu.Unlock()

	// The head replayed: the stream is released.
	out, err := cli(t, append(env, "JSBRIDGE_ENGINE=shared"), "consumer", "dlq", "replay", "--nats-url", url, "--config", cfg, "--all")
	require.NoError(t, err, out)
	require.Contains(t, out, "1 replayed, 0 failed")
	if !waitFor(30*time.Second, func() bool { return rc.ackedCount(pathOrdered) == events+streams }) {
		t.Fatalf("after dlq replay of its head, the parked stream order-%d is delivered: %d of %d events acknowledged (missing %v)\n%s",
			parkedAt, rc.ackedCount(pathOrdered), events+streams, rc.missing(pathOrdered, events+streams), shared.out.String())
	}
	require.Empty(t, rc.chainProblems(perStream+1), "the version chain across the upgrade and the replay")
}

// A stream the old engine set aside (its head refused with 503s, four of
// its events queued behind it) moves as a stuck aside from the refused
// head: the shared engine reads it again from there, and delivers the
// whole stream in order, its chain unbroken across the upgrade.
func TestMigrateFromPerSubscriptionDurablesWithAStreamSetAside(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level: consumer processes of both engines, waits of seconds")
	}
	t.Parallel()
	const (
		streams   = 10
		perStream = 20
		events    = streams * perStream
		head      = 23 // order-3's version 2: answered 503 in phase 1
		stuckAt   = head % streams
		held      = perStream - 2
	)
	b := setupJetStream(t)
	rc := newUpgradeReceiver(t, streams)
	rc.slowAbove = events // never slow
	rc.unavailable = map[int]bool{head: true}
	cfg := filepath.Join(t.TempDir(), "subscriptions.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: ordered, filter_subjects: [events.>], url: %q, ordering: stream, secrets_env: [JSBRIDGE_SECRET], allow_private: true, start: all, max_deliver: -1, backoff: [100ms], timeout: 2s, ack_wait: 5s}
`, rc.URL+pathOrdered), 0o600))
	url := b.srv.ClientURL()
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", url, "--config", cfg, "--ops-addr", "", "--partitions", "8", "--lease-ttl", "2s", "--log-level", "info"}
	startConsumer := func(env []string) *proc {
		p := startProc(t, env, "consumer", args...)
		require.True(t, waitFor(30*time.Second, func() bool { return strings.Contains(p.out.String(), "consumer started") }), "consumer started:\n%s", p.out.String())
		return p
	}

	// Phase 1: the old engine sets the stream aside.
	old := startConsumer(append(env, "JSBRIDGE_ENGINE=durables"))
	upgradePublish(t, b, 1, events, streams)
	asideSet := func() bool {
		kv, err := b.js.KeyValue(b.ctx, wire.DefaultParkBucket)
		if err != nil {
			return false
		}
		keys, err := kv.ListKeysFiltered(b.ctx, wire.AsideFilter("ordered"))
		if err != nil {
			return false
		}
		n := 0
		for range keys.Keys() {
			n++
		}
		return n == 1
	}
	require.True(t, waitFor(60*time.Second, func() bool { return rc.ackedCount(pathOrdered) == events-held && asideSet() }),
		"the old engine delivers every other stream and sets order-%d aside: %d of %d\n%s", stuckAt, rc.ackedCount(pathOrdered), events-held, old.out.String())
	require.NoError(t, old.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-old.exited:
		require.NoError(t, old.err, "the old engine's graceful stop:\n%s", old.out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the old engine did not stop within 30 s of SIGTERM:\n%s", old.out.String())
	}

	var applied struct {
		Plan struct {
			Subscriptions []struct {
				Asides []struct {
					State string `json:"state"`
					From  uint64 `json:"from"`
				} `json:"asides"`
			} `json:"subscriptions"`
		} `json:"plan"`
	}
	migrateJSON(t, &applied, "--nats-url", url, "--partitions", "8")
	require.Len(t, applied.Plan.Subscriptions, 1)
	require.Len(t, applied.Plan.Subscriptions[0].Asides, 1)
	require.Equal(t, "stuck", applied.Plan.Subscriptions[0].Asides[0].State)
	require.Equal(t, uint64(head), applied.Plan.Subscriptions[0].Asides[0].From, "read again from the refused head (event id = sequence here)")

	// Phase 2: the shared engine reads the stream again from its head.
	rc.setPhase(2)
	shared := startConsumer(append(env, "JSBRIDGE_ENGINE=shared"))
	if !waitFor(60*time.Second, func() bool { return rc.ackedCount(pathOrdered) == events }) {
		t.Fatalf("the shared engine delivers the stream set aside: %d of %d events acknowledged (missing %v)\n%s",
			rc.ackedCount(pathOrdered), events, rc.missing(pathOrdered, events), shared.out.String())
	}
	require.Empty(t, rc.chainProblems(perStream), "the version chain across the upgrade")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Empty(t, rc.bad, "requests that did not verify")
	require.Empty(t, rc.resent[pathOrdered], "nothing acknowledged to the old engine sent again")
}
