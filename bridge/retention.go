package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/forward"
)

// DefaultMaxAge is the retention `bridge run --max-age` gives the events
// stream it creates: 7 days. Postgres keeps every event, so JetStream's
// history only has to outlast what reads it late: an endpoint outage
// (a subscription is disabled after 24 h of failure and resumes from its
// position when enabled), a consumer down over a long weekend, a replay by
// time. Config.MaxAge's zero value still means no limit (an application
// embedding the bridge chooses); docs/retention.md argues the figure.
const DefaultMaxAge = 7 * 24 * time.Hour

// ErrStreamNotFound is wrapped by SetRetention when the JetStream stream
// does not exist (yet: Start creates it).
var ErrStreamNotFound = errors.New("JetStream stream not found")

// Retention is a JetStream stream's retention: what JetStream removes,
// oldest first, without anyone asking. A zero field means no limit.
type Retention struct {
	// MaxAge removes a message once it is older than this.
	MaxAge time.Duration `json:"max_age"`
	// MaxBytes removes the oldest messages while the stream holds more
	// than this many bytes (uncompressed, as JetStream counts them).
	MaxBytes int64 `json:"max_bytes"`
	// MaxMsgsPerSubject keeps the last this many messages of each subject
	// (one event name of one source stream).
	MaxMsgsPerSubject int64 `json:"max_msgs_per_subject"`
}

// String spells r as the bridge logs it: "max_age=168h0m0s
// max_bytes=none max_msgs_per_subject=none".
func (r Retention) String() string { return r.limits().String() }

func (r Retention) limits() forward.Limits {
	return forward.Limits{MaxAge: r.MaxAge, MaxBytes: r.MaxBytes, MaxMsgsPerSubject: r.MaxMsgsPerSubject}
}

func retentionOf(l forward.Limits) Retention {
	return Retention{MaxAge: l.MaxAge, MaxBytes: l.MaxBytes, MaxMsgsPerSubject: l.MaxMsgsPerSubject}
}

// StreamRetention returns the retention of the JetStream stream name;
// the error wraps ErrStreamNotFound when it does not exist.
func StreamRetention(ctx context.Context, js jetstream.JetStream, name string) (Retention, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Retention{}, fmt.Errorf("%w: %s", ErrStreamNotFound, name)
	}
	if err != nil {
		return Retention{}, fmt.Errorf("look up JetStream stream %s: %w", name, err)
	}
	return retentionOf(forward.LimitsOf(s.CachedInfo().Config)), nil
}

// SetRetention gives the existing JetStream stream name the retention r
// and returns the one it had; the stream's other settings are kept. Start
// never changes an existing stream's retention (it logs it, and warns
// when it differs from Config): this is the explicit change, for `bridge
// retention --yes`. Shortening a limit makes JetStream remove at once
// the messages past it; Postgres still holds them, and Verify counts them
// as aged out. Errors wrap ErrInvalidConfig (a negative limit, a MaxAge
// below 100 ms or below the stream's duplicate window, naming the value),
// ErrStreamNotFound, or JetStream's error.
//
// The stream's copy for ordered subscriptions and the dead-letter stream
// are the consumer's and are not changed: they take twice MaxAge (the
// copy twice MaxBytes too) when the consumer creates them, and the
// consumer warns at start when the copy keeps less than that.
func SetRetention(ctx context.Context, js jetstream.JetStream, name string, r Retention) (old Retention, err error) {
	prev, err := forward.SetLimits(ctx, js, name, r.limits())
	switch {
	case errors.Is(err, forward.ErrInvalidConfig):
		return retentionOf(prev), fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	case errors.Is(err, forward.ErrStreamNotFound):
		return Retention{}, fmt.Errorf("%w: %s", ErrStreamNotFound, name)
	}
	return retentionOf(prev), err
}
