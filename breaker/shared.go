package breaker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Shared breakers: with Set.Share, the breakers of several processes (the
// consumer replicas) share each endpoint's open and half-open state
// through a Store, so one replica probes a dead endpoint per open timeout
// while the others wait, and all close together when the probe succeeds.
// Each process still counts its own failures (its local gobreaker): the
// first to trip opens the shared state for everyone. While the shared state
// is closed each breaker is its local one. A Store that fails degrades to
// the local breakers (logged once until it answers again): a shared state
// that cannot be read never stops deliveries.
//
// gobreaker's own DistributedCircuitBreaker is not used: it holds a
// store-wide lock across every call (the POST included) and reads and
// writes the store on every call, which would serialise an endpoint's
// deliveries across replicas and put a store round trip on each.

// SharedState is an endpoint's breaker state as the processes share it.
type SharedState struct {
	// Endpoint is the endpoint as Endpoint renders it.
	Endpoint string `json:"endpoint"`
	// State is Closed, Open (no call until Until) or HalfOpen (Prober
	// probes until Until; after Until anyone may take the probe).
	State State `json:"state"`
	// Until ends the open timeout (Open) or the probe's claim (HalfOpen).
	Until time.Time `json:"until,omitzero"`
	// Prober is the process holding the probe (HalfOpen).
	Prober string `json:"prober,omitempty"`
}

// ErrConflict is returned by Store.Swap when the state changed since the
// revision given.
var ErrConflict = errors.New("shared breaker state changed meanwhile")

// Store keeps the shared states, with a revision per endpoint for
// compare-and-swap (a JetStream key-value bucket in the consumer).
type Store interface {
	// Load returns endpoint's state and revision; revision 0 and the
	// zero state (closed) when there is none.
	Load(ctx context.Context, endpoint string) (SharedState, uint64, error)
	// Swap writes st if endpoint's revision is still rev (0: there is
	// none) and returns the new revision; an error wrapping ErrConflict
	// if it is not.
	Swap(ctx context.Context, st SharedState, rev uint64) (uint64, error)
}

// storeTimeout bounds one Store call.
const storeTimeout = 2 * time.Second

// shared is one breaker's view of its shared state. Safe for concurrent
// use.
type shared struct {
	store    Store
	replica  string
	endpoint string
	timeout  time.Duration // Settings.OpenTimeout
	probes   uint32        // Settings.HalfOpenProbes
	log      *slog.Logger
	warned   *atomic.Bool // the Set's: degraded logged

	mu      sync.Mutex
	st      SharedState
	rev     uint64
	down    bool // the store failed: local breaker only
	probing uint32
}

// state returns the shared state's verdict at now, and false when the
// local breaker decides (shared state closed, or the store down).
func (s *shared) state(now time.Time) (State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.down || s.st.State == Closed:
		return Closed, false
	case s.st.State == Open && now.Before(s.st.Until):
		return Open, true
	case s.st.State == HalfOpen && s.st.Prober != s.replica && now.Before(s.st.Until):
		return Open, true // another process probes
	default:
		return HalfOpen, true
	}
}

// until returns when the shared open timeout or probe claim ends.
func (s *shared) until() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Until
}

// observe takes a state read from the store at rev; it reports whether it
// closed a shared state that was open or half-open.
func (s *shared) observe(st SharedState, rev uint64) (closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recovered()
	if rev != 0 && rev < s.rev {
		return false
	}
	was := s.st.State
	s.st, s.rev = st, rev
	return st.State == Closed && was != Closed
}

// claim takes the probe (HalfOpen, Prober this process) unless another
// process holds it; it reports whether this process may probe. A store
// that fails degrades to the local breaker, which then decides. The state
// is judged again here, not only by the caller's state(): another
// process's claim may have been observed in between, and swapping at its
// revision would take a second probe in the same open timeout.
func (s *shared) claim() bool {
	s.mu.Lock()
	cur, rev := s.st, s.rev
	s.mu.Unlock()
	now := time.Now()
	if now.Before(cur.Until) {
		switch {
		case cur.State == HalfOpen && cur.Prober == s.replica:
			return true
		case cur.State == Open, cur.State == HalfOpen:
			return false // still open, or another process probes
		}
	}
	next := SharedState{Endpoint: s.endpoint, State: HalfOpen, Until: now.Add(s.timeout), Prober: s.replica}
	return s.swap(next, rev) == nil
}

// free reports whether this process has a probe slot free.
func (s *shared) free() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probing < s.probes
}

// begin takes one of this process's probe slots, if it still holds the
// probe claim (a probe that just failed has opened the state again); end
// gives it back.
func (s *shared) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probing >= s.probes || s.st.State != HalfOpen || s.st.Prober != s.replica {
		return false
	}
	s.probing++
	return true
}

func (s *shared) end() {
	s.mu.Lock()
	s.probing--
	s.mu.Unlock()
}

// settle writes a probe's result: closed after a success, open for another
// timeout after a failure, the probe freed after a call that did not count.
func (s *shared) settle(err error) {
	s.mu.Lock()
	rev := s.rev
	s.mu.Unlock()
	now := time.Now()
	next := SharedState{Endpoint: s.endpoint, State: Open, Until: now.Add(s.timeout)}
	switch {
	case err == nil:
		next = SharedState{Endpoint: s.endpoint, State: Closed}
	case isExcluded(err):
		next.Until = now
	}
	_ = s.swap(next, rev)
}

// tripped opens the shared state after the local breaker opened, unless
// it is open or probed already.
func (s *shared) tripped() {
	s.mu.Lock()
	cur, rev := s.st, s.rev
	s.mu.Unlock()
	now := time.Now()
	if cur.State != Closed && now.Before(cur.Until) {
		return
	}
	_ = s.swap(SharedState{Endpoint: s.endpoint, State: Open, Until: now.Add(s.timeout)}, rev)
}

// swap writes next at rev; on a conflict it reloads the state and returns
// ErrConflict; on another error it degrades to the local breaker.
func (s *shared) swap(next SharedState, rev uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	nrev, err := s.store.Swap(ctx, next, rev)
	if err == nil {
		s.observe(next, nrev)
		return nil
	}
	if errors.Is(err, ErrConflict) {
		if st, lrev, lerr := s.store.Load(ctx, s.endpoint); lerr == nil {
			s.observe(st, lrev)
		}
		return err
	}
	s.fail(err)
	return err
}

// fail degrades to the local breaker, logging it once per Set until the
// store answers again.
func (s *shared) fail(err error) {
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	if s.warned.CompareAndSwap(false, true) {
		s.log.Warn("shared circuit breaker state not available: each replica uses its own breakers until it is",
			slog.String("endpoint", s.endpoint), slog.Any("error", err))
	}
}

// recovered ends the degraded mode (s.mu held).
func (s *shared) recovered() {
	if s.down {
		s.down = false
		if s.warned.CompareAndSwap(true, false) {
			s.log.Info("shared circuit breaker state available again", slog.String("endpoint", s.endpoint))
		}
	}
}
