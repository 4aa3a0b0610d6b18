package startup_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/startup"
)

// logBuffer is a log destination written and read concurrently.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newWaiter(timeout time.Duration) (*startup.Waiter, *logBuffer) {
	logs := &logBuffer{}
	w := startup.New(slog.New(slog.NewTextHandler(logs, nil)), timeout)
	w.SetBackoff(time.Millisecond, 5*time.Millisecond)
	return w, logs
}

func TestForRetriesUntilSuccessLoggingEachAttemptOnce(t *testing.T) {
	t.Parallel()
	w, logs := newWaiter(0)
	calls := 0
	err := w.For(context.Background(), "Postgres at db:5432", func(context.Context) error {
		calls++
		if calls < 4 {
			return errors.New("connection refused")
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 4, calls)
	require.Equal(t, 3, strings.Count(logs.String(), `msg="waiting for Postgres at db:5432" error="connection refused"`), logs.String())
	require.Contains(t, logs.String(), "Postgres at db:5432 is available")
}

func TestForReturnsPermanentErrorsAtOnce(t *testing.T) {
	t.Parallel()
	w, _ := newWaiter(0)
	bad := errors.New("password authentication failed")
	calls := 0
	err := w.For(context.Background(), "Postgres", func(context.Context) error {
		calls++
		return startup.Permanent(bad)
	})
	require.ErrorIs(t, err, bad)
	require.True(t, startup.IsPermanent(err))
	require.Equal(t, 1, calls)
	require.Nil(t, startup.Permanent(nil))
	require.False(t, startup.IsPermanent(bad))
}

func TestForGivesUpAtTheStartupTimeoutNamingWhatIsMissing(t *testing.T) {
	t.Parallel()
	w, _ := newWaiter(200 * time.Millisecond)
	start := time.Now()
	err := w.For(context.Background(), "NATS at nats://127.0.0.1:4222", func(ctx context.Context) error {
		select {
		case <-ctx.Done(): // an attempt that hangs ends at the deadline
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
			return errors.New("no servers available for connection")
		}
	})
	require.ErrorIs(t, err, startup.ErrTimeout)
	require.ErrorContains(t, err, "--startup-timeout 200ms passed while still waiting for NATS at nats://127.0.0.1:4222: no servers available for connection")
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestForStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	w, _ := newWaiter(0)
	w.SetBackoff(time.Hour, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	err := w.For(ctx, "NATS", func(context.Context) error { return errors.New("down") })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, startup.IsPermanent(err))
	require.Less(t, time.Since(start), 2*time.Second, "a stop during a pause ends it")
}

func TestCheckNamesTheStepWaitedForUntilReady(t *testing.T) {
	t.Parallel()
	w, _ := newWaiter(0)
	ctx := context.Background()
	require.EqualError(t, w.Check(ctx), "starting")

	first := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		calls := 0
		done <- w.For(ctx, "JetStream stream EVENTS", func(context.Context) error {
			calls++
			if calls == 1 {
				close(first)
				return errors.New("stream not found")
			}
			<-release
			return nil
		})
	}()
	<-first
	require.Eventually(t, func() bool {
		err := w.Check(ctx)
		return err != nil && err.Error() == "waiting for JetStream stream EVENTS: stream not found"
	}, 5*time.Second, time.Millisecond)
	close(release)
	require.NoError(t, <-done)
	require.EqualError(t, w.Check(ctx), "starting", "between steps")
	w.Ready()
	require.NoError(t, w.Check(ctx))
}
