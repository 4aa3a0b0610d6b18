package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/deliver"
	"github.com/jsbridge/jsbridge/wire"
)

// Defaults of Config and of its subscriptions: a zero field means the
// default below. They are the defaults of the packages that own each knob
// (deliver, breaker, wire), spelled once here for the consumer; `consumer
// run`'s flags default to the same values (a test keeps them equal, and the
// README's flag table equal to the flags).
const (
	// DefaultStream is the JetStream stream the durable consumers read.
	DefaultStream = wire.DefaultEventsStream
	// DefaultDLQStream is the JetStream stream holding dead letters on
	// "dlq.<subscription>.>"; Provision creates it when missing.
	DefaultDLQStream = wire.DefaultDLQStream
	// DefaultReplicas is the replica count of the dead-letter stream and
	// the durable consumers the consumer creates (1).
	DefaultReplicas = 1

	// DefaultTimeout bounds one POST (10 s).
	DefaultTimeout = deliver.DefaultTimeout
	// DefaultAckWait is the durable consumers' AckWait (30 s).
	DefaultAckWait = deliver.DefaultAckWait
	// DefaultMaxDeliver is the attempts per event before it is
	// dead-lettered (10).
	DefaultMaxDeliver = deliver.DefaultMaxDeliver
	// DefaultMaxInFlight is the concurrent deliveries per subscription (64).
	DefaultMaxInFlight = deliver.DefaultMaxInFlight
	// DefaultMaxAckPending is the durable consumers' MaxAckPending (1000,
	// or MaxInFlight when larger).
	DefaultMaxAckPending = deliver.DefaultMaxAckPending

	// DefaultBreakerFailures is the consecutive failures that open an
	// endpoint's circuit breaker (5).
	DefaultBreakerFailures = breaker.DefaultConsecutiveFailures
	// DefaultBreakerOpenTimeout is how long an open breaker waits before a
	// probe (30 s).
	DefaultBreakerOpenTimeout = breaker.DefaultOpenTimeout
	// DefaultPartitions is the partition count of ordered delivery (16).
	DefaultPartitions = deliver.DefaultPartitions
	// DefaultLeaseTTL is the lifetime of a partition lease unless renewed
	// (10 s).
	DefaultLeaseTTL = deliver.DefaultLeaseTTL
)

// DefaultBackOff returns the retry delays of a subscription without its
// own: 1 s, 5 s, 30 s, 2 min, 5 min, the last repeating
// (deliver.DefaultBackOff).
func DefaultBackOff() []time.Duration { return deliver.DefaultBackOff() }

// ErrInvalidConfig is wrapped by Config.Validate and New when a Config
// field is bad; the message names the field and the value (never a secret
// or a header value).
var ErrInvalidConfig = errors.New("invalid consumer config")

// Config configures a Consumer: every knob of `consumer run` that is not
// about connecting or the ops port. The zero value of every field but
// Subscriptions means its default.
type Config struct {
	// Subscriptions are the webhook endpoints, each fed by its own durable
	// pull consumer (see deliver.Subscription for their fields and
	// defaults). At least one; names unique. Required.
	Subscriptions []deliver.Subscription
	// Breaker configures every endpoint's circuit breaker (one per
	// endpoint, shared by the subscriptions that POST to it). Zero fields
	// take breaker's defaults (DefaultBreakerFailures,
	// DefaultBreakerOpenTimeout, ...).
	Breaker breaker.Settings
	// Stream is the JetStream stream the durable consumers are created on;
	// the bridge creates it, the consumer only waits for it. Default
	// "EVENTS".
	Stream string
	// DLQStream is the JetStream stream dead letters are written to;
	// Provision creates it when missing. Default "DLQ". It must differ from
	// Stream.
	DLQStream string
	// Replicas is the replica count of the dead-letter stream and of the
	// durable consumers Provision creates: 1 on a standalone server, 3 on a
	// cluster (at most Stream's). Existing ones keep their own, with a
	// warning. Default 1.
	Replicas int
	// StartupTimeout bounds Provision's (and so Start's) waiting for the
	// dead-letter stream and for Stream: past it Provision fails with an
	// error wrapping ErrStartupTimeout that names what is missing.
	// Default 0: wait until the context ends.
	StartupTimeout time.Duration
	// HTTPClient sends the webhooks (see deliver.Config.HTTPClient: it must
	// be nil or use an *http.Transport). Default: deliver's keep-alive
	// client without proxy.
	HTTPClient *http.Client
	// Logger receives the consumer's records (keys subscription, endpoint,
	// event_id, attempt). Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the delivery and breaker metrics
	// (jsbridge_consumer_*; see the README). Default nil: no metrics.
	Registerer prometheus.Registerer
	// TracerProvider makes the span of each delivery attempt (see
	// deliver.Config.TracerProvider). Default: OpenTelemetry's global
	// provider, a no-op until the application installs one.
	TracerProvider trace.TracerProvider
	// Partitions is the number of partitions of the partitioned copy of
	// Stream that ordered subscriptions read (see deliver.Config.Partitions
	// and docs/ordering.md): at most this many replicas share an ordered
	// subscription's work; the same on every replica. Default
	// DefaultPartitions.
	Partitions int
	// ReplicaID names this replica in partition leases, `consumer status`
	// and the Jsbridge-Replica webhook header: [A-Za-z0-9_-]+. Default
	// "<hostname>-<pid>-<random>".
	ReplicaID string
	// LeaseTTL is how long a partition lease and a membership heartbeat
	// live unless renewed: a killed replica's partitions move after at
	// most LeaseTTL plus AckWait. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Attempts, when set, receives a record of every attempt after it ended
	// (see deliver.Config.Attempts; deliver.NewAttemptLog keeps them in a
	// JetStream stream for `consumer trace`). Default nil: no records.
	Attempts deliver.AttemptRecorder
}

// Validate checks c without touching anything: nil, or an error wrapping
// ErrInvalidConfig that names the first bad field and its value
// (Subscriptions[i] with the subscription's own field, Breaker.<field>,
// Stream, DLQStream, Replicas, StartupTimeout). It reads the
// subscriptions' TLS files. New calls it.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns c with every zero field set to its default, or an
// error wrapping ErrInvalidConfig naming the first bad field and its value.
func (c Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return c, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if len(c.Subscriptions) == 0 {
		return bad("Subscriptions: none given (want at least one)")
	}
	names := make(map[string]int, len(c.Subscriptions))
	for i, s := range c.Subscriptions {
		if err := s.Validate(); err != nil {
			return c, fmt.Errorf("%w: Subscriptions[%d]: %w", ErrInvalidConfig, i, err)
		}
		if j, dup := names[s.Name]; dup {
			return bad("Subscriptions[%d].Name %q: used by Subscriptions[%d] too (a name is a durable consumer's)", i, s.Name, j)
		}
		names[s.Name] = i
	}
	if err := c.Breaker.Validate(); err != nil {
		return c, fmt.Errorf("%w: Breaker: %w", ErrInvalidConfig, err)
	}
	c.Stream = or(c.Stream, DefaultStream)
	c.DLQStream = or(c.DLQStream, DefaultDLQStream)
	for _, f := range []struct{ name, v string }{{"Stream", c.Stream}, {"DLQStream", c.DLQStream}} {
		// The characters JetStream refuses in a stream name.
		if strings.ContainsAny(f.v, ".*> \t\r\n/\\") {
			return bad("%s %q: a JetStream stream name may not contain '.', '*', '>', whitespace or path separators", f.name, f.v)
		}
	}
	if c.Stream == c.DLQStream {
		return bad("DLQStream %q: the same stream as Stream (dead letters need a stream of their own)", c.DLQStream)
	}
	if c.Replicas < 0 {
		return bad("Replicas %d is negative (want 1 on a standalone server, 3 on a cluster)", c.Replicas)
	}
	if c.StartupTimeout < 0 {
		return bad("StartupTimeout %s is negative (0 waits until the context ends)", c.StartupTimeout)
	}
	c.Replicas = or(c.Replicas, DefaultReplicas)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// or returns v, or def when v is the zero value.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
