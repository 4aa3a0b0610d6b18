package deliver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
	"github.com/jsbridge/jsbridge/wire"
)

// gatedReceiver is a receiver as the docs tell one to write it:
// webhook.Handler verifying the signature, with an order gate (memory
// store) that requires the version chain. It records the versions its
// handler processed per stream, with the predecessor each request named,
// and the gate's answers.
type gatedReceiver struct {
	*httptest.Server
	b *orderedBundle

	mu        sync.Mutex
	processed map[string][]int64
	// fail, when it returns a status, makes the handler fail the event
	// with it (a permanent 4xx dead-letters it).
	fail    func(e orderedEvent) int
	answers map[string]int // Jsbridge-Order answers (duplicate, gap, …) counted
	wrong   []string       // processed requests whose predecessor was not the last processed
}

func newGatedReceiver(t *testing.T, b *orderedBundle) *gatedReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	return newGatedReceiverWith(t, b, v)
}

// newGatedReceiverWith is newGatedReceiver verifying with v (its order
// gate checks the order signature with it too).
func newGatedReceiverWith(t *testing.T, b *orderedBundle, v *webhook.Verifier) *gatedReceiver {
	t.Helper()
	return newGatedReceiverOn(t, b, v, webhook.NewMemoryStore(1<<12), webhook.NewMemoryOrderStore())
}

// newGatedReceiverOn is newGatedReceiverWith on the given idempotency and
// order stores.
func newGatedReceiverOn(t *testing.T, b *orderedBundle, v *webhook.Verifier, idem webhook.IdempotencyStore, order webhook.OrderStore) *gatedReceiver {
	t.Helper()
	g := &gatedReceiver{b: b, processed: map[string][]int64{}, answers: map[string]int{}}
	gate := webhook.NewOrderGate(order, webhook.WithGateRequireHeaders(), webhook.WithGateLogger(slog.New(slog.DiscardHandler)))
	h := webhook.Handler(v, idem, time.Hour, func(_ context.Context, r *http.Request, _ []byte) error {
		e := b.event(r.Header.Get(wire.HeaderIdempotencyKey))
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.fail != nil {
			if code := g.fail(e); code != 0 {
				return &webhook.StatusError{Status: code, Err: errors.New("refused by the test")}
			}
		}
		want := wire.PreviousNone
		if p := g.processed[e.stream]; len(p) > 0 {
			want = wire.FormatPreviousVersion(p[len(p)-1])
		}
		if got := r.Header.Get(wire.HeaderPreviousVersion); got != want {
			g.wrong = append(g.wrong, fmt.Sprintf("%s v%d: previous %q, last processed %q", e.stream, e.version, got, want))
		}
		g.processed[e.stream] = append(g.processed[e.stream], e.version)
		return nil
	}, webhook.WithOrderGate(gate), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if a := w.Header().Get(wire.HeaderOrder); a != "" {
			g.mu.Lock()
			g.answers[a]++
			g.mu.Unlock()
		}
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gatedReceiver) setFail(f func(e orderedEvent) int) {
	g.mu.Lock()
	g.fail = f
	g.mu.Unlock()
}

// versions returns the versions of stream the handler processed, in
// order.
func (g *gatedReceiver) versions(stream string) []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int64(nil), g.processed[stream]...)
}

// requireProcessed waits until the handler processed exactly want of
// stream (no stream answered gap for ever), then checks that every
// processed request named the last processed version as its
// predecessor.
func (g *gatedReceiver) requireProcessed(t *testing.T, stream string, want ...int64) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return len(g.versions(stream)) >= len(want) }, 30*time.Second, 10*time.Millisecond) {
		t.Fatalf("stream %s: processed %v, want %v (gate answers %v)", stream, g.versions(stream), want, g.answerCounts())
	}
	require.Equal(t, want, g.versions(stream), "stream %s: each version processed once, in order", stream)
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Empty(t, g.wrong, "every processed request names the last processed version")
}

func (g *gatedReceiver) answerCounts() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int{}
	for k, v := range g.answers {
		out[k] = v
	}
	return out
}

func versionsFrom(from, to int64) []int64 {
	var out []int64
	for v := from; v < to; v++ {
		out = append(out, v)
	}
	return out
}

// startOrdered runs an ordered consumer until the returned stop (also
// called at cleanup).
func (b *orderedBundle) startOrdered(t *testing.T, cfg deliver.Config, subs ...subscription.Subscription) (*deliver.Consumer, func()) {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	c, err := deliver.New(b.js, cfg, subs...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return c, stop
}

func TestChainGatedReceiverTakesAReplayedHeadThenItsParkedStream(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	g.setFail(func(e orderedEvent) int {
		if e.stream == "order-park" && e.version == 3 {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	c := b.runOrdered(t, deliver.Config{DeadLetters: q}, orderedSub("chainreplay", g.URL))
	b.publishStream(t, "order-park", 0, 10)
	b.publishStream(t, "order-free", 0, 10)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "chainreplay")
		return err == nil && len(p) == 1 && p[0].Held == 6
	}, 20*time.Second, 20*time.Millisecond, "order-park parked behind version 3")
	g.requireProcessed(t, "order-free", versionsFrom(0, 10)...)

	letters, err := q.List(b.ctx, "chainreplay")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, "2", letters[0].PreviousVersion, "the dead letter keeps the predecessor its attempt named")
	require.NotEmpty(t, letters[0].Partition)
	require.NotEmpty(t, letters[0].LeaseEpoch)
	g.setFail(nil)
	res := c.Replay(b.ctx, q, letters)
	require.NoError(t, res[0].Err)
	require.True(t, res[0].Delivered)
	g.requireProcessed(t, "order-park", versionsFrom(0, 10)...)
}

func TestChainGatedReceiverGoesOnAfterASkippedHead(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	g.setFail(func(e orderedEvent) int {
		if e.stream == "order-skip" && e.version == 3 {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	b.runOrdered(t, deliver.Config{DeadLetters: q}, orderedSub("chainskip", g.URL))
	b.publishStream(t, "order-skip", 0, 10)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "chainskip")
		return err == nil && len(p) == 1 && p[0].Held == 6
	}, 20*time.Second, 20*time.Millisecond)
	letters, err := q.List(b.ctx, "chainskip")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.NoError(t, deadletter.SkipParked(b.ctx, b.js, q, letters[0]))
	g.requireProcessed(t, "order-skip", 0, 1, 2, 4, 5, 6, 7, 8, 9)
}

func TestChainGatedReceiverSkippedHeadIsSteppedOverAfterARestart(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	g.setFail(func(e orderedEvent) int {
		if e.stream == "order-skip" && e.version == 3 {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	_, stop := b.startOrdered(t, deliver.Config{DeadLetters: q}, orderedSub("chainskip2", g.URL))
	b.publishStream(t, "order-skip", 0, 6)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "chainskip2")
		return err == nil && len(p) == 1 && p[0].Held == 2
	}, 20*time.Second, 20*time.Millisecond)
	// The replica that knew the stream's chain stops; the skip happens
	// while none runs, and a new one learns the chain from the copy and
	// the park bucket.
	stop()
	letters, err := q.List(b.ctx, "chainskip2")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.NoError(t, deadletter.SkipParked(b.ctx, b.js, q, letters[0]))
	b.publishStream(t, "order-skip", 6, 8)
	b.runOrdered(t, deliver.Config{DeadLetters: q}, orderedSub("chainskip2", g.URL))
	g.requireProcessed(t, "order-skip", 0, 1, 2, 4, 5, 6, 7)
}

func TestChainGatedReceiverTakesAReplayByTime(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	s := orderedSub("chainwindow", g.URL)
	_, stop := b.startOrdered(t, deliver.Config{}, s)
	b.publishStream(t, "order-w", 0, 5)
	g.requireProcessed(t, "order-w", versionsFrom(0, 5)...)
	stop()

	// Published while no replica runs: replayed by time first, then
	// delivered by the subscription (duplicates to the gate).
	since := time.Now()
	b.publishStream(t, "order-w", 5, 10)
	b.publishStream(t, "order-new", 0, 3)
	c, err := deliver.New(b.js, deliver.Config{Partitions: 4, Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))}, s)
	require.NoError(t, err)
	res, err := deliver.ReplayWindow(b.ctx, c, "chainwindow", deliver.Window{Since: since})
	require.NoError(t, err)
	require.Nil(t, res.Failed)
	require.Equal(t, 8, res.Delivered)
	g.requireProcessed(t, "order-w", versionsFrom(0, 10)...)
	g.requireProcessed(t, "order-new", 0, 1, 2)

	b.runOrdered(t, deliver.Config{}, s)
	b.publishStream(t, "order-w", 10, 12)
	g.requireProcessed(t, "order-w", versionsFrom(0, 12)...)
}

func TestChainGatedReceiverTakesASubscriptionFilteredByEventName(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	s := orderedSub("chainfilter", g.URL)
	s.FilterSubjects = []string{"events.*.*.OrderShipped"}
	publish := func(from, to int64) {
		for v := from; v < to; v++ {
			name := "OrderNoted"
			if v%2 == 0 {
				name = "OrderShipped"
			}
			b.publish(t, "order-f", v, name)
		}
	}
	_, stop := b.startOrdered(t, deliver.Config{}, s)
	publish(0, 6)
	g.requireProcessed(t, "order-f", 0, 2, 4)
	// A new replica knows nothing of the stream: it looks the
	// predecessor of version 6 up among the filter's events (4, not 5).
	stop()
	publish(6, 10)
	b.runOrdered(t, deliver.Config{}, s)
	g.requireProcessed(t, "order-f", 0, 2, 4, 6, 8)
}

func TestChainGatedReceiverTakesStartNewOnAStreamWithHistory(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	b.publishStream(t, "order-h", 0, 5)
	s := orderedSub("chainnew", g.URL)
	s.Start = subscription.Start{Policy: subscription.StartNew}
	b.runOrdered(t, deliver.Config{}, s)
	require.Eventually(t, func() bool {
		_, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable("chainnew", 0))
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "the partition consumers are made")
	b.publishStream(t, "order-h", 5, 10)
	g.requireProcessed(t, "order-h", versionsFrom(5, 10)...)
}

func TestChainOrderSignatureVerifiesUnderEverySchemeAndBodyMode(t *testing.T) {
	t.Parallel()
	sk, pk, err := webhook.GenerateKeyPair()
	require.NoError(t, err)
	const hmacSecret = "chain-hmac-secret-0123456789"
	for _, c := range []struct {
		name    string
		scheme  webhook.Scheme
		secrets []string // the subscription's
		verify  []string // the receiver's
		body    subscription.BodyMode
	}{
		{"standard v1 structured", webhook.SchemeStandard, []string{secret}, []string{secret}, subscription.BodyStructured},
		{"standard v1a binary", webhook.SchemeStandard, []string{sk}, []string{pk}, subscription.BodyBinary},
		{"hmac-sha256 binary", webhook.SchemeHMACSHA256, []string{hmacSecret}, []string{hmacSecret}, subscription.BodyBinary},
		{"hmac-sha256 structured", webhook.SchemeHMACSHA256, []string{hmacSecret}, []string{hmacSecret}, subscription.BodyStructured},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setupOrdered(t)
			v, err := webhook.NewVerifier(c.scheme, c.verify)
			require.NoError(t, err)
			g := newGatedReceiverWith(t, b, v)
			s := orderedSub("chainsig", g.URL)
			s.Scheme, s.Secrets, s.Body = c.scheme, c.secrets, c.body
			b.runOrdered(t, deliver.Config{}, s)
			// A stream name the headers percent-encode: the signature
			// covers it decoded, as the gate reads it.
			b.publishStream(t, "order-a b%ü", 0, 4)
			g.requireProcessed(t, "order-a b%ü", 0, 1, 2, 3)
			require.Zero(t, g.answerCounts()["bad-order-signature"])
		})
	}
}

// TestChainPostgresGatedReceiverTakesAReplayAndASkip: the gate and the
// idempotency store in Postgres, one pool (smaller than the sender's
// max_in_flight), through a replayed head and a skipped one.
func TestChainPostgresGatedReceiverTakesAReplayAndASkip(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	pool := jsbridgetest.Pool(t) // MaxConns 8
	schema := jsbridgetest.Schema(t, pool)
	idem, err := pgstore.New(pool, pgstore.WithTable(schema+".keys"))
	require.NoError(t, err)
	require.NoError(t, idem.Migrate(b.ctx))
	order, err := pgstore.NewOrderStore(pool, pgstore.WithOrderTable(schema+".order_position"))
	require.NoError(t, err)
	require.NoError(t, order.Migrate(b.ctx))
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	g := newGatedReceiverOn(t, b, v, idem, order)
	fixed := false
	g.setFail(func(e orderedEvent) int {
		switch {
		case e.stream == "order-replay" && e.version == 3 && !fixed:
			return http.StatusUnprocessableEntity
		case e.stream == "order-skip" && e.version == 2:
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	s := orderedSub("chainpg", g.URL)
	s.MaxInFlight = 16
	c := b.runOrdered(t, deliver.Config{DeadLetters: q}, s)
	b.publishStream(t, "order-replay", 0, 8)
	b.publishStream(t, "order-skip", 0, 8)
	for i := range 12 {
		b.publishStream(t, fmt.Sprintf("order-free%d", i), 0, 5)
	}
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "chainpg")
		return err == nil && len(p) == 2
	}, 20*time.Second, 20*time.Millisecond, "both streams parked")
	for i := range 12 {
		g.requireProcessed(t, fmt.Sprintf("order-free%d", i), versionsFrom(0, 5)...)
	}
	letters, err := q.List(b.ctx, "chainpg")
	require.NoError(t, err)
	require.Len(t, letters, 2)
	g.mu.Lock()
	fixed = true
	g.mu.Unlock()
	for _, dl := range letters {
		if dl.Subject == wire.Subject(wire.DefaultEventsPrefix, "order-skip", "OrderNoted") {
			require.NoError(t, deadletter.SkipParked(b.ctx, b.js, q, dl))
			continue
		}
		res := c.Replay(b.ctx, q, []deadletter.Stored{dl})
		require.NoError(t, res[0].Err)
	}
	g.requireProcessed(t, "order-replay", versionsFrom(0, 8)...)
	g.requireProcessed(t, "order-skip", 0, 1, 3, 4, 5, 6, 7)
}

// TestChainGatedReceiverGoesOnPastADeadLetterUnderSkipPolicy:
// on_dead_letter skip: the next event names the dead-lettered one's
// predecessor, on the replica that dead-lettered it and on the next one
// (which reads the park bucket's record).
func TestChainGatedReceiverGoesOnPastADeadLetterUnderSkipPolicy(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	g.setFail(func(e orderedEvent) int {
		if e.stream == "order-go" && (e.version == 3 || e.version == 6) {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	s := orderedSub("chaingo", g.URL)
	s.OnDeadLetter = subscription.DeadLetterSkip
	_, stop := b.startOrdered(t, deliver.Config{DeadLetters: q}, s)
	b.publishStream(t, "order-go", 0, 7)
	g.requireProcessed(t, "order-go", 0, 1, 2, 4, 5)
	require.Eventually(t, func() bool {
		n, err := q.Count(b.ctx, "chaingo")
		return err == nil && n == 2
	}, 20*time.Second, 20*time.Millisecond, "versions 3 and 6 dead-lettered")
	stop()
	b.publishStream(t, "order-go", 7, 9)
	b.runOrdered(t, deliver.Config{DeadLetters: q}, s)
	g.requireProcessed(t, "order-go", 0, 1, 2, 4, 5, 7, 8)
}

// TestChainGatedReceiverTakesAReplayOfADeadLetterStoredBeforeTheChain: a
// dead letter without Jsbridge-Previous-Version (stored by a replica
// before the version chain) is replayed with the predecessor its
// partition would have named, read from the partitioned copy.
func TestChainGatedReceiverTakesAReplayOfADeadLetterStoredBeforeTheChain(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	g.setFail(func(e orderedEvent) int {
		if e.stream == "order-old" && e.version == 3 {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	c := b.runOrdered(t, deliver.Config{DeadLetters: q}, orderedSub("chainold", g.URL))
	b.publishStream(t, "order-old", 0, 6)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "chainold")
		return err == nil && len(p) == 1 && p[0].Held == 2
	}, 20*time.Second, 20*time.Millisecond)
	letters, err := q.List(b.ctx, "chainold")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	old := letters[0]
	old.PreviousVersion, old.Partition, old.LeaseEpoch = "", "", ""
	h := nats.Header{}
	for k, v := range old.Header {
		if k != wire.HeaderPreviousVersion {
			h[k] = v
		}
	}
	old.Header = h
	g.setFail(nil)
	res := c.Replay(b.ctx, q, []deadletter.Stored{old})
	require.NoError(t, res[0].Err)
	g.requireProcessed(t, "order-old", versionsFrom(0, 6)...)
}
