package main

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// A subscription managed through the CLI while two replicas run: added,
// it delivers new events within a second, from both replicas; its secret
// rotated mid-stream, every request verifies with the secret in force (a
// replica never goes back to the old one); paused, nothing is delivered
// and nothing is lost; deleted, its positions are gone. The log
// prints the time from each change to its effect on both replicas.
func TestSubscriptionManagedAtRuntimeOnTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two consumer replicas and waits for deliveries")
	}
	t.Parallel()
	k := newRuntimeKit(t)
	s1, s1File := k.secretFile(t, "s1")
	s2, s2File := k.secretFile(t, "s2")
	rc := newRecorder(t, s1, s2)
	k.replica(t, "r1")
	k.replica(t, "r2")

	// Added: the events published right after the add are delivered, from
	// the add on (the add's default start: the next sequence).
	added := time.Now()
	require.NoError(t, k.cli(t, "add", "orders", "--url", rc.srv.URL, "--filter", "events.order.>", "--secret-file", s1File, "--allow-private"))
	n := 0
	next := func() string {
		n++
		return k.publish(t, n, fmt.Sprintf("order-%d", n%16))
	}
	// The replicas claim the partitions first (the lease and positions
	// buckets): well under a second here, several seconds under -race on
	// two busy cores.
	firstWithin := 5 * time.Second
	if raceDetector {
		firstWithin = 30 * time.Second
	}
	id := next()
	require.Eventually(t, func() bool { _, ok := rc.first(id); return ok }, firstWithin, 5*time.Millisecond, "first event delivered within %s", firstWithin)
	g, _ := rc.first(id)
	t.Logf("add -> first delivery: %s", g.at.Sub(added).Round(time.Millisecond))

	// Both replicas share it: keep publishing until each delivered some.
	require.Eventually(t, func() bool {
		id := next()
		require.Eventually(t, func() bool { _, ok := rc.first(id); return ok }, 5*time.Second, 2*time.Millisecond)
		replicas := map[string]bool{}
		for _, g := range rc.all() {
			replicas[g.replica] = true
		}
		return replicas["r1"] && replicas["r2"]
	}, 20*time.Second, 10*time.Millisecond, "both replicas deliver")
	// A new event, after the subscription runs on both: within 1 s (the
	// race detector slows everything several times: 5 s there).
	within := time.Second
	if raceDetector {
		within = 5 * time.Second
	}
	var slowest time.Duration
	for range 8 {
		pub := time.Now()
		id := next()
		require.Eventually(t, func() bool { _, ok := rc.first(id); return ok }, within, 2*time.Millisecond, "delivered within %s", within)
		g, _ := rc.first(id)
		slowest = max(slowest, g.at.Sub(pub))
	}
	t.Logf("publish -> delivery, slowest of 8: %s", slowest.Round(time.Millisecond))

	// Secret rotated mid-stream: one event at a time, until both replicas
	// signed with the new secret.
	rotated := time.Now()
	require.NoError(t, k.cli(t, "update", "orders", "--secret-file", s2File))
	applied := map[string]time.Time{}
	require.Eventually(t, func() bool {
		id := next()
		require.Eventually(t, func() bool { _, ok := rc.first(id); return ok }, 5*time.Second, 2*time.Millisecond)
		g, _ := rc.first(id)
		if _, ok := applied[g.replica]; !ok && g.signedWith == 1 {
			applied[g.replica] = g.at
		}
		return len(applied) == 2
	}, 20*time.Second, time.Millisecond, "both replicas sign with the new secret")
	t.Logf("secret update -> signing with it on both replicas: r1 %s, r2 %s (an upper bound: events are sent one at a time)",
		applied["r1"].Sub(rotated).Round(time.Millisecond), applied["r2"].Sub(rotated).Round(time.Millisecond))
	newOn := map[string]bool{}
	for _, g := range rc.all() {
		require.NotEqual(t, -1, g.signedWith, "event %s verifies with neither secret", g.id)
		if g.signedWith == 1 {
			newOn[g.replica] = true
		}
		require.False(t, newOn[g.replica] && g.signedWith == 0, "event %s from %s signed with the old secret after the new one", g.id, g.replica)
	}

	// Paused: once both replicas stopped (every partition's record has a
	// paused cursor for it), nothing is delivered; resumed, every event
	// comes once.
	paused := time.Now()
	require.NoError(t, k.cli(t, "pause", "orders"))
	require.Eventually(t, func() bool {
		parts, err := consumer.ReadSharedPositions(k.ctx, k.js)
		require.NoError(t, err)
		for _, p := range parts {
			if p.Cursors["orders"].State != "paused" {
				return false
			}
		}
		return len(parts) == consumer.DefaultPartitions
	}, 10*time.Second, 5*time.Millisecond, "both replicas stop")
	t.Logf("pause -> stopped on both replicas: %s", time.Since(paused).Round(time.Millisecond))
	var held []string
	for range 10 {
		held = append(held, next())
	}
	require.Never(t, func() bool {
		for _, id := range held {
			if rc.count(id) > 0 {
				return true
			}
		}
		return false
	}, time.Second, 20*time.Millisecond, "a paused subscription delivers nothing")
	resumed := time.Now()
	require.NoError(t, k.cli(t, "resume", "orders"))
	require.Eventually(t, func() bool {
		for _, id := range held {
			if rc.count(id) == 0 {
				return false
			}
		}
		return true
	}, 15*time.Second, 5*time.Millisecond, "every event held while paused is delivered")
	t.Logf("resume -> held events delivered: %s", time.Since(resumed).Round(time.Millisecond))
	for _, id := range held {
		require.Equal(t, 1, rc.count(id), "event %s delivered once", id)
	}

	// Deleted: no partition record or cursor names it any more.
	deleted := time.Now()
	require.NoError(t, k.cli(t, "delete", "orders"))
	require.Eventually(t, func() bool {
		parts, err := consumer.ReadSharedPositions(k.ctx, k.js)
		require.NoError(t, err)
		for _, p := range parts {
			_, member := p.Record.Members["orders"]
			_, ahead := p.Record.Ahead["orders"]
			_, cursor := p.Cursors["orders"]
			if member || ahead || cursor {
				return false
			}
			for _, r := range p.Record.Retries {
				if r.Sub == "orders" {
					return false
				}
			}
		}
		return len(parts) > 0
	}, 15*time.Second, 10*time.Millisecond, "its positions are deleted")
	t.Logf("delete -> positions gone: %s", time.Since(deleted).Round(time.Millisecond))
	err := k.cli(t, "get", "orders")
	require.ErrorIs(t, err, consumer.ErrSubscriptionNotFound)
}

// Two operators updating one subscription from the same revision at once:
// one wins, the other gets a conflict naming the revision, and the bucket
// holds a valid subscription (one of the two versions).
func TestSubscriptionConcurrentUpdatesConflict(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	_, sFile := k.secretFile(t, "s")
	require.NoError(t, k.cli(t, "add", "billing", "--url", "https://hooks.example.com/in", "--filter", "events.invoice.>", "--secret-file", sFile))
	store, err := consumer.OpenSubscriptionStore(k.ctx, k.js, consumer.SubscriptionStoreConfig{})
	require.NoError(t, err)
	cur, err := store.Get(k.ctx, "billing")
	require.NoError(t, err)
	rev := fmt.Sprint(cur.Revision)

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			errs[i] = k.cli(t, "update", "billing", "--revision", rev, "--max-in-flight", fmt.Sprint(10+i))
		})
	}
	wg.Wait()
	var won int
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		require.ErrorIs(t, err, consumer.ErrConflict)
		require.ErrorContains(t, err, "revision "+rev)
	}
	require.Equal(t, 1, won, "one update wins")
	after, err := store.Get(k.ctx, "billing")
	require.NoError(t, err)
	require.Contains(t, []int{10, 11}, after.MaxInFlight)
	require.Greater(t, after.Revision, cur.Revision)

	// The bucket holds a valid subscription (read back with the key).
	keys, err := readKeys(k.keyFile)
	require.NoError(t, err)
	full, err := store.WithKeys(keys).Get(k.ctx, "billing")
	require.NoError(t, err)
	require.NoError(t, full.Validate())

	// An invalid change is refused, naming the field and the value, and
	// leaves it as it was.
	err = k.cli(t, "update", "billing", "--filter", "events..x")
	require.ErrorIs(t, err, consumer.ErrInvalidConfig)
	require.ErrorContains(t, err, `FilterSubjects[0]: "events..x"`)
	again, err := store.Get(k.ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, after.Revision, again.Revision)
}

func readKeys(path string) (*consumer.SecretsKeyring, error) {
	f := storeFlags{SecretsKeyFile: path}
	return f.needKeyring()
}
