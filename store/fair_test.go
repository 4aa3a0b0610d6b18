package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// Claims take streams in the order they became due: a stream's oldest
// unforwarded event, or the end of its backoff.

// insertAt is the application appending one event with an explicit created
// time (one statement, so the trigger runs as for any append).
func (b bundle) insertAt(t *testing.T, stream string, version int64, created time.Time) event.Event {
	t.Helper()
	e := event.Event{Stream: stream, Version: version}
	require.NoError(t, b.pool.QueryRow(b.ctx, "INSERT INTO "+b.store.Schema()+
		".events (stream, version, name, data, created) VALUES ($1, $2, 'Happened', '{}', $3) RETURNING id",
		stream, version, created).Scan(&e.ID))
	return e
}

// claimEach claims up to n streams (a one-minute lease) and returns their
// names.
func claimEach(t *testing.T, s *store.Store, n int) []string {
	t.Helper()
	claims, err := s.Claim(t.Context(), "a", n, time.Minute)
	require.NoError(t, err)
	return claimedNames(claims)
}

func pendingSince(t *testing.T, b bundle, stream string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, store.Fold(b.ctx, b.store))
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT pending_since FROM "+b.store.Schema()+".streams WHERE stream = $1", stream).Scan(&at))
	return at
}

// an hour ago, at Postgres's precision.
func base() time.Time { return time.Now().Add(-time.Hour).Truncate(time.Microsecond).UTC() }

func TestClaimServesOldestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t0 := base()
	minute := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	// Made pending in an order unlike their age, so neither insertion nor
	// heap order can pass for age order.
	first := map[string]event.Event{}
	for _, k := range []int{3, 0, 5, 1, 4, 2} {
		s := "s-" + string(rune('0'+k))
		first[s] = b.insertAt(t, s, 0, minute(k))
	}
	// A later event of a pending stream does not change its rank.
	b.insertAt(t, "s-0", 1, minute(30))
	require.Equal(t, t0, pendingSince(t, b, "s-0").UTC())

	require.ElementsMatch(t, []string{"s-0", "s-1"}, claimEach(t, b.store, 2))
	require.ElementsMatch(t, []string{"s-2", "s-3"}, claimEach(t, b.store, 2))
	// s-0 forwards its first event: it now ranks by its second (minute 30),
	// behind every other stream. s-2 and s-3 are given back and keep their
	// rank.
	require.NoError(t, b.store.Ack(b.ctx, "a", "s-0", 0, first["s-0"].ID))
	require.Equal(t, minute(30), pendingSince(t, b, "s-0").UTC())
	require.NoError(t, b.store.Ack(b.ctx, "a", "s-1", 0, first["s-1"].ID))
	require.NoError(t, b.store.Release(b.ctx, "a", []string{"s-2", "s-3"}))

	require.ElementsMatch(t, []string{"s-2", "s-3"}, claimEach(t, b.store, 2))
	require.ElementsMatch(t, []string{"s-4", "s-5"}, claimEach(t, b.store, 2))
	require.Equal(t, []string{"s-0"}, claimEach(t, b.store, 2))
	require.Empty(t, claimEach(t, b.store, 2))

	// A caught-up stream made pending again ranks by its new event.
	require.NoError(t, b.store.Ack(b.ctx, "a", "s-2", 0, first["s-2"].ID))
	b.insertAt(t, "s-2", 1, minute(40))
	require.Equal(t, minute(40), pendingSince(t, b, "s-2").UTC())
}

// A stream ranks, once its backoff ends, by when it ended: behind the
// streams that were waiting already (even though its own event is older),
// ahead of those that became pending later.
func TestClaimRanksAStreamOutOfBackoffByWhenItBecameDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t0 := base()
	b.insertAt(t, "retried-1", 0, t0)
	w1 := b.insertAt(t, "waiting-1", 0, t0.Add(time.Minute))
	w2 := b.insertAt(t, "waiting-2", 0, t0.Add(2*time.Minute))

	require.Equal(t, []string{"retried-1"}, claimEach(t, b.store, 1))
	// A backoff of 0: due again at once, at the retry's time.
	require.NoError(t, b.store.Retry(b.ctx, "a", "retried-1", -1, 0, 0, "receiver down"))
	later := b.appendN(t, "later-1", 1)[0]

	var order []string
	for {
		got := claimEach(t, b.store, 1)
		if len(got) == 0 {
			break
		}
		order = append(order, got...)
	}
	require.Equal(t, []string{"waiting-1", "waiting-2", "retried-1", "later-1"}, order)
	for _, e := range []event.Event{w1, w2, later} {
		require.NoError(t, b.store.Ack(b.ctx, "a", e.Stream, e.Version, e.ID))
	}

	// In backoff it stays out; due, it goes where its due time puts it:
	// here between two streams waiting since before and after.
	b.insertAt(t, "waiting-3", 0, t0.Add(3*time.Minute))
	b.insertAt(t, "waiting-4", 0, t0.Add(5*time.Minute))
	require.NoError(t, b.store.Retry(b.ctx, "a", "retried-1", -1, 0, time.Hour, "receiver down"))
	require.ElementsMatch(t, []string{"waiting-3", "waiting-4"}, claimEach(t, b.store, 10))
	require.NoError(t, b.store.Release(b.ctx, "a", []string{"waiting-3", "waiting-4"}))
	// The backoff ended at minute 4 (the clock cannot be moved; the due
	// time can).
	_, err := b.pool.Exec(b.ctx, "UPDATE "+b.store.Schema()+".streams SET next_attempt = $1 WHERE stream = 'retried-1'", t0.Add(4*time.Minute))
	require.NoError(t, err)
	order = nil
	for range 3 {
		order = append(order, claimEach(t, b.store, 1)...)
	}
	require.Equal(t, []string{"waiting-3", "retried-1", "waiting-4"}, order)
}

// Upgrading a schema that has pending streams: migration 004 gives each the
// time of its oldest unforwarded event.
func TestMigrationGivesPendingStreamsTheirOldestEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t0 := base()
	b.insertAt(t, "newer-1", 0, t0.Add(10*time.Minute))
	b.insertAt(t, "older-1", 0, t0)
	b.insertAt(t, "older-1", 1, t0.Add(20*time.Minute))
	// Back to the schema before 004 (the column, its index and the record),
	// with the rows the appends made then (migration 009's markers taken in).
	require.NoError(t, store.Fold(b.ctx, b.store))
	sch := b.store.Schema()
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE `+sch+`.streams DROP COLUMN pending_since;
CREATE INDEX streams_pending_idx ON `+sch+`.streams (next_attempt NULLS FIRST) WHERE head > watermark AND NOT blocked;
DELETE FROM `+sch+`.jsbridge_migrations WHERE version = 4`)
	require.NoError(t, err)

	require.NoError(t, b.store.Migrate(b.ctx))
	require.Equal(t, t0, pendingSince(t, b, "older-1").UTC())
	require.Equal(t, t0.Add(10*time.Minute), pendingSince(t, b, "newer-1").UTC())
	require.Equal(t, []string{"older-1"}, claimEach(t, b.store, 1))
	var old bool
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT to_regclass($1) IS NOT NULL", sch+".streams_pending_idx").Scan(&old))
	require.False(t, old, "the old claim index is dropped")
}

// Discovery in an external events table sets the same rank: a new stream
// from its oldest event, a caught-up stream from its first event past the
// watermark.
func TestDiscoverRanksStreamsByOldestEvent(t *testing.T) {
	t.Parallel()
	b := setupExternal(t)
	t0 := base()
	insertAt := func(stream string, version int64, created time.Time) int64 {
		var id int64
		require.NoError(t, b.pool.QueryRow(b.ctx, "INSERT INTO "+b.appTable+
			" (stream, version, name, data, created) VALUES ($1, $2, 'Happened', '{}', $3) RETURNING id",
			stream, version, created).Scan(&id))
		return id
	}
	since := func(stream string) time.Time {
		var at time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT pending_since FROM "+b.store.Schema()+".streams WHERE stream = $1", stream).Scan(&at))
		return at.UTC()
	}
	insertAt("b-1", 0, t0.Add(5*time.Minute))
	a0 := insertAt("a-1", 0, t0)
	insertAt("c-1", 0, t0.Add(time.Minute))
	insertAt("c-1", 1, t0.Add(30*time.Minute))
	_, err := b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Equal(t, t0, since("a-1"))
	require.Equal(t, t0.Add(time.Minute), since("c-1"), "the oldest of the stream's events found")

	claims, err := b.store.Claim(b.ctx, "a", 1, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"a-1"}, claimedNames(claims))
	require.NoError(t, b.store.Ack(b.ctx, "a", "a-1", 0, a0))

	// a-1 caught up, then pending again with an event older than b-1's.
	insertAt("a-1", 1, t0.Add(2*time.Minute))
	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Equal(t, t0.Add(2*time.Minute), since("a-1"))

	var order []string
	for range 3 {
		claims, err := b.store.Claim(b.ctx, "a", 1, time.Minute)
		require.NoError(t, err)
		order = append(order, claimedNames(claims)...)
	}
	require.Equal(t, []string{"c-1", "a-1", "b-1"}, order)
}

// With an external events table the migration neither reads nor changes
// it: its part for the bridge's own table (the exact times, the trigger) is
// left out, and streams already pending rank by the migration's time, ahead
// of anything discovered later.
func TestMigrationWithExternalTableRanksPendingStreamsByMigrationTime(t *testing.T) {
	t.Parallel()
	b := setupExternal(t)
	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.appTable+" (stream, version, name, data) VALUES ('old-1', 0, 'E', '{}')")
	require.NoError(t, err)
	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	sch := b.store.Schema()
	_, err = b.pool.Exec(b.ctx, `ALTER TABLE `+sch+`.streams DROP COLUMN pending_since;
DELETE FROM `+sch+`.jsbridge_migrations WHERE version = 4`)
	require.NoError(t, err)

	stmts := b.store.MigrationSQL()
	all := strings.Join(stmts, "\n")
	require.Contains(t, all, "pending_since")
	require.NotContains(t, all, "jsbridge_events_inserted")
	require.NotContains(t, all, "jsbridge:own-events-table")

	before := time.Now()
	require.NoError(t, b.store.Migrate(b.ctx))
	var at time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT pending_since FROM "+sch+".streams WHERE stream = 'old-1'").Scan(&at))
	require.WithinRange(t, at, before.Add(-time.Second), time.Now().Add(time.Second))

	_, err = b.pool.Exec(b.ctx, "INSERT INTO "+b.appTable+" (stream, version, name, data) VALUES ('new-1', 0, 'E', '{}')")
	require.NoError(t, err)
	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	claims, err := b.store.Claim(b.ctx, "a", 1, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"old-1"}, claimedNames(claims))
}
