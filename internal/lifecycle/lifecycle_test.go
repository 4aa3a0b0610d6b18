package lifecycle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/lifecycle"
)

var errMine = errors.New("mine: already started")

// untilStopped is a run that blocks until its context ends, then returns
// result.
func untilStopped(result error) lifecycle.Step {
	return func(ctx context.Context) error {
		<-ctx.Done()
		return result
	}
}

func TestStopBeforeStartIsNoOp(t *testing.T) {
	t.Parallel()
	r := lifecycle.New(nil)
	require.NoError(t, r.Stop(context.Background()))
	// Still startable afterwards.
	require.NoError(t, r.Start(context.Background(), nil, untilStopped(nil)))
	require.NoError(t, r.Stop(context.Background()))
}

func TestSecondStartFails(t *testing.T) {
	t.Parallel()
	r := lifecycle.New(errMine)
	require.NoError(t, r.Start(context.Background(), nil, untilStopped(nil)))
	require.ErrorIs(t, r.Start(context.Background(), nil, untilStopped(nil)), errMine)
	require.ErrorIs(t, r.Run(context.Background(), nil, untilStopped(nil)), errMine)
	require.NoError(t, r.Stop(context.Background()))
	// Stopped is not restartable: a Runner runs once.
	require.ErrorIs(t, r.Start(context.Background(), nil, untilStopped(nil)), errMine)
}

func TestDefaultAlreadyStarted(t *testing.T) {
	t.Parallel()
	r := lifecycle.New(nil)
	require.NoError(t, r.Start(context.Background(), nil, untilStopped(nil)))
	require.ErrorIs(t, r.Start(context.Background(), nil, untilStopped(nil)), lifecycle.ErrAlreadyStarted)
	require.NoError(t, r.Stop(context.Background()))
}

func TestDoubleStopReturnsTheRunsResult(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	r := lifecycle.New(nil)
	require.NoError(t, r.Start(context.Background(), nil, untilStopped(boom)))
	require.ErrorIs(t, r.Stop(context.Background()), boom)
	require.ErrorIs(t, r.Stop(context.Background()), boom)
}

func TestStopWaitsForTheRunWithTheCallersContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	returned := make(chan struct{})
	r := lifecycle.New(nil)
	require.NoError(t, r.Start(context.Background(), nil, func(ctx context.Context) error {
		<-ctx.Done()
		<-release // a slow shutdown
		close(returned)
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := r.Stop(ctx)
	require.ErrorIs(t, err, context.Canceled, "Stop gives up with its ctx")
	select {
	case <-returned:
		t.Fatal("the run returned before it was released")
	default:
	}
	close(release)
	require.NoError(t, r.Stop(context.Background()), "a later Stop waits for the run")
	<-returned
}

func TestFailedSetupLeavesUnstarted(t *testing.T) {
	t.Parallel()
	bad := errors.New("provision failed")
	r := lifecycle.New(nil)
	ran := false
	err := r.Start(context.Background(), func(context.Context) error { return bad }, func(context.Context) error {
		ran = true
		return nil
	})
	require.ErrorIs(t, err, bad)
	require.False(t, ran)
	require.NoError(t, r.Stop(context.Background()))
	// A retry of Start works.
	require.NoError(t, r.Start(context.Background(), func(context.Context) error { return nil }, untilStopped(nil)))
	require.NoError(t, r.Stop(context.Background()))
}

func TestStopDuringSetupCancelsIt(t *testing.T) {
	t.Parallel()
	r := lifecycle.New(nil)
	inSetup := make(chan struct{})
	startErr := make(chan error, 1)
	go func() {
		startErr <- r.Start(context.Background(), func(ctx context.Context) error {
			close(inSetup)
			<-ctx.Done() // waiting for a dependency, until stopped
			return ctx.Err()
		}, untilStopped(nil))
	}()
	<-inSetup
	require.NoError(t, r.Stop(context.Background()))
	require.ErrorIs(t, <-startErr, context.Canceled)
}

func TestRunInForeground(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	r := lifecycle.New(nil)
	running := make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- r.Run(context.Background(), nil, func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			return boom
		})
	}()
	<-running
	require.ErrorIs(t, r.Stop(context.Background()), boom, "Stop ends a foreground Run")
	require.ErrorIs(t, <-runErr, boom)
}

func TestCallerContextEndsTheRun(t *testing.T) {
	t.Parallel()
	r := lifecycle.New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	require.NoError(t, r.Start(ctx, nil, func(ctx context.Context) error {
		<-ctx.Done()
		close(done)
		return nil
	}))
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end with the caller's context")
	}
	require.NoError(t, r.Stop(context.Background()))
}
