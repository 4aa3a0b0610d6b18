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
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/internal/migrate/migratetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// upgradeReceiver is the endpoint of both subscriptions of the upgrade
// tests (path /ordered and /unordered) in phase 2, the shared engine's:
// it verifies every request's signature, answers 204, and records per
// path which event ids it acknowledged and in which phase, which ids it
// acknowledged in phase 1 and was sent again in phase 2, and for the
// ordered path every acknowledged request's place in its stream's
// version chain (version, the previous version it names, its lease
// epoch). Phase 1 is the old engine's, played by migratetest: seed
// records what it says the endpoint acknowledged then. Event id i is
// version (i-1)/streams of stream i mod streams (upgradePublish).
type upgradeReceiver struct {
	*httptest.Server
	streams int

	mu     sync.Mutex
	acked  map[string]map[int]int  // path → id → phase it was first acknowledged in
	resent map[string]map[int]bool // path → ids acknowledged in phase 1 and received in phase 2
	links  map[int][]chainLink     // ordered: stream → acknowledged requests, in order
	bad    []string                // signature failures and malformed requests
}

// chainLink is one acknowledged ordered request.
type chainLink struct {
	version  int
	previous string
	epoch    uint64
	phase    int
}

const (
	pathOrdered   = "/ordered"
	pathUnordered = "/unordered"
	// oldEpoch is the lease epoch counter the old layout holds, and the
	// epoch its ordered webhooks carried.
	oldEpoch = 41
)

func newUpgradeReceiver(t *testing.T, streams int) *upgradeReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	rc := &upgradeReceiver{streams: streams,
		acked:  map[string]map[int]int{pathOrdered: {}, pathUnordered: {}},
		resent: map[string]map[int]bool{pathOrdered: {}, pathUnordered: {}},
		links:  map[int][]chainLink{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		path := r.URL.Path
		id, idErr := strconv.Atoi(r.Header.Get(wire.HeaderIdempotencyKey))
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if err := v.Verify(r.Header, body); err != nil || idErr != nil || rc.acked[path] == nil {
			rc.bad = append(rc.bad, fmt.Sprintf("%s %s: signature %v, id %v", path, r.Header.Get(wire.HeaderIdempotencyKey), err, idErr))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if rc.acked[path][id] == 1 {
			rc.resent[path][id] = true
		}
		if _, ok := rc.acked[path][id]; !ok {
			rc.acked[path][id] = 2
		}
		if path == pathOrdered {
			epoch, err := strconv.ParseUint(r.Header.Get(wire.HeaderLeaseEpoch), 10, 64)
			if err != nil && r.Header.Get(wire.HeaderLeaseEpoch) != "" {
				rc.bad = append(rc.bad, fmt.Sprintf("ordered %d: lease epoch %q", id, r.Header.Get(wire.HeaderLeaseEpoch)))
			}
			s := id % rc.streams
			rc.links[s] = append(rc.links[s], chainLink{version: (id - 1) / rc.streams, previous: r.Header.Get(wire.HeaderPreviousVersion), epoch: epoch, phase: 2})
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// seed records what the endpoint acknowledged in phase 1 on path: the
// events the old engine sent it, with the chain an ordered one named.
func (rc *upgradeReceiver) seed(t *testing.T, path string, sent []migratetest.Sent) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, s := range sent {
		id, err := strconv.Atoi(s.ID)
		require.NoError(t, err)
		rc.acked[path][id] = 1
		if path == pathOrdered {
			rc.links[id%rc.streams] = append(rc.links[id%rc.streams], chainLink{version: int(s.Version), previous: s.Previous, epoch: s.Epoch, phase: 1})
		}
	}
}

// ackedCount is how many distinct ids path acknowledged.
func (rc *upgradeReceiver) ackedCount(path string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.acked[path])
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

// oldLayout builds, on b's events stream, the frame of the layout the
// durables engine left (migratetest): the copy for 8 partitions, the
// park bucket holding the lease epoch counter oldEpoch, the DLQ.
func oldLayout(t *testing.T, b *jsBundle) *migratetest.Layout {
	t.Helper()
	l, err := migratetest.New(b.ctx, b.js, migratetest.Config{Partitions: 8, Epoch: oldEpoch})
	require.NoError(t, err)
	return l
}

// oldDurable is the old engine's consumers' settings for the endpoint
// rc.URL+path: AckWait 5 s, and a failing event Nak'd for 100 ms (the
// subscription's backoff).
func oldDurable(rc *upgradeReceiver, path string) migratetest.Durable {
	return migratetest.Durable{Endpoint: rc.URL + path, AckWait: 5 * time.Second, NakDelay: 100 * time.Millisecond}
}

// startShared starts `consumer run` (the shared engine) with args, and
// waits for its start line.
func startShared(t *testing.T, env, args []string) *proc {
	t.Helper()
	p := startProc(t, env, "consumer", args...)
	require.True(t, waitFor(60*time.Second, func() bool { return strings.Contains(p.out.String(), "consumer started") }), "consumer started:\n%s", p.out.String())
	return p
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
// process by process. Phase 1 is the layout the old engine left
// (migratetest: its code is gone) after delivering an ordered and an
// unordered subscription part of a stream of events and being stopped:
// the unordered durable with three failing events pending below events
// it acked, and its last sixteen in flight; the ordered subscription's
// streams accepted up to event 600, a quarter of them (the slower ones)
// only up to 400 with their next event in flight, so that the others
// settle above the partition floors (the delivered records). A cleanup
// tried while an old replica heartbeats, before the migration, is
// refused; consumer migrate plans (--dry-run) and applies the move;
// consumer run (the shared engine) delivers the rest; consumer migrate
// --cleanup deletes the old layout while it runs, and it goes on. No
// event is lost on either subscription; the ordered one's streams are
// acknowledged in version order, each version once, every request
// naming the version acknowledged before it and the lease epoch never
// going back (the old layout's counter is carried over), across the
// upgrade; and the events acknowledged in phase 1 that the shared engine
// sends again are exactly those the plan counted as re-sent, per
// subscription (none for the ordered one).
//
// With --read-pending the migration reads the unordered durable's
// pending set back, and then nothing acknowledged in phase 1 is sent
// again: a cursor the migration wrote with Above entries past its
// partition record's floor rejoins the shared read only once the head
// passed them (fanout's rejoin), not at once from the floor.
func TestMigrateFromPerSubscriptionDurables(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level: consumer processes, waits of seconds")
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
		delivered = 700                 // published before the old engine stopped, and pulled by it
		more      = 5 * streams         // published after the cleanup
	)
	b := setupJetStream(t)
	rc := newUpgradeReceiver(t, streams)
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

	// Phase 1: what the old engine left.
	upgradePublish(t, b, 1, delivered, streams)
	l := oldLayout(t, b)
	slower := func(id int) bool { return id%streams%4 == 3 }
	sent, err := l.DeliverOrdered(b.ctx, "ordered", oldDurable(rc, pathOrdered), func(ev migratetest.Event) migratetest.Outcome {
		id, _ := strconv.Atoi(ev.ID)
		if id > 600 || slower(id) && id > 400 {
			return migratetest.InFlight
		}
		return migratetest.Accepted
	})
	require.NoError(t, err)
	rc.seed(t, pathOrdered, sent)
	sent, err = l.Deliver(b.ctx, "unordered", oldDurable(rc, pathUnordered), delivered, func(ev migratetest.Event) migratetest.Outcome {
		switch id, _ := strconv.Atoi(ev.ID); {
		case id == 50 || id == 150 || id == 250:
			return migratetest.Failing
		case id > delivered-16:
			return migratetest.InFlight
		}
		return migratetest.Accepted
	})
	require.NoError(t, err)
	rc.seed(t, pathUnordered, sent)
	upgradePublish(t, b, delivered+1, events, streams)
	orderedBefore, unorderedBefore := rc.ackedCount(pathOrdered), rc.ackedCount(pathUnordered)
	t.Logf("the old engine stopped with %d ordered and %d unordered events acknowledged of %d", orderedBefore, unorderedBefore, events)
	require.Less(t, orderedBefore, events, "stopped with ordered events still to deliver")
	require.Less(t, unorderedBefore, events, "stopped with unordered events still to deliver")

	// An old replica still running (its heartbeat renewed), before the
	// migration: the cleanup is refused.
	beat, stopBeat := context.WithCancel(b.ctx)
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		for beat.Err() == nil {
			_ = l.Leases(beat, 2*time.Second, "ordered", "old-1")
			select {
			case <-beat.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var early struct {
		Cleanup struct {
			Refusals []string `json:"refusals"`
		} `json:"cleanup"`
		Deleted bool `json:"deleted"`
	}
	_, _, err = migrateRun(t, &early, "--nats-url", url, "--cleanup")
	stopBeat()
	<-beating
	require.Error(t, err, "a cleanup while an old replica runs, before the migration, is refused")
	require.False(t, early.Deleted)
	refusals := strings.Join(early.Cleanup.Refusals, "\n")
	require.Contains(t, refusals, "the migration was not applied")
	require.Contains(t, refusals, "a replica of the old engine still runs")
	leases, err := b.js.KeyValue(b.ctx, wire.DefaultLeaseBucket)
	require.NoError(t, err)
	require.NoError(t, leases.Purge(b.ctx, legacy.MemberKey("ordered", "old-1")), "its graceful stop deletes its heartbeat")

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
	shared := startShared(t, env, args)
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
	require.Equal(t, legacy.CopyStream(wire.DefaultEventsStream), cleanup.Cleanup.Copy)
	require.Len(t, cleanup.Cleanup.PartitionConsumers, 8)
	require.Equal(t, legacy.ParkBucket, cleanup.Cleanup.ParkBucket, "the park bucket, left empty, goes")
	_, err = b.js.KeyValue(b.ctx, legacy.ParkBucket)
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound)
	_, err = b.js.Stream(b.ctx, legacy.CopyStream(wire.DefaultEventsStream))
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
		t.Skip("process-level: consumer processes, waits of seconds")
	}
	t.Parallel()
	const (
		streams   = 10
		perStream = 20
		events    = streams * perStream
		head      = 23 // order-3's version 2: refused (422) in phase 1
		parkedAt  = head % streams
	)
	b := setupJetStream(t)
	rc := newUpgradeReceiver(t, streams)
	cfg := filepath.Join(t.TempDir(), "subscriptions.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: ordered, filter_subjects: [events.>], url: %q, ordering: stream, on_dead_letter: park, secrets_env: [JSBRIDGE_SECRET], allow_private: true, start: all, max_deliver: -1, backoff: [100ms], timeout: 2s, ack_wait: 5s}
`, rc.URL+pathOrdered), 0o600))
	url := b.srv.ClientURL()
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", url, "--config", cfg, "--ops-addr", "", "--partitions", "8", "--lease-ttl", "2s", "--log-level", "info"}
	held := perStream - 2 // order-3's versions 2 (the head) and on
	notHeld := func(id int) bool { return id%streams != parkedAt || id < head }

	// Phase 1: the old engine dead-lettered the head and parked its
	// stream; it delivered every other event.
	upgradePublish(t, b, 1, events, streams)
	l := oldLayout(t, b)
	sent, err := l.DeliverOrdered(b.ctx, "ordered", oldDurable(rc, pathOrdered), func(ev migratetest.Event) migratetest.Outcome {
		if ev.ID == strconv.Itoa(head) {
			return migratetest.Refused
		}
		return migratetest.Accepted
	})
	require.NoError(t, err)
	require.Len(t, sent, events-held)
	rc.seed(t, pathOrdered, sent)

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
	shared := startShared(t, env, args)
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
	out, err := cli(t, env, "consumer", "dlq", "replay", "--nats-url", url, "--config", cfg, "--all")
	require.NoError(t, err, out)
	require.Contains(t, out, "1 replayed, 0 failed")
	if !waitFor(30*time.Second, func() bool { return rc.ackedCount(pathOrdered) == events+streams }) {
		t.Fatalf("after dlq replay of its head, the parked stream order-%d is delivered: %d of %d events acknowledged (missing %v)\n%s",
			parkedAt, rc.ackedCount(pathOrdered), events+streams, rc.missing(pathOrdered, events+streams), shared.out.String())
	}
	require.Empty(t, rc.chainProblems(perStream+1), "the version chain across the upgrade and the replay")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Empty(t, rc.bad, "requests that did not verify")
	require.Empty(t, rc.resent[pathOrdered], "nothing acknowledged to the old engine sent again")
}

// A stream the old engine set aside (its head refused with 503s, its
// later events acked out behind an aside record) moves as a stuck aside
// from the refused head: the shared engine reads it again from there,
// and delivers the whole stream in order, its chain unbroken across the
// upgrade.
func TestMigrateFromPerSubscriptionDurablesWithAStreamSetAside(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level: consumer processes, waits of seconds")
	}
	t.Parallel()
	const (
		streams   = 10
		perStream = 20
		events    = streams * perStream
		head      = 23 // order-3's version 2: answered 503 in phase 1
		held      = perStream - 2
	)
	b := setupJetStream(t)
	rc := newUpgradeReceiver(t, streams)
	cfg := filepath.Join(t.TempDir(), "subscriptions.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: ordered, filter_subjects: [events.>], url: %q, ordering: stream, secrets_env: [JSBRIDGE_SECRET], allow_private: true, start: all, max_deliver: -1, backoff: [100ms], timeout: 2s, ack_wait: 5s}
`, rc.URL+pathOrdered), 0o600))
	url := b.srv.ClientURL()
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", url, "--config", cfg, "--ops-addr", "", "--partitions", "8", "--lease-ttl", "2s", "--log-level", "info"}

	// Phase 1: the old engine retried the head in place and set its
	// stream's later events aside; it delivered every other event.
	upgradePublish(t, b, 1, events, streams)
	l := oldLayout(t, b)
	sent, err := l.DeliverOrdered(b.ctx, "ordered", oldDurable(rc, pathOrdered), func(ev migratetest.Event) migratetest.Outcome {
		if ev.ID == strconv.Itoa(head) {
			return migratetest.SetAside
		}
		return migratetest.Accepted
	})
	require.NoError(t, err)
	require.Len(t, sent, events-held)
	rc.seed(t, pathOrdered, sent)
	parkKeys, err := l.Park.ListKeys(b.ctx)
	require.NoError(t, err)
	var asides int
	for k := range parkKeys.Keys() {
		if strings.HasPrefix(k, "aside.ordered.") {
			asides++
		}
	}
	require.Equal(t, 1, asides, "one aside record")

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
	shared := startShared(t, env, args)
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
