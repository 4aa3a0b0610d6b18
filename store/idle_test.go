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

// An append that makes a caught-up stream pending notifies only while a
// drainer waits for notifications (holds the idle lock): Idle takes the
// lock (the drainer is then to claim once more), Busy lets go of it.
func TestAppendNotifiesOnlyWhileADrainerIsIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := listenOnly(t, b.store.Schema())
	notifications(t, b.store)

	b.appendN(t, "idle-1", 1)
	require.False(t, l.notified(t, b.pool), "no drainer idle")

	ready, err := b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.False(t, ready, "the lock just taken: claim once more")
	ready, err = b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.True(t, ready, "held: wait")
	b.appendN(t, "idle-2", 1)
	require.True(t, l.notified(t, b.pool), "a drainer idle")

	require.NoError(t, b.store.Busy(b.ctx))
	b.appendN(t, "idle-3", 1)
	require.False(t, l.notified(t, b.pool), "the drainer busy again")
	require.NoError(t, b.store.Busy(b.ctx), "busy twice")
}

// An appender that sent no notification holds the idle lock shared until
// it commits, so a drainer cannot go idle past an append it would not see:
// Idle reports not ready after its pauses (claim again), and takes the
// lock once the append has committed, when a claim sees its event.
func TestIdleWaitsForAppendersThatSentNoNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	notifications(t, b.store)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.store.AppendTx(b.ctx, tx, "open-1", store.AnyVersion, ev("E", `{}`))
	require.NoError(t, err)

	ready, err := b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.False(t, ready, "an appender holds the lock shared: claim again")
	ready, err = b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.False(t, ready, "still not taken")

	require.NoError(t, tx.Commit(b.ctx))
	ready, err = b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.False(t, ready, "taken now: claim once more")
	claims, err := b.store.Claim(b.ctx, "d1", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"open-1"}, claimedNames(claims), "the last claim sees the append")
	ready, err = b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.True(t, ready)
}

// With two drainers, the one that finds the idle lock taken by the other
// may wait at once: appends notify every listener while the other holds
// it. Once the holder's session ends, the lock is free again.
func TestIdleWithAnotherDrainerHoldingTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other, err := store.New(b.pool, store.WithSchema(b.store.Schema()))
	require.NoError(t, err)
	ctx, stopOther := context.WithCancel(b.ctx)
	_, err = other.Notifications(ctx)
	require.NoError(t, err)
	ready, err := other.Idle(b.ctx)
	require.NoError(t, err)
	require.False(t, ready)

	notes := notifications(t, b.store)
	ready, err = b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.True(t, ready, "another drainer holds the lock: wait")
	b.appendN(t, "two-1", 1)
	select {
	case <-notes:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification while the other drainer is idle")
	}

	stopOther() // its listening session ends, and its lock with it
	require.Eventually(t, func() bool {
		ready, err := b.store.Idle(b.ctx)
		return err == nil && !ready
	}, 10*time.Second, 10*time.Millisecond, "the lock was not taken after the other drainer stopped")
}

// Without Notifications open there is nothing to hold the lock on: Idle
// says wait (the drain polls), Busy does nothing.
func TestIdleWithoutNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ready, err := b.store.Idle(b.ctx)
	require.NoError(t, err)
	require.True(t, ready)
	require.NoError(t, b.store.Busy(b.ctx))
}
