package deliver_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// epochReceiver is a webhook.Handler behind an order gate on a memory
// store, recording what its handler processed, the highest epoch it was
// sent per partition, and how many requests the gate refused as
// stale-epoch.
type epochReceiver struct {
	*httptest.Server
	store *webhook.MemoryOrderStore

	mu     sync.Mutex
	done   map[string][]int64
	epochs map[string]uint64 // by partition
	stale  int
}

// newEpochReceiver starts a gated receiver for b's events. With
// nameNoEpoch its answers lose Jsbridge-Order-Epoch, as a receiver of an
// older webhook package's sends none.
func newEpochReceiver(t *testing.T, b *orderedBundle, nameNoEpoch bool) *epochReceiver {
	t.Helper()
	gr := &epochReceiver{store: webhook.NewMemoryOrderStore(), done: map[string][]int64{}, epochs: map[string]uint64{}}
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	h := webhook.Handler(v, webhook.NewMemoryStore(1<<10), time.Hour, func(_ context.Context, r *http.Request, _ []byte) error {
		e := b.event(r.Header.Get(wire.HeaderIdempotencyKey))
		gr.mu.Lock()
		gr.done[e.stream] = append(gr.done[e.stream], e.version)
		gr.mu.Unlock()
		return nil
	}, webhook.WithOrderGate(webhook.NewOrderGate(gr.store)), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	gr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ep, err := strconv.ParseUint(r.Header.Get(wire.HeaderLeaseEpoch), 10, 64); err == nil {
			p := r.Header.Get(wire.HeaderPartition)
			gr.mu.Lock()
			gr.epochs[p] = max(gr.epochs[p], ep)
			gr.mu.Unlock()
		}
		rw := &epochStripper{ResponseWriter: w, strip: nameNoEpoch}
		h.ServeHTTP(rw, r)
		if w.Header().Get(wire.HeaderOrder) == wire.OrderStaleEpoch {
			gr.mu.Lock()
			gr.stale++
			gr.mu.Unlock()
		}
	}))
	t.Cleanup(gr.Close)
	return gr
}

// epochStripper drops Jsbridge-Order-Epoch from an answer when strip.
type epochStripper struct {
	http.ResponseWriter
	strip bool
}

func (w *epochStripper) WriteHeader(code int) {
	if w.strip {
		w.Header().Del(wire.HeaderOrderEpoch)
	}
	w.ResponseWriter.WriteHeader(code)
}

// seen records that the gate processed stream up to version under epoch,
// as if an earlier sender had delivered it.
func (gr *epochReceiver) seen(t *testing.T, stream string, version int64, epoch uint64) {
	t.Helper()
	ctx := context.Background()
	_, lock, err := gr.store.Lock(ctx, webhook.OrderKey{Source: forward.DefaultSource, Stream: stream})
	require.NoError(t, err)
	require.NoError(t, lock.Advance(ctx, webhook.OrderPosition{Version: version, Epoch: epoch, Partition: -1}))
}

// processed reports whether the handler processed at least n versions of
// every stream.
func (gr *epochReceiver) processed(streams []string, n int) bool {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for _, s := range streams {
		if len(gr.done[s]) < n {
			return false
		}
	}
	return true
}

// runEpochGated runs an ordered consumer of one subscription to url with clock
// (nil: the real one) until the returned stop is called.
func runEpochGated(t *testing.T, b *orderedBundle, url string, clock clockwork.Clock) (stop func()) {
	t.Helper()
	c, err := deliver.New(b.js, deliver.Config{Partitions: 2, LeaseTTL: time.Second, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))}, orderedSub("gated", url))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-ran:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// A lease bucket made as `nats kv add` makes it (revisions from 1), beside
// a receiver whose gate processed the streams under far higher epochs (a
// clock-based epoch of an earlier version, or another deployment's): the
// first claims are refused stale-epoch, the refusal names the receiver's
// epoch, and the next claims send above it. Every stream is delivered, in
// order, after a bounded number of refusals.
func TestLeaseEpochsPassAReceiverThatSawHigherEpochs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an ordered consumer through lease hand-overs (seconds)")
	}
	t.Parallel()
	for _, tc := range []struct {
		name        string
		nameNoEpoch bool
		high        uint64
	}{
		{"the refusal names the receiver's epoch", false, 1_800_000_000_000_000},
		{"the refusal names none: the refused epoch is doubled", true, 5_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupOrdered(t)
			_, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultLeaseBucket, TTL: time.Second})
			require.NoError(t, err)
			gr := newEpochReceiver(t, b, tc.nameNoEpoch)
			streams := []string{"order-a", "order-b", "order-c"}
			for _, s := range streams {
				gr.seen(t, s, 1, tc.high)
				b.publishStream(t, s, 0, 5)
			}
			runEpochGated(t, b, gr.URL, nil)
			require.Eventually(t, func() bool { return gr.processed(streams, 3) }, 40*time.Second, 10*time.Millisecond,
				"every stream delivered past the receiver's epoch")
			gr.mu.Lock()
			defer gr.mu.Unlock()
			for _, s := range streams {
				require.Equal(t, []int64{2, 3, 4}, gr.done[s], "stream %s: the versions after the ones seen, in order, once", s)
			}
			require.Positive(t, gr.stale, "the first claims' epochs were below the receiver's")
			for p, ep := range gr.epochs {
				require.Greater(t, ep, tc.high, "partition %s sent above the receiver's epoch in the end", p)
			}
			t.Logf("stale-epoch refusals: %d; epochs sent: %v", gr.stale, gr.epochs)
		})
	}
}

// offsetClock is the real clock shifted by off: a replica whose clock is
// wrong.
type offsetClock struct {
	clockwork.Clock
	off time.Duration
}

func (c offsetClock) Now() time.Time                  { return c.Clock.Now().Add(c.off) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c offsetClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// The lease bucket deleted (to change the lease TTL, as docs/ordering.md
// says) and created again by a replica whose clock is an hour behind: its
// claims' epochs are still above every epoch sent before, so the gate
// refuses nothing.
func TestLeaseBucketCreatedAgainByAReplicaWithAClockBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two ordered consumers one after the other (seconds)")
	}
	t.Parallel()
	b := setupOrdered(t)
	gr := newEpochReceiver(t, b, false)
	streams := []string{"order-a", "order-b", "order-c"}
	stop := runEpochGated(t, b, gr.URL, nil)
	for _, s := range streams {
		b.publishStream(t, s, 0, 3)
	}
	require.Eventually(t, func() bool { return gr.processed(streams, 3) }, 20*time.Second, 10*time.Millisecond)
	stop()
	gr.mu.Lock()
	before := gr.epochs
	gr.epochs = map[string]uint64{}
	gr.mu.Unlock()
	require.NotEmpty(t, before)

	require.NoError(t, b.js.DeleteKeyValue(b.ctx, wire.DefaultLeaseBucket))
	runEpochGated(t, b, gr.URL, offsetClock{Clock: clockwork.NewRealClock(), off: -time.Hour})
	for _, s := range streams {
		b.publishStream(t, s, 3, 6)
	}
	require.Eventually(t, func() bool { return gr.processed(streams, 6) }, 20*time.Second, 10*time.Millisecond,
		"the gate processes the events sent under the new bucket's leases")
	kv, err := b.js.KeyValue(b.ctx, wire.DefaultLeaseBucket)
	require.NoError(t, err)
	st, err := kv.Status(b.ctx)
	require.NoError(t, err)
	require.Less(t, st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.FirstSeq, uint64(1000), "the bucket was created again with its revisions from 1")
	gr.mu.Lock()
	defer gr.mu.Unlock()
	require.Zero(t, gr.stale, "requests refused as stale-epoch")
	for _, s := range streams {
		require.Equal(t, []int64{0, 1, 2, 3, 4, 5}, gr.done[s], "stream %s processed in order, each once", s)
	}
	for p, ep := range gr.epochs {
		require.Greater(t, ep, before[p], "partition %s: the new bucket's epoch is above the deleted one's", p)
	}
}
