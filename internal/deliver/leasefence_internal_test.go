package deliver

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// ackMsg is a fakeMsg that counts what was sent for it.
type ackMsg struct {
	*fakeMsg
	acks, naks, inProgress atomic.Int32
}

func newAckMsg(seq uint64) *ackMsg { return &ackMsg{fakeMsg: newFakeMsg("order-1", 0, seq)} }

func (m *ackMsg) DoubleAck(context.Context) error { m.acks.Add(1); return nil }
func (m *ackMsg) Ack() error                      { m.acks.Add(1); return nil }
func (m *ackMsg) NakWithDelay(time.Duration) error {
	m.naks.Add(1)
	return nil
}
func (m *ackMsg) InProgress() error { m.inProgress.Add(1); return nil }

// fencedPartition is a testPartition on a fake clock with its lease
// deadline 3 s ahead and its NATS connection's status in status.
func fencedPartition(t *testing.T) (*partition, *clockwork.FakeClock, *atomic.Int32) {
	pt := testPartition(t, nil)
	clock := pt.clock.(*clockwork.FakeClock)
	var status atomic.Int32
	status.Store(int32(nats.CONNECTED))
	pt.lease.connStatus = func() nats.Status { return nats.Status(status.Load()) }
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second))
	return pt, clock, &status
}

// Past its lease deadline (on the engine's clock) a partition sends no
// InProgress and no Nak, and acks nothing; an ack waits for a late renewal
// and goes out then, or never once the partition is released.
func TestPartitionPastItsDeadlineAcksNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pt, clock, _ := fencedPartition(t)
	m := newAckMsg(10)
	require.NoError(t, pt.lease.inProgress(m))
	require.Equal(t, int32(1), m.inProgress.Load(), "before the deadline")

	clock.Advance(3 * time.Second)
	require.ErrorIs(t, pt.lease.inProgress(m), errLeasePassed)
	pt.lease.nak(pt.log, m)
	require.Equal(t, int32(1), m.inProgress.Load(), "no InProgress past the deadline")
	require.Zero(t, m.naks.Load(), "no Nak past the deadline")

	acked := make(chan struct{})
	go func() { pt.hol.ack(m, func() *slog.Logger { return pt.log }); close(acked) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the ack waits on the clock")
	require.Zero(t, m.acks.Load(), "no ack past the deadline")
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second)) // a late renewal
	clock.Advance(20 * time.Millisecond)
	<-acked
	require.Equal(t, int32(1), m.acks.Load(), "acked once the lease was renewed")

	clock.Advance(3 * time.Second)
	m2 := newAckMsg(11)
	done := make(chan struct{})
	go func() { pt.hol.ack(m2, func() *slog.Logger { return pt.log }); close(done) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	pt.release() // the lease was lost
	clock.Advance(20 * time.Millisecond)
	<-done
	require.Zero(t, m2.acks.Load(), "released past its deadline: never acked")
	pt.book.mu.Lock()
	defer pt.book.mu.Unlock()
	require.Equal(t, uint64(10), pt.book.lastDone["ordered.events.0.order.order-1"], "the first recorded settled, not the second")
}

// While the NATS connection is not connected no ack, Nak or InProgress is
// sent (nats.go would buffer it and flush it after the reconnect); the ack
// goes out once connected again.
func TestPartitionSendsNothingWhileDisconnected(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pt, clock, status := fencedPartition(t)
	m := newAckMsg(10)
	status.Store(int32(nats.RECONNECTING))
	require.ErrorIs(t, pt.lease.inProgress(m), errNotConnected)
	pt.lease.nak(pt.log, m)
	require.Zero(t, m.inProgress.Load()+m.naks.Load())
	acked := make(chan struct{})
	go func() { pt.hol.ack(m, func() *slog.Logger { return pt.log }); close(acked) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Zero(t, m.acks.Load(), "no ack while reconnecting")
	status.Store(int32(nats.CONNECTED))
	clock.Advance(20 * time.Millisecond)
	<-acked
	require.Equal(t, int32(1), m.acks.Load())
}

// fakeIter is a pull iterator that only records Stop.
type fakeIter struct {
	jetstream.MessagesContext
	stopped atomic.Bool
}

func (it *fakeIter) Stop() { it.stopped.Store(true) }

// fakeConsumer opens fakeIters and counts them.
type fakeConsumer struct {
	jetstream.Consumer
	mu     sync.Mutex
	opened int
}

func (c *fakeConsumer) Messages(...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opened++
	return &fakeIter{}, nil
}

// Past its lease deadline a partition stops its pull iterator and opens no
// new one until the lease is renewed: it pulls nothing.
func TestPartitionPastItsDeadlinePullsNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pt, clock, _ := fencedPartition(t)
	cons := &fakeConsumer{}
	pt.cons = cons
	pt.pullBatch = 16
	clock.Advance(3 * time.Second)
	old := &fakeIter{}
	stop := make(chan struct{})
	got := make(chan jetstream.MessagesContext, 1)
	go func() { got <- pt.pausePull(old, stop) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "waits for a renewal on the clock")
	require.True(t, old.stopped.Load(), "the iterator was stopped")
	select {
	case <-stop:
	default:
		t.Fatal("the reader was not stopped")
	}
	cons.mu.Lock()
	require.Zero(t, cons.opened, "no pull while past the deadline")
	cons.mu.Unlock()
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second))
	clock.Advance(20 * time.Millisecond)
	require.NotNil(t, <-got)
	cons.mu.Lock()
	require.Equal(t, 1, cons.opened, "pulling again after the renewal")
	cons.mu.Unlock()

	clock.Advance(3 * time.Second)
	go func() { got <- pt.pausePull(&fakeIter{}, make(chan struct{})) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	pt.release()
	require.Nil(t, <-got, "released while paused: no new iterator")
}

// A renewal that finds the lease taken ends it at once: before its old
// deadline, no ack, Nak or InProgress is sent and no attempt starts, an
// ack waiting goes back unsent, and a renewal answered late cannot bring
// the lease back.
func TestPartitionWhoseLeaseIsFoundTakenStopsAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pt, clock, _ := fencedPartition(t)
	m := newAckMsg(10)
	require.True(t, pt.lease.MayStart())

	pt.lease.Lose()
	pt.release()
	require.False(t, pt.lease.MayStart(), "no attempt starts")
	require.ErrorIs(t, pt.lease.inProgress(m), errLeasePassed)
	pt.lease.nak(pt.log, m)
	acked := make(chan struct{})
	go func() { pt.hol.ack(m, func() *slog.Logger { return pt.log }); close(acked) }()
	select {
	case <-acked:
	case <-ctx.Done():
		t.Fatal("the ack waited instead of giving up")
	}
	require.Zero(t, m.acks.Load()+m.naks.Load()+m.inProgress.Load(), "nothing sent, with 3 s of the old deadline left")

	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second)) // a renewal answered late
	require.False(t, pt.lease.MayStart(), "a lost lease stays lost")
	require.ErrorIs(t, pt.lease.mayAck(), errLeasePassed)
}

// failingDLQ is a dead-letter writer that always fails.
type failingDLQ struct{ calls atomic.Int32 }

func (d *failingDLQ) DeadLetter(context.Context, deadletter.Letter) error {
	d.calls.Add(1)
	return errors.New("DLQ stream unavailable")
}

// A dead letter retried in place while the DLQ fails gives its event
// back when the partition is released: with a Nak while the lease holds
// (a release to another replica), with nothing once the lease was found
// taken (lose): the new owner may have sent its successor already.
func TestDeadLetterRetriedWhenTheLeaseIsLostNaksNothing(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "released", true: "lost"}[lost], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pt, clock, _ := fencedPartition(t)
			dlq := &failingDLQ{}
			m, err := newMetrics(nil)
			require.NoError(t, err)
			pt.hol.r = &runner{sub: subscription.Subscription{Name: "orders"}, metrics: m, deadLetters: dlq, inFlight: m.inFlight.WithLabelValues("orders")}
			msg := newAckMsg(10)
			done := make(chan struct{})
			go func() {
				pt.hol.deadLetter(msg, pt.log, deadletter.Letter{EventID: "1042", Reason: "410"}, attempt.OutcomeTerm, attempt.ClassNone)
				close(done)
			}()
			require.NoError(t, clock.BlockUntilContext(ctx, 1), "the dead letter waits its backoff on the clock")
			require.Positive(t, dlq.calls.Load())
			if lost {
				pt.lease.Lose()
			}
			pt.release()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("the dead letter did not give up at the release")
			}
			require.Zero(t, msg.acks.Load(), "never acked")
			if lost {
				require.Zero(t, msg.naks.Load(), "the lease was lost: no Nak")
			} else {
				require.Equal(t, int32(1), msg.naks.Load(), "released with the lease held: Nak'd at once")
			}
		})
	}
}
