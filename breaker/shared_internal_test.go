package breaker

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// revStore is a Store in memory with compare-and-swap revisions.
type revStore struct {
	mu  sync.Mutex
	st  SharedState
	rev uint64
}

func (m *revStore) Load(context.Context, string) (SharedState, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st, m.rev, nil
}

func (m *revStore) Swap(_ context.Context, st SharedState, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rev != rev {
		return 0, ErrConflict
	}
	m.rev++
	m.st = st
	return m.rev, nil
}

// A process that judged the state half-open (its open timeout over) and
// then observes another process's claim before claiming itself does not
// take a second probe: claim judges the state it swaps from. Before, it
// swapped at the other claim's revision and both probed (a rare failure of
// TestSharedBreakerOneProbe under load).
func TestClaimAfterAnotherProcessClaimedIsRefused(t *testing.T) {
	store := &revStore{}
	newShared := func(replica string) *shared {
		return &shared{store: store, replica: replica, endpoint: "http://x/hook", timeout: time.Minute, probes: 1,
			log: slog.New(slog.DiscardHandler), warned: new(atomic.Bool)}
	}
	a, b := newShared("a"), newShared("b")
	open := SharedState{Endpoint: "http://x/hook", State: Open, Until: time.Now().Add(-time.Millisecond)}
	rev, err := store.Swap(t.Context(), open, 0)
	if err != nil {
		t.Fatal(err)
	}
	a.observe(open, rev)
	b.observe(open, rev)
	if st, ok := b.state(time.Now()); !ok || st != HalfOpen {
		t.Fatalf("b's verdict before any claim = %v, %v; want half-open, shared", st, ok)
	}
	if !a.claim() {
		t.Fatal("a could not claim the expired open state")
	}
	st, srev, _ := store.Load(t.Context(), "http://x/hook")
	b.observe(st, srev) // a's claim reaches b before b claims
	if b.claim() {
		t.Fatal("b claimed the probe a holds: two probes in one open timeout")
	}
	if got, _, _ := store.Load(t.Context(), "http://x/hook"); got.Prober != "a" {
		t.Fatalf("prober = %q, want a", got.Prober)
	}
	if !a.claim() {
		t.Fatal("a no longer holds its own claim")
	}
}
