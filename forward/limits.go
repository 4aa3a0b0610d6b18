package forward

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrStreamNotFound is wrapped by SetLimits when the stream does not exist.
var ErrStreamNotFound = errors.New("JetStream stream not found")

// SetLimits gives the existing JetStream stream name the retention lim
// (zero fields: no limit) and returns the retention it had. It is the
// explicit way to change an existing stream's retention, which Provision
// only reports: shortening it makes JetStream remove at once the messages
// past the new limits. The stream's other settings are kept. Errors wrap
// ErrInvalidConfig for a negative limit, a MaxAge below 100 ms or below the
// stream's duplicate window (JetStream refuses a window longer than
// MaxAge), naming the field and the value; ErrStreamNotFound when the
// stream does not exist; else JetStream's error.
func SetLimits(ctx context.Context, js jetstream.JetStream, name string, lim Limits) (old Limits, err error) {
	if err := lim.validate("Limits"); err != nil {
		return Limits{}, err
	}
	if js == nil {
		return Limits{}, fmt.Errorf("%w: JetStream context is nil", ErrInvalidConfig)
	}
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Limits{}, fmt.Errorf("%w: %s (the bridge creates it at its first start)", ErrStreamNotFound, name)
	}
	if err != nil {
		return Limits{}, fmt.Errorf("look up JetStream stream %s: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	old = LimitsOf(cfg)
	if lim.MaxAge > 0 && lim.MaxAge < cfg.Duplicates {
		return old, fmt.Errorf("%w: max age %s is shorter than JetStream stream %s's duplicate window %s (JetStream refuses a window longer than MaxAge)",
			ErrInvalidConfig, lim.MaxAge, name, cfg.Duplicates)
	}
	if old == lim {
		return old, nil
	}
	cfg.MaxAge, cfg.MaxBytes, cfg.MaxMsgsPerSubject = lim.jetStream()
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return old, fmt.Errorf("update the retention of JetStream stream %s (%s -> %s): %w", name, old, lim, err)
	}
	return old, nil
}
