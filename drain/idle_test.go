package drain_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// With the Postgres store as its IdleNotifier, an idle Run holds the idle
// lock, so an append wakes it; once it works without waiting (here: it
// lingers) it lets go of the lock and appends send no notification; idle
// again, it takes the lock back before it waits.
func TestRunNotifiedOnlyWhileIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := pgx.Connect(b.ctx, jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(b.ctx, "LISTEN "+b.schema)
	require.NoError(t, err)
	// The marker goes on a channel of its own, which the drain does not
	// listen on: on the drain's channel a marker delivered late (a loaded
	// machine) would wake Run after the test expected it to wait.
	// Postgres delivers a session's notifications in commit order across
	// its channels, so the marker still orders against the trigger's.
	marker := b.schema + "_marker"
	_, err = conn.Exec(b.ctx, `LISTEN "`+marker+`"`)
	require.NoError(t, err)
	// notified reports whether anything notified the drain's channel since
	// the last call: a marker sent now comes first exactly when nothing did.
	notified := func() bool {
		t.Helper()
		_, err := conn.Exec(b.ctx, "SELECT pg_notify($1, 'marker')", marker)
		require.NoError(t, err)
		sent := false
		for {
			ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			n, err := conn.WaitForNotification(ctx)
			cancel()
			require.NoError(t, err)
			if n.Channel == marker {
				return sent
			}
			sent = true
		}
	}

	rec := newRecorder(nil)
	const linger, poll = 7 * time.Hour, time.Hour
	clock := newWaitClock()
	d := b.drain(t, rec, drain.Config{Linger: linger, PollInterval: poll, Clock: clock, Notifier: b.store})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Equal(t, poll, clock.next(t), "nothing to claim: Run waits")
	b.appendN(t, "idle-1", 1)
	require.Equal(t, linger, clock.next(t), "woken by the append's notification, Run lingers")
	require.Equal(t, 1, rec.count())
	require.True(t, notified(), "the append while Run waited")

	b.appendN(t, "idle-2", 1)
	require.False(t, notified(), "an append while Run works")
	clock.Advance(linger)
	require.Equal(t, linger, clock.next(t))
	require.Equal(t, 2, rec.count(), "the claim after the linger took it")

	clock.Advance(linger)
	require.Equal(t, poll, clock.next(t), "nothing to claim: Run waits again")
	b.appendN(t, "idle-3", 1)
	require.Equal(t, linger, clock.next(t), "woken again")
	require.Equal(t, 3, rec.count())
}

// Two Runs on one Store (as two bridges in one process) each have their
// own listening session and idle state: with a poll of an hour, only
// notifications wake them, and every append is forwarded promptly, one at
// a time and in a burst, which both take part in.
func TestTwoRunsOnOneStoreBothDrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const poll = time.Hour
	recs := []*recorder{newRecorder(nil), newRecorder(nil)}
	total := func() int { return recs[0].count() + recs[1].count() }
	// The first Run handed a burst batch holds it until the other Run has
	// forwarded a burst event (10 s at most), so the burst shows each Run
	// taking appends while the other is busy, whichever wins the races of
	// the first part.
	var first atomic.Int32
	first.Store(-1)
	burstDone := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var burstOnce [2]sync.Once
	handler := func(i int) drain.Handler {
		return drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
			burst := slices.ContainsFunc(batches, func(bt drain.Batch) bool { return strings.HasPrefix(bt.Stream, "burst-") })
			if burst && first.CompareAndSwap(-1, int32(i)) {
				select {
				case <-burstDone[1-i]:
				case <-time.After(10 * time.Second):
				case <-ctx.Done():
				}
			}
			out := recs[i].Handle(ctx, batches)
			if burst {
				burstOnce[i].Do(func() { close(burstDone[i]) })
			}
			return out
		})
	}
	for i := range recs {
		d := b.drain(t, handler(i), drain.Config{Owner: fmt.Sprintf("run-%d", i), ClaimLimit: 1, PollInterval: poll, Notifier: b.store})
		ctx, cancel := context.WithCancel(b.ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}

	for i := range 30 {
		b.appendN(t, fmt.Sprintf("one-%d", i), 1)
		require.Eventually(t, func() bool { return total() == i+1 }, 10*time.Second, 5*time.Millisecond,
			"append %d not forwarded (a Run waits for a notification that never comes)", i)
	}

	const burst = 60
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < burst; i += 4 {
				b.appendN(t, fmt.Sprintf("burst-%d", i), 2)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return total() == 30+2*burst }, 10*time.Second, 5*time.Millisecond,
		"forwarded %d of %d", total(), 30+2*burst)
	require.Positive(t, recs[0].count(), "run-0 forwarded nothing")
	require.Positive(t, recs[1].count(), "run-1 forwarded nothing")
}

// failingIdler is an IdleNotifier whose Idle always fails, as the store's
// does while its listening session is down.
type failingIdler struct {
	notes chan struct{}
	idles atomic.Int32
}

func (f *failingIdler) Notifications(context.Context) (<-chan struct{}, error) { return f.notes, nil }

func (f *failingIdler) Idle(context.Context, <-chan struct{}) (bool, error) {
	f.idles.Add(1)
	return false, errors.New("no listening session")
}

func (f *failingIdler) Busy(context.Context, <-chan struct{}) error { return nil }

// logCount counts the records a logger receives that contain a text.
type logCount struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCount) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCount) count(text string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), text)
}

// When its IdleNotifier cannot say idle (an error: transient), Run is not
// stopped by it: it polls every PollInterval, finds what was appended, and
// logs the failure once for the run of them.
func TestRunPollsWhileTheIdleNotifierFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder(nil)
	const poll = time.Hour
	clock := newWaitClock()
	idler := &failingIdler{notes: make(chan struct{}, 1)}
	logs := &logCount{}
	d := b.drain(t, rec, drain.Config{PollInterval: poll, Clock: clock, Notifier: idler, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	for i := range 3 {
		require.Equal(t, poll, clock.next(t), "Idle failed: Run waits for its poll")
		b.appendN(t, fmt.Sprintf("poll-%d", i), 1)
		clock.Advance(poll)
		require.Eventually(t, func() bool { return rec.count() == i+1 }, 10*time.Second, 5*time.Millisecond, "the poll found the append")
	}
	require.Equal(t, poll, clock.next(t))
	require.GreaterOrEqual(t, idler.idles.Load(), int32(4))
	require.Equal(t, 1, logs.count("notifier cannot say idle"), "logged once for the run of failures")
}

// When the listening session holding the idle lock is killed
// (pg_terminate_backend), Run does not stall: with a poll of an hour, an
// append made while the session is down is forwarded once the store has
// listened again (the channel then receives a value), and the new session
// takes the lock again, so the next append notifies.
func TestRunRecoversWhenItsListeningSessionIsKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := jsbridgetest.Pool(t)
	rec := newRecorder(nil)
	d := b.drain(t, rec, drain.Config{PollInterval: time.Hour, Notifier: b.store})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const holder = `SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.objid = (hashtextextended('jsbridge idle ' || $1, 0) & 4294967295)::oid`
	holderPID := func() int {
		var pid int
		if err := pool.QueryRow(b.ctx, holder, b.schema).Scan(&pid); err != nil {
			return 0
		}
		return pid
	}
	var first int
	require.Eventually(t, func() bool { first = holderPID(); return first != 0 }, 10*time.Second, 5*time.Millisecond,
		"Run idle does not hold the idle lock")
	var killed bool
	require.NoError(t, pool.QueryRow(b.ctx, "SELECT pg_terminate_backend($1)", first).Scan(&killed))
	require.True(t, killed)

	b.appendN(t, "killed-1", 1)
	require.Eventually(t, func() bool { return rec.count() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the append made while the session was down was not forwarded")
	require.Eventually(t, func() bool { pid := holderPID(); return pid != 0 && pid != first }, 10*time.Second, 5*time.Millisecond,
		"the idle lock was not taken again on a new session")
	b.appendN(t, "killed-2", 1)
	require.Eventually(t, func() bool { return rec.count() == 2 }, 10*time.Second, 5*time.Millisecond,
		"the append after the new session took the lock was not forwarded")
}
