package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/store"
)

// notifications opens s's Notifications for the test's life.
func notifications(t *testing.T, s *store.Store) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := s.Notifications(ctx)
	require.NoError(t, err)
	return ch
}

// received reports whether notes receives a value within 10 seconds.
func received(notes <-chan struct{}) bool {
	select {
	case _, ok := <-notes:
		return ok
	case <-time.After(10 * time.Second):
		return false
	}
}

// drainNotes empties notes of what earlier appends sent.
func drainNotes(notes <-chan struct{}) {
	for {
		select {
		case <-notes:
		default:
			return
		}
	}
}

// An append that makes a caught-up stream pending notifies only while a
// drainer waits for notifications (holds the idle lock): Idle takes the
// lock (the drainer is then to claim once more), Busy lets go of it.
func TestAppendNotifiesOnlyWhileADrainerIsIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := listenOnly(t, b.store.Schema())
	notes := notifications(t, b.store)

	b.appendN(t, "idle-1", 1)
	require.False(t, l.notified(t, b.pool), "no drainer idle")

	ready, err := b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready, "the lock just taken: claim once more")
	ready, err = b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.True(t, ready, "held: wait")
	b.appendN(t, "idle-2", 1)
	require.True(t, l.notified(t, b.pool), "a drainer idle")

	require.NoError(t, b.store.Busy(b.ctx, notes))
	b.appendN(t, "idle-3", 1)
	require.False(t, l.notified(t, b.pool), "the drainer busy again")
	require.NoError(t, b.store.Busy(b.ctx, notes), "busy twice")
}

// An appender that sent no notification holds the idle lock shared until
// it commits, so a drainer cannot go idle past an append it would not see:
// Idle waits in the lock's queue for a while, then reports not ready
// (claim again); it takes the lock once the append has committed, when a
// claim sees its event. While Idle waits in the queue, appends notify.
func TestIdleWaitsForAppendersThatSentNoNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	notes := notifications(t, b.store)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.store.AppendTx(b.ctx, tx, "open-1", store.AnyVersion, ev("E", `{}`))
	require.NoError(t, err)

	ready, err := b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready, "an appender holds the lock shared: claim again")
	ready, err = b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready, "still not taken")

	require.NoError(t, tx.Commit(b.ctx))
	ready, err = b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready, "taken now: claim once more")
	claims, err := b.store.Claim(b.ctx, "d1", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"open-1"}, claimedNames(claims), "the last claim sees the append")
	ready, err = b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.True(t, ready)
}

// Two drains on one Store each have their own listening session and idle
// state: the first to go idle takes the lock, the second finds it held by
// the other and may wait at once, since appends then notify every
// listener, both of them. One drain's Busy does not let go of the lock
// the other holds. Once the holder's listening session ends, the other
// takes the lock.
func TestTwoDrainersOnOneStoreEachHaveTheirIdleState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctxA, stopA := context.WithCancel(b.ctx)
	t.Cleanup(stopA)
	notesA, err := b.store.Notifications(ctxA)
	require.NoError(t, err)
	notesB := notifications(t, b.store)

	ready, err := b.store.Idle(b.ctx, notesA)
	require.NoError(t, err)
	require.False(t, ready, "A takes the lock: claim once more")
	ready, err = b.store.Idle(b.ctx, notesB)
	require.NoError(t, err)
	require.True(t, ready, "A holds the lock: B waits at once")
	require.NoError(t, b.store.Busy(b.ctx, notesB), "B holds nothing to let go of")

	drainNotes(notesA)
	drainNotes(notesB)
	b.appendN(t, "two-1", 1)
	require.True(t, received(notesA), "A idle: the append notified A")
	require.True(t, received(notesB), "and B, listening too")

	stopA() // A's listening session ends, and its lock with it
	for range notesA {
	}
	_, err = b.store.Idle(b.ctx, notesA)
	require.ErrorIs(t, err, store.ErrNotListening, "A's listener has ended")
	require.Eventually(t, func() bool {
		ready, err := b.store.Idle(b.ctx, notesB)
		return err == nil && !ready
	}, 10*time.Second, 10*time.Millisecond, "B did not take the lock after A's session ended")
	drainNotes(notesB)
	b.appendN(t, "two-2", 1)
	require.True(t, received(notesB), "B idle: the append notified B")
}

// Once its Notifications context ends, Idle on that channel returns
// ErrNotListening at once rather than waiting for an answer no one will
// give; Busy has no lock to let go of and returns nil.
func TestIdleErrorsWhenItsListenerStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, stop := context.WithCancel(b.ctx)
	notes, err := b.store.Notifications(ctx)
	require.NoError(t, err)
	ready, err := b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready)

	stop()
	for range notes {
	}
	for range 3 {
		ask, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		_, err = b.store.Idle(ask, notes)
		cancel()
		require.ErrorIs(t, err, store.ErrNotListening)
		require.NoError(t, b.store.Busy(b.ctx, notes))
	}
}

// A request already handed to a listener whose loop then ends is answered
// with ErrNotListening, not left waiting: the listener is stopped while
// Idle waits in the lock's queue behind an appender.
func TestIdleAnsweredWhenItsListenerStopsMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, stop := context.WithCancel(b.ctx)
	notes, err := b.store.Notifications(ctx)
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.store.AppendTx(b.ctx, tx, "open-1", store.AnyVersion, ev("E", `{}`))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		// No deadline of its own: only the listener's end answers it.
		_, err := b.store.Idle(context.WithoutCancel(b.ctx), notes)
		done <- err
	}()
	stop()
	select {
	case err := <-done:
		// Either the statement was cut by the listener's context, or the
		// loop had ended before it ran: an error either way.
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Idle still waits after its listener stopped")
	}
}

// Without Notifications open there is nothing to hold the lock on: Idle
// says so with ErrNotListening (the drain polls), Busy does nothing.
func TestIdleWithoutNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.store.Idle(b.ctx, nil)
	require.ErrorIs(t, err, store.ErrNotListening)
	require.NoError(t, b.store.Busy(b.ctx, nil))
}

// When the listening connection is killed (pg_terminate_backend), Idle
// reports ErrNotListening while the store reconnects, however often the
// drain asks meanwhile (each ask is answered at once and does not put the
// reconnection off); then the channel receives a value, and Idle takes
// the lock again on the new session, where appends notify it.
func TestIdleLockTakenAgainAfterTheListeningConnectionDrops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	notes := notifications(t, b.store)
	ready, err := b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready, "taken")

	var killed int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.objid = (hashtextextended('jsbridge idle ' || $1, 0) & 4294967295)::oid`, b.store.Schema()).Scan(&killed))
	require.Equal(t, 1, killed, "the listening session holding the idle lock")

	// A drain polling every 5 ms asks that often; the first pause before
	// reconnecting is 250ms.
	require.Eventually(t, func() bool {
		_, err := b.store.Idle(b.ctx, notes)
		return err != nil
	}, 10*time.Second, 5*time.Millisecond, "Idle never failed while the session was down")
	require.Eventually(t, func() bool {
		ready, err := b.store.Idle(b.ctx, notes)
		return err == nil && !ready
	}, 10*time.Second, 5*time.Millisecond, "the idle lock was not taken again on a new session")
	drainNotes(notes)
	b.appendN(t, "after-1", 1)
	require.True(t, received(notes), "the new session is notified")
}
