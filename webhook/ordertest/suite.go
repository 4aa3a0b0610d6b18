// Package ordertest is the behaviour every webhook.OrderStore must have, as
// one test suite: the store's own contract, and an order gate over it
// behind a real HTTP server (in order, duplicates, gaps retried, a zombie's
// stale epoch, a failing handler, concurrent senders), and the version
// chain (a filtered subscription, start: new, replays, skip, a sender
// before the chain, altered ordering headers). webhook's
// MemoryOrderStore and pgstore's Postgres store both run it, so they stay
// interchangeable. A store of your own can run it too.
package ordertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// NewStore returns an empty store. It is called once per subtest, which
// may run in parallel.
type NewStore func(t *testing.T) webhook.OrderStore

// Source is the ce-source of the events the suite sends.
const Source = "/ordertest"

// Run runs the suite against the stores newStore makes.
func Run(t *testing.T, newStore NewStore) {
	runStore(t, newStore)
	runGate(t, newStore)
	runChain(t, newStore)
	t.Run("ConcurrentSenders", func(t *testing.T) {
		t.Parallel()
		Hammer(t, newStore(t))
	})
}

func runStore(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	key := webhook.OrderKey{Namespace: "ns", Source: Source, Stream: "order-1"}
	at := func(v int64, e uint64, p int) webhook.OrderPosition {
		return webhook.OrderPosition{Version: v, Epoch: e, Partition: p}
	}

	t.Run("LockAdvanceRelease", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		pos, err := s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, webhook.Unprocessed, pos)

		pos, lock, err := s.Lock(ctx, key)
		require.NoError(t, err)
		require.NotNil(t, lock)
		require.Equal(t, webhook.Unprocessed, pos)
		busy, none, err := s.Lock(ctx, key)
		require.NoError(t, err)
		require.Nil(t, none, "a held stream is not handed out twice")
		require.Equal(t, webhook.Unprocessed, busy)
		other, otherLock, err := s.Lock(ctx, webhook.OrderKey{Namespace: "other", Source: Source, Stream: "order-1"})
		require.NoError(t, err)
		require.NotNil(t, otherLock, "another namespace is another stream")
		require.Equal(t, webhook.Unprocessed, other)
		require.NoError(t, otherLock.Release(ctx))

		require.NoError(t, lock.Advance(ctx, at(0, 7, 3)))
		require.NoError(t, lock.Release(ctx), "release after advance does nothing")
		pos, err = s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, at(0, 7, 3), pos)

		pos, lock, err = s.Lock(ctx, key)
		require.NoError(t, err)
		require.NotNil(t, lock, "advance released the stream")
		require.Equal(t, at(0, 7, 3), pos)
		require.NoError(t, lock.Release(ctx))
		require.NoError(t, lock.Release(ctx), "a second release does nothing")
		require.ErrorIs(t, lock.Advance(ctx, at(1, 7, 3)), webhook.ErrOrderAdvance, "an ended lock records nothing")
		pos, err = s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, at(0, 7, 3), pos, "release recorded nothing")
	})

	t.Run("AdvanceOnlyForward", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		_, lock, err := s.Lock(ctx, key)
		require.NoError(t, err)
		require.NoError(t, lock.Advance(ctx, at(4, 9, 1)))
		for _, bad := range []webhook.OrderPosition{at(4, 9, 1), at(3, 9, 1), at(5, 8, 1)} {
			_, lock, err := s.Lock(ctx, key)
			require.NoError(t, err)
			require.NotNil(t, lock, "a failed advance released the stream (%+v)", bad)
			require.ErrorIs(t, lock.Advance(ctx, bad), webhook.ErrOrderAdvance, "%+v", bad)
		}
		pos, err := s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, at(4, 9, 1), pos)
	})

	t.Run("SkipVersion", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		require.ErrorIs(t, webhook.SkipVersion(ctx, s, key, 1), webhook.ErrOrderAdvance, "a new stream's next version is 0")
		require.NoError(t, webhook.SkipVersion(ctx, s, key, 0))
		pos, err := s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, at(0, 0, -1), pos)
		_, lock, err := s.Lock(ctx, key)
		require.NoError(t, err)
		require.ErrorIs(t, webhook.SkipVersion(ctx, s, key, 1), webhook.ErrOrderAdvance, "not while the stream is held")
		require.NoError(t, lock.Advance(ctx, at(1, 6, 2)))
		require.ErrorIs(t, webhook.SkipVersion(ctx, s, key, 1), webhook.ErrOrderAdvance, "a processed version")
		require.NoError(t, webhook.SkipVersion(ctx, s, key, 2))
		pos, err = s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, at(2, 6, 2), pos, "the epoch and partition stay")
	})

	t.Run("DoneContext", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, lock, err := s.Lock(cancelled, key)
		require.ErrorIs(t, err, context.Canceled)
		require.Nil(t, lock)
		_, err = s.Position(cancelled, key)
		require.ErrorIs(t, err, context.Canceled)
		_, lock, err = s.Lock(ctx, key)
		require.NoError(t, err)
		require.NotNil(t, lock, "the failed lock holds nothing")
		require.Error(t, lock.Advance(cancelled, at(0, 1, 0)))
		pos, err := s.Position(ctx, key)
		require.NoError(t, err)
		require.Equal(t, webhook.Unprocessed, pos, "an advance with a done context records nothing")
		_, lock, err = s.Lock(ctx, key)
		require.NoError(t, err)
		require.NotNil(t, lock, "a failed advance released the stream")
		require.NoError(t, lock.Release(ctx))
	})
}

// Receiver is an order gate over a store, behind a real HTTP server, in
// front of a handler that records the versions it processes per stream.
type Receiver struct {
	// URL is the server's address.
	URL string
	*recorder
}

// recorder is the gated handler: it records what it processes, and can be
// shared by several receivers (replicas).
type recorder struct {
	mu        sync.Mutex
	processed map[string][]int64
	fail      map[string]int // stream → answers of 500 still to give
	inside    map[string]int // stream → handlers running
	overlap   []string
}

func newRecorder() *recorder {
	return &recorder{processed: map[string][]int64{}, fail: map[string]int{}, inside: map[string]int{}}
}

// NewReceiver starts a Receiver gating with store and opts; it stops at
// the test's cleanup.
func NewReceiver(t testing.TB, store webhook.OrderStore, opts ...webhook.GateOption) *Receiver {
	return newReceiver(t, store, newRecorder(), opts...)
}

func newReceiver(t testing.TB, store webhook.OrderStore, rec *recorder, opts ...webhook.GateOption) *Receiver {
	opts = append([]webhook.GateOption{webhook.WithGateLogger(slog.New(slog.DiscardHandler))}, opts...)
	gate := webhook.NewOrderGate(store, opts...)
	srv := httptest.NewServer(gate.Middleware(http.HandlerFunc(rec.handle)))
	t.Cleanup(srv.Close)
	return &Receiver{URL: srv.URL, recorder: rec}
}

func (rc *recorder) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ce, err := webhook.DecodeCloudEvent(r, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	rc.mu.Lock()
	rc.inside[ce.Subject]++
	if rc.inside[ce.Subject] > 1 {
		rc.overlap = append(rc.overlap, fmt.Sprintf("%s v%d", ce.Subject, ce.StreamVersion))
	}
	fail := rc.fail[ce.Subject] > 0
	if fail {
		rc.fail[ce.Subject]--
	} else {
		rc.processed[ce.Subject] = append(rc.processed[ce.Subject], ce.StreamVersion)
	}
	rc.mu.Unlock()
	runtime.Gosched() // widen the window another request of the stream could slip into
	rc.mu.Lock()
	rc.inside[ce.Subject]--
	rc.mu.Unlock()
	if fail {
		http.Error(w, "failing on purpose", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Processed returns the versions of stream the handler processed, in the
// order it did.
func (rc *recorder) Processed(stream string) []int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]int64(nil), rc.processed[stream]...)
}

// FailNext makes the handler answer 500 to the next n requests of stream.
func (rc *recorder) FailNext(stream string, n int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.fail[stream] = n
}

// Overlaps returns the requests the handler got while another of the same
// stream was running ("stream vN"); a gate lets none through.
func (rc *recorder) Overlaps() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.overlap...)
}

// Answer is a gate's answer to one POST.
type Answer struct {
	Status     int
	Order      string // Jsbridge-Order
	Last       string // Jsbridge-Order-Last (gap answers)
	RetryAfter string
	Body       string
}

// Post sends version of stream as an ordered webhook with the lease epoch
// epoch from partition 0 in structured mode, and returns the answer.
func Post(t testing.TB, url, stream string, version int64, epoch uint64) Answer {
	t.Helper()
	a, err := post(url, stream, version, epoch, false)
	require.NoError(t, err)
	return a
}

// client sends the suite's requests on a transport of its own: every
// httptest.Server's Close calls CloseIdleConnections on
// http.DefaultTransport, which breaks a request of a parallel test that
// has just taken an idle connection from it ("HTTP/1.x transport
// connection broken: http: CloseIdleConnections called").
var client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

// post sends version of stream from partition 0 at epoch, with the
// version chain's previous version (version-1) when chained.
func post(url, stream string, version int64, epoch uint64, chained bool) (Answer, error) {
	body, err := json.Marshal(event.CloudEvent{SpecVersion: event.SpecVersion, ID: stream + "@" + strconv.FormatInt(version, 10),
		Source: Source, Type: "Happened", Subject: stream, StreamVersion: version, Data: json.RawMessage(`{}`)})
	if err != nil {
		return Answer{}, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set(wire.HeaderContentType, event.ContentTypeCloudEventsJSON)
	req.Header.Set(wire.HeaderPartition, "0")
	req.Header.Set(wire.HeaderLeaseEpoch, strconv.FormatUint(epoch, 10))
	if chained {
		req.Header.Set(wire.HeaderPreviousVersion, wire.FormatPreviousVersion(version-1))
	}
	resp, err := client.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, err
	}
	return Answer{Status: resp.StatusCode, Order: resp.Header.Get(wire.HeaderOrder),
		RetryAfter: resp.Header.Get("Retry-After"), Body: string(bytes.TrimSpace(got))}, nil
}
