package integration

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// pauseGate is a drain.Handler around a Forwarder that, from its second
// call on, stops before publishing (as a bridge stopped by SIGSTOP or a
// long GC pause would) until released, then publishes and records what
// the Forwarder answered.
type pauseGate struct {
	fwd      *forward.Forwarder
	paused   chan struct{} // closed once a call is held
	release  chan struct{} // close to let it publish
	calls    int
	mu       sync.Mutex
	results  []drain.Result
	resumeAt time.Time
}

func (g *pauseGate) Handle(ctx context.Context, batches []drain.Batch) []drain.Result {
	g.calls++
	if g.calls == 1 {
		return g.fwd.Handle(ctx, batches)
	}
	close(g.paused)
	<-g.release
	// The pause outlived the cycle's deadline. A stopped process resumes
	// with its publish under way whatever its context says (the bytes go
	// out as it wakes); publishing under a fresh context shows what
	// JetStream does with them.
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.mu.Lock()
	g.resumeAt = time.Now()
	g.mu.Unlock()
	res := g.fwd.Handle(pctx, batches)
	g.mu.Lock()
	g.results = append(g.results, res...)
	g.mu.Unlock()
	return res
}

// reconcileLog is a drain.Handler that records each batch's Reconcile flag.
type reconcileLog struct {
	h  drain.Handler
	mu sync.Mutex
	rc []bool
}

func (l *reconcileLog) Handle(ctx context.Context, batches []drain.Batch) []drain.Result {
	l.mu.Lock()
	for _, b := range batches {
		l.rc = append(l.rc, b.Reconcile)
	}
	l.mu.Unlock()
	return l.h.Handle(ctx, batches)
}

// waitDuplicateWindowPassed returns once JetStream no longer remembers the
// Nats-Msg-Ids of the messages stored so far: a probe message stored now
// with a fresh id is published again until JetStream stores the copy
// instead of dropping it as a duplicate. It forgets ids in the order it
// stored them, so every earlier id is forgotten too.
func waitDuplicateWindowPassed(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	probe := nats.NewMsg("events.probe.probe-1.Probe")
	probe.Header.Set(wire.HeaderMsgID, "probe-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	probe.Data = []byte(`{}`)
	ack, err := js.PublishMsg(t.Context(), probe)
	require.NoError(t, err)
	require.False(t, ack.Duplicate)
	require.Eventually(t, func() bool {
		ack, err := js.PublishMsg(t.Context(), probe)
		require.NoError(t, err)
		return !ack.Duplicate
	}, 30*time.Second, 20*time.Millisecond, "the duplicate window never passed")
}

// streamVersions returns the ce-id and ce-streamversion of every message
// JetStream holds on stream's subjects, in stored order.
func streamVersions(t *testing.T, js jetstream.JetStream, stream string) (ids []string, versions []int64) {
	t.Helper()
	s, err := js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	prefix := strings.TrimSuffix(wire.StreamFilter(wire.DefaultEventsPrefix, stream), ">")
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		require.NoError(t, err)
		if !strings.HasPrefix(m.Subject, prefix) {
			continue
		}
		v, err := strconv.ParseInt(m.Header.Get(wire.HeaderStreamVersion), 10, 64)
		require.NoError(t, err)
		ids = append(ids, m.Header.Get(wire.HeaderID))
		versions = append(versions, v)
	}
	return ids, versions
}

// The zombie fence, end to end: bridge A claims a stream, fetches its new
// events and stops before publishing them, past its lease. Bridge B takes
// the stream over and publishes those events and the ones appended since.
// Once JetStream's duplicate window has passed (so dedup cannot help),
// A wakes up and publishes what it fetched: JetStream refuses it by
// Nats-Expected-Last-Subject-Sequence (A expects the stream's last message
// to be the one it stored itself), nothing is stored, A's settle is fenced
// off by the lost lease, and JetStream holds every event of the stream
// exactly once, in version order. Both publish paths: a fast batch (only
// its first message carries the expectation; gap: fail stores nothing
// after it) and one event at a time.
func TestBridgeZombieIsFencedBeyondTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast batch", false: "one at a time"}[batched], func(t *testing.T) {
			t.Parallel()
			pool := jsbridgetest.Pool(t)
			st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
			require.NoError(t, err)
			require.NoError(t, st.Migrate(t.Context()))
			srv := jsbridgetest.StartJetStream(t, embedded.Config{})
			_, js := jsbridgetest.Connect(t, srv)
			_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{
				Name: wire.DefaultEventsStream, Subjects: []string{"events.>"}, Storage: jetstream.FileStorage,
				Duplicates: 100 * time.Millisecond, AllowBatchPublish: batched,
			})
			require.NoError(t, err)
			appendN := func(n int) {
				evs := make([]store.NewEvent, n)
				for i := range evs {
					evs[i] = store.NewEvent{Name: "Happened", Data: []byte(`{}`)}
				}
				_, err := st.Append(t.Context(), "order-1", store.AnyVersion, evs...)
				require.NoError(t, err)
			}

			// Bridge A forwards versions 0..2 and knows where the stream
			// stands in JetStream.
			_, jsA := jsbridgetest.Connect(t, srv)
			fwdA, err := forward.New(jsA, forward.Config{Stream: wire.DefaultEventsStream})
			require.NoError(t, err)
			gate := &pauseGate{fwd: fwdA, paused: make(chan struct{}), release: make(chan struct{})}
			const leaseA = 2 * time.Second
			dA, err := drain.New(st, gate, drain.Config{Owner: "zombie", Lease: leaseA, Logger: discard()})
			require.NoError(t, err)
			appendN(3)
			stA, err := dA.Cycle(t.Context())
			require.NoError(t, err)
			require.Equal(t, 1, stA.Acked)

			// A claims versions 3..5 and stops before publishing them.
			appendN(3)
			claimedAt := time.Now()
			zombieDone := make(chan drain.Stats, 1)
			go func() {
				st, err := dA.Cycle(context.Background())
				if err != nil {
					t.Errorf("zombie cycle: %v", err)
				}
				zombieDone <- st
			}()
			<-gate.paused
			appendN(2) // the application goes on: versions 6, 7

			// B takes the stream over once A's lease has run out, and
			// forwards versions 3..7.
			_, jsB := jsbridgetest.Connect(t, srv)
			fwdB, err := forward.New(jsB, forward.Config{Stream: wire.DefaultEventsStream})
			require.NoError(t, err)
			logB := &reconcileLog{h: fwdB}
			dB, err := drain.New(st, logB, drain.Config{Owner: "successor", Lease: 10 * time.Second, Logger: discard()})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				_, err := dB.Cycle(t.Context())
				require.NoError(t, err)
				si, err := st.Streams(t.Context(), store.StreamFilter{Match: "^order-1$"})
				require.NoError(t, err)
				return si[0].Watermark == 7
			}, 30*time.Second, 20*time.Millisecond)
			require.GreaterOrEqual(t, time.Since(claimedAt), leaseA, "B got the stream only after A's lease")
			logB.mu.Lock()
			require.Equal(t, []bool{true}, logB.rc, "B's takeover reconciled")
			logB.mu.Unlock()

			// Past the duplicate window, A wakes up and publishes.
			waitDuplicateWindowPassed(t, js)
			close(gate.release)
			stA = <-zombieDone
			require.Equal(t, 1, stA.LeaseLost, "A's settle is fenced off: B holds the stream's watermark now")
			gate.mu.Lock()
			require.Len(t, gate.results, 1)
			res, resumedAt := gate.results[0], gate.resumeAt
			gate.mu.Unlock()
			require.Equal(t, 0, res.Done, "nothing of A's batch was stored")
			require.ErrorIs(t, res.Err, forward.ErrConflict, "refused by the expected-sequence fence, not dropped as duplicates")
			require.Equal(t, forward.ClassConflict, forward.ErrorClass(res.Err))

			ids, versions := streamVersions(t, js, "order-1")
			require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7}, versions, "every event once, in version order")
			seen := map[string]bool{}
			for _, id := range ids {
				require.False(t, seen[id], "event %s stored twice", id)
				seen[id] = true
			}
			si, err := st.Streams(t.Context(), store.StreamFilter{Match: "^order-1$"})
			require.NoError(t, err)
			require.Equal(t, int64(7), si[0].Watermark)
			require.Zero(t, si[0].Retry, "the zombie's failure was not counted against the stream")
			require.False(t, si[0].Blocked)
			t.Logf("A resumed %s after its claim (lease %s); JetStream refused it: %v", resumedAt.Sub(claimedAt).Round(time.Millisecond), leaseA, res.Err)
		})
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
