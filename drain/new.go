package drain

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
)

// HandlerTimeout is how long after its claim a cycle's handler may run:
// 80% of the lease, so that the cycle settles before its leases run out.
// The handler's context ends then (its publishes are cut short, and an
// UnavailableError is expected of them). For lease <= 0 it uses
// DefaultLease.
func HandlerTimeout(lease time.Duration) time.Duration {
	if lease <= 0 {
		lease = DefaultLease
	}
	return lease - lease/5
}

// New returns a Drain that reads from store and hands batches to h. Zero
// Config fields take their defaults; negative durations or limits give an
// error wrapping ErrInvalidConfig that names the field and the value.
func New(store Store, h Handler, cfg Config) (*Drain, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	if h == nil {
		return nil, fmt.Errorf("%w: handler is nil", ErrInvalidConfig)
	}
	if cfg.Owner == "" {
		cfg.Owner = defaultOwner()
	}
	checks := []struct {
		name string
		bad  bool
		val  any
	}{
		{"Lease", cfg.Lease < 0, cfg.Lease},
		{"ClaimLimit", cfg.ClaimLimit < 0, cfg.ClaimLimit},
		{"FetchLimit", cfg.FetchLimit < 0, cfg.FetchLimit},
		{"PollInterval", cfg.PollInterval < 0, cfg.PollInterval},
		{"Linger", cfg.Linger < 0, cfg.Linger},
		{"MaxRetries", cfg.MaxRetries < 0, cfg.MaxRetries},
		{"ShutdownGrace", cfg.ShutdownGrace < 0, cfg.ShutdownGrace},
	}
	for _, c := range checks {
		if c.bad {
			return nil, fmt.Errorf("%w: Config.%s %v is negative", ErrInvalidConfig, c.name, c.val)
		}
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease < time.Millisecond {
		return nil, fmt.Errorf("%w: Config.Lease %v is below 1ms", ErrInvalidConfig, cfg.Lease)
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.ClaimLimit == 0 {
		cfg.ClaimLimit = DefaultClaimLimit
	}
	if cfg.FetchLimit == 0 {
		cfg.FetchLimit = DefaultFetchLimit
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = DefaultMaxRetries
	}
	if cfg.Backoff == nil {
		cfg.Backoff = exponentialBackoff
	}
	if cfg.OutageBackoff == nil {
		cfg.OutageBackoff = outageBackoff
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	return &Drain{
		store: store,
		h:     h,
		cfg:   cfg,
		log:   cfg.Logger.With("owner", cfg.Owner),
		held:  map[string]bool{},
	}, nil
}

// Owner returns the name this drainer takes leases under.
func (d *Drain) Owner() string { return d.cfg.Owner }

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "drain"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}
