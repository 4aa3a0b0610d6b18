package lifecycle_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/internal/lifecycle/lifecycletest"
)

// part is a Part whose run waits for its context; runs counts the runs
// under way, opens the openings.
type part struct {
	life  lifecycle.Service
	open  func(context.Context) error
	runs  atomic.Int32
	opens atomic.Int32
}

func (p *part) Start(ctx context.Context) error {
	return p.life.Start(ctx, func(ctx context.Context) error {
		p.opens.Add(1)
		if p.open != nil {
			return p.open(ctx)
		}
		return nil
	}, func(ctx context.Context) error {
		if p.runs.Add(1) != 1 {
			panic("two runs at once")
		}
		defer p.runs.Add(-1)
		<-ctx.Done()
		return context.Cause(ctx)
	})
}

func (p *part) Stop()                    { p.life.Stop() }
func (p *part) Started() <-chan struct{} { return p.life.Started() }
func (p *part) Stopped() <-chan struct{} { return p.life.Stopped() }

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestServiceStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	p := &part{}
	p.Stop() // nothing to stop
	require.NoError(t, p.Start(context.Background()))
	<-p.life.Started()
	p.Stop()
	require.True(t, isClosed(p.Stopped()))
	require.Zero(t, p.runs.Load())
	p.Stop() // again
	require.ErrorIs(t, p.life.Err(), context.Canceled)
}

func TestServiceSecondStartIsNoOp(t *testing.T) {
	t.Parallel()
	p := &part{}
	require.NoError(t, p.Start(context.Background()))
	require.NoError(t, p.Start(context.Background()))
	require.Equal(t, int32(1), p.opens.Load())
	p.Stop()
}

func TestServiceRestartsAfterStop(t *testing.T) {
	t.Parallel()
	p := &part{}
	require.NoError(t, p.Start(context.Background()))
	first := p.Stopped()
	p.Stop()
	require.NoError(t, p.Start(context.Background()))
	require.True(t, isClosed(first))
	require.False(t, isClosed(p.Stopped()), "a new run has a new Stopped")
	p.Stop()
	require.True(t, isClosed(p.Stopped()))
}

func TestServiceStoppedBeforeStartIsTheFirstRunsEnd(t *testing.T) {
	t.Parallel()
	p := &part{}
	stopped, started := p.Stopped(), p.life.Started()
	require.NoError(t, p.Start(context.Background()))
	<-started
	require.False(t, isClosed(stopped))
	p.Stop()
	require.True(t, isClosed(stopped))
}

func TestServiceFailedOpenLeavesItStopped(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	p := &part{open: func(context.Context) error { return boom }}
	require.ErrorIs(t, p.Start(context.Background()), boom)
	require.True(t, isClosed(p.Stopped()))
	require.True(t, isClosed(p.life.Started()))
	require.Zero(t, p.runs.Load())
	p.Stop()
	p.open = nil
	require.NoError(t, p.Start(context.Background()), "Start again after a failed opening")
	p.Stop()
}

func TestServiceStopEndsTheOpening(t *testing.T) {
	t.Parallel()
	opening := make(chan struct{})
	p := &part{open: func(ctx context.Context) error {
		close(opening)
		<-ctx.Done()
		return ctx.Err()
	}}
	errc := make(chan error, 1)
	go func() { errc <- p.Start(context.Background()) }()
	<-opening
	p.Stop()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.True(t, isClosed(p.Stopped()))
	require.Zero(t, p.runs.Load())
}

func TestServiceRunOutlivesStartsContext(t *testing.T) {
	t.Parallel()
	p := &part{}
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, p.Start(ctx))
	cancel()
	<-p.life.Started()
	require.False(t, isClosed(p.Stopped()), "ctx bounds the opening only")
	p.Stop()
}

// order is a Part that notes its Start and Stop in a log.
type order struct {
	name string
	log  *[]string
	fail bool
	life lifecycle.Service
}

func (o *order) Start(ctx context.Context) error {
	if o.fail {
		return errors.New(o.name + " failed")
	}
	*o.log = append(*o.log, "start "+o.name)
	return o.life.Start(ctx, nil, func(ctx context.Context) error { <-ctx.Done(); return nil })
}

func (o *order) Stop() {
	o.life.Stop()
	*o.log = append(*o.log, "stop "+o.name)
}

func (o *order) Stopped() <-chan struct{} { return o.life.Stopped() }
func (o *order) Started() <-chan struct{} { return o.life.Started() }

func TestStartAllStopAllReverseOrder(t *testing.T) {
	t.Parallel()
	var log []string
	a, b, c := &order{name: "a", log: &log}, &order{name: "b", log: &log}, &order{name: "c", log: &log}
	require.NoError(t, lifecycle.StartAll(context.Background(), a, b, c))
	lifecycle.StopAll(a, b, c)
	require.Equal(t, []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}, log)

	log = nil
	c.fail = true
	require.Error(t, lifecycle.StartAll(context.Background(), a, b, c))
	require.Equal(t, []string{"start a", "start b", "stop b", "stop a"}, log)
}

func TestServiceStress(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := &part{}
	lifecycletest.Stress(t, context.Background(), p, 200, 16)
	require.Zero(t, p.runs.Load())
}

func TestServiceRunInTheForeground(t *testing.T) {
	t.Parallel()
	var s lifecycle.Service
	ran := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- s.Run(context.Background(), nil, func(ctx context.Context) error {
			close(ran)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-ran
	require.ErrorIs(t, s.Run(context.Background(), nil, nil), lifecycle.ErrAlreadyStarted)
	s.Stop()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.True(t, isClosed(s.Stopped()))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Run(ctx, nil, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }), context.Canceled, "ctx ends a foreground run")
}
