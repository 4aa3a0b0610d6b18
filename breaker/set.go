package breaker

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/promreg"
)

// Settings configures every breaker of a Set. Zero fields take their
// defaults.
type Settings struct {
	// ConsecutiveFailures trips the breaker after this many failures in a
	// row while closed. Default 5.
	ConsecutiveFailures uint32
	// FailureRatio trips the breaker when failures/requests reaches it,
	// once MinRequests requests were seen in the current Interval. In
	// (0, 1]; default 0.5.
	FailureRatio float64
	// MinRequests is the number of requests in an Interval before
	// FailureRatio applies. Default 20.
	MinRequests uint32
	// Interval is the window after which the closed state's counts are
	// cleared. Default 60 s.
	Interval time.Duration
	// OpenTimeout is how long the breaker stays open before it goes
	// half-open and lets probes through. Default 30 s.
	OpenTimeout time.Duration
	// HalfOpenProbes is how many calls half-open lets through; that many
	// successes in a row close the breaker. Default 1.
	HalfOpenProbes uint32
}

// Defaults of Settings: a zero field takes the value below.
const (
	DefaultConsecutiveFailures uint32 = 5
	DefaultFailureRatio               = 0.5
	DefaultMinRequests         uint32 = 20
	DefaultInterval                   = 60 * time.Second
	DefaultOpenTimeout                = 30 * time.Second
	DefaultHalfOpenProbes      uint32 = 1
)

// Validate checks s as NewSet does, without creating anything: nil, or an
// error wrapping ErrInvalidConfig naming the first bad field and value.
func (s Settings) Validate() error {
	_, err := s.withDefaults()
	return err
}

// withDefaults returns s with zero fields set to their defaults, or an
// error wrapping ErrInvalidConfig naming the first bad field.
func (s Settings) withDefaults() (Settings, error) {
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if s.FailureRatio == 0 {
		s.FailureRatio = DefaultFailureRatio
	}
	if s.MinRequests == 0 {
		s.MinRequests = DefaultMinRequests
	}
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if s.OpenTimeout == 0 {
		s.OpenTimeout = DefaultOpenTimeout
	}
	if s.HalfOpenProbes == 0 {
		s.HalfOpenProbes = DefaultHalfOpenProbes
	}
	switch {
	case math.IsNaN(s.FailureRatio) || s.FailureRatio < 0 || s.FailureRatio > 1:
		return s, fmt.Errorf("%w: FailureRatio %v: want a value in (0, 1]", ErrInvalidConfig, s.FailureRatio)
	case s.Interval < 0:
		return s, fmt.Errorf("%w: Interval %s: must not be negative", ErrInvalidConfig, s.Interval)
	case s.OpenTimeout < 0:
		return s, fmt.Errorf("%w: OpenTimeout %s: must not be negative", ErrInvalidConfig, s.OpenTimeout)
	}
	return s, nil
}

// Set holds one breaker per endpoint, created on first use, all with the
// same Settings. It is safe for concurrent use.
type Set struct {
	settings Settings
	logger   *slog.Logger
	state    *prometheus.GaugeVec
	trans    *prometheus.CounterVec

	mu       sync.Mutex
	breakers map[string]*Breaker
	// store and replica share the breakers' open state (Share); warned
	// is whether the store's failure was logged.
	store   Store
	replica string
	warned  atomic.Bool
}

// NewSet returns an empty Set. A nil logger discards logs; a nil reg leaves
// the metrics unregistered. Metrics (label endpoint as Endpoint renders it):
//
//   - jsbridge_consumer_breaker_state{endpoint} gauge: 0 closed, 1
//     half-open, 2 open;
//   - jsbridge_consumer_breaker_transitions_total{endpoint,from,to} counter.
//
// If reg already has these collectors (another Set), they are shared. It
// fails on invalid settings (ErrInvalidConfig) or a registration error.
func NewSet(s Settings, logger *slog.Logger, reg prometheus.Registerer) (*Set, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	state := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "jsbridge_consumer_breaker_state",
		Help: "Circuit breaker state per webhook endpoint: 0 closed, 1 half-open, 2 open.",
	}, []string{"endpoint"})
	trans := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jsbridge_consumer_breaker_transitions_total",
		Help: "Circuit breaker state transitions per webhook endpoint.",
	}, []string{"endpoint", "from", "to"})
	if reg != nil {
		if state, err = promreg.Register(reg, state); err != nil {
			return nil, fmt.Errorf("breaker: %w", err)
		}
		if trans, err = promreg.Register(reg, trans); err != nil {
			return nil, fmt.Errorf("breaker: %w", err)
		}
	}
	return &Set{
		settings: s,
		logger:   logger,
		state:    state,
		trans:    trans,
		breakers: make(map[string]*Breaker),
	}, nil
}

// Share makes the breakers created from now on share their open and
// half-open state through store with the other processes that share it
// (shared.go); replica names this process in the probe claims. Call it
// before the first Breaker call.
func (s *Set) Share(store Store, replica string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store, s.replica = store, replica
}

// Observe gives a shared breaker a state read from the store at revision
// rev (a watch on the store): a state of an endpoint without a breaker in s
// is ignored. A shared state that closes closes the local breaker too, so
// every process resumes at once.
func (s *Set) Observe(st SharedState, rev uint64) {
	s.mu.Lock()
	b := s.breakers[st.Endpoint]
	s.mu.Unlock()
	if b == nil || b.sh == nil {
		return
	}
	closed := b.sh.observe(st, rev)
	if closed {
		b.reset()
	} else {
		b.signal()
	}
}

// Settings returns the Set's settings with defaults applied.
func (s *Set) Settings() Settings { return s.settings }

// Breaker returns the breaker of endpoint, creating it (closed) on first
// use. endpoint is a webhook URL; it is keyed and labelled as Endpoint
// renders it, so URLs differing only in userinfo or query share a breaker.
func (s *Set) Breaker(endpoint string) *Breaker {
	name := Endpoint(endpoint)
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.breakers[name]; ok {
		return b
	}
	b := &Breaker{
		name:     name,
		settings: s.settings,
		set:      s,
		changed:  make(chan struct{}),
	}
	if s.store != nil {
		b.sh = &shared{store: s.store, replica: s.replica, endpoint: name, timeout: s.settings.OpenTimeout,
			probes: s.settings.HalfOpenProbes, log: s.logger, warned: &s.warned}
	}
	b.cb.Store(b.newCircuitBreaker())
	s.state.WithLabelValues(name).Set(float64(Closed))
	s.breakers[name] = b
	return b
}
