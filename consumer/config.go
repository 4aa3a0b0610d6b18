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
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// Defaults of Config and of its subscriptions: a zero field means the
// default below. They are spelled once here for the consumer (the engine
// behind it and the breaker take the same values); `consumer run`'s flags
// default to the same values (a test keeps them equal, and docs/cli.md's
// flag table equal to the flags).
const (
	// DefaultStream is the JetStream stream the consumer reads events from.
	DefaultStream = wire.DefaultEventsStream
	// DefaultDLQStream is the JetStream stream holding dead letters on
	// "dlq.<subscription>.>"; Provision creates it when missing.
	DefaultDLQStream = wire.DefaultDLQStream
	// DefaultReplicas is the replica count of the dead-letter stream and
	// the buckets the consumer creates (1).
	DefaultReplicas = 1

	// DefaultTimeout bounds one POST (10 s).
	DefaultTimeout = subscription.DefaultTimeout
	// DefaultHandOver is the longest a partition's hand-over takes with
	// the default lease TTL: twice DefaultLeaseTTL (20 s), the time from an
	// attempt on a replica that dies to the next owner's attempt, before its
	// backoff. It is what a receiver sets as webhook.RetryProfile.HandOver.
	DefaultHandOver = 2 * DefaultLeaseTTL
	// DefaultAckWait was a subscription's AckWait (30 s).
	//
	// Deprecated: Subscription.AckWait is ignored. Removed in the next
	// release.
	DefaultAckWait = subscription.DefaultAckWait
	// DefaultMaxDeliver is the attempts per event before it is
	// dead-lettered (10).
	DefaultMaxDeliver = subscription.DefaultMaxDeliver
	// DefaultMaxInFlight is the concurrent deliveries per subscription (64).
	DefaultMaxInFlight = subscription.DefaultMaxInFlight
	// DefaultMaxAckPending bounds the events a partition holds in hand
	// for a subscription (1000, or MaxInFlight when larger).
	DefaultMaxAckPending = subscription.DefaultMaxAckPending

	// DefaultBreakerFailures is the consecutive failures that open an
	// endpoint's circuit breaker (5).
	DefaultBreakerFailures = breaker.DefaultConsecutiveFailures
	// DefaultBreakerOpenTimeout is how long an open breaker waits before a
	// probe (30 s).
	DefaultBreakerOpenTimeout = breaker.DefaultOpenTimeout
	// DefaultPartitions is the partition count (16): the unit of
	// ownership among the consumer's replicas.
	DefaultPartitions = 16
	// DefaultLeaseTTL is the lifetime of a partition lease unless renewed
	// (10 s).
	DefaultLeaseTTL = owner.DefaultLeaseTTL
	// DefaultOrderStuckAfter is how long a receiver's order gate may
	// refuse an ordered stream's head before it is dead-lettered and its
	// stream parked (5 min, Config.OrderStuckAfter).
	DefaultOrderStuckAfter = attempt.DefaultOrderStuckAfter

	// DefaultAttemptsStream is the JetStream stream of the attempts
	// record (AttemptsConfig.Stream).
	DefaultAttemptsStream = wire.DefaultAttemptsStream
	// DefaultAttemptsMaxAge is how long attempt records are kept (72 h).
	DefaultAttemptsMaxAge = attemptlog.DefaultMaxAge
	// DefaultAttemptsMaxBytes bounds the attempts stream's size (1 GiB);
	// the oldest records go first.
	DefaultAttemptsMaxBytes = attemptlog.DefaultMaxBytes
)

// DefaultBackOff returns the retry delays of a subscription without its
// own: 1 s, 5 s, 30 s, 2 min, 5 min, the last repeating.
func DefaultBackOff() []time.Duration { return subscription.DefaultBackOff() }

// ErrInvalidConfig is wrapped by Config.Validate and New when a Config
// field is bad; the message names the field and the value (never a secret
// or a header value).
var ErrInvalidConfig = errors.New("invalid consumer config")

// Config configures a Consumer: every knob of `consumer run` that is not
// about connecting or the ops port. The zero value of every field but
// Subscriptions means its default.
//
// Connect the NATS connection the Consumer uses with
// nats.ReconnectBufSize(-1), as `consumer run` does: with nats.go's
// reconnect buffer, an ack written while the connection is down goes out
// after the reconnect, possibly after an ordered partition's lease moved
// to another replica, which then holds the message as its own. The
// Consumer checks the connection before each ack and InProgress of an
// ordered partition and sends none while it is not connected (the message
// stays pending and comes back; receivers deduplicate), but only a
// connection without the buffer closes the window between that check and
// the write.
type Config struct {
	// Subscriptions are the webhook endpoints (see Subscription for
	// their fields and defaults). At
	// least one; names unique. Required, unless SubscriptionStore is set.
	Subscriptions []Subscription
	// SubscriptionStore, when set, is where the subscriptions come from
	// instead of Subscriptions (which must then be empty): the Consumer
	// watches its bucket while it runs and applies every change within
	// about a second, without a restart (docs/subscriptions-kv.md). It
	// needs the keyring the subscriptions were sealed with. Default nil.
	SubscriptionStore *SubscriptionStore
	// Breaker configures every endpoint's circuit breaker (one per
	// endpoint, shared by the subscriptions that POST to it). Zero fields
	// take breaker's defaults (DefaultBreakerFailures,
	// DefaultBreakerOpenTimeout, ...).
	Breaker breaker.Settings
	// Stream is the JetStream stream the events are read from (with
	// AllowDirect); the bridge creates it, the consumer only waits for
	// it. Default "EVENTS".
	Stream string
	// DLQStream is the JetStream stream dead letters are written to;
	// Provision creates it when missing. Default "DLQ". It must differ from
	// Stream.
	DLQStream string
	// Replicas is the replica count of the dead-letter stream and of the
	// buckets (positions, leases) the consumer creates: 1 on a standalone server, 3 on a
	// cluster (at most Stream's). Existing ones keep their own, with a
	// warning. Default 1.
	Replicas int
	// StartupTimeout bounds Provision's (and so Start's) waiting for the
	// dead-letter stream and for Stream: past it Provision fails with an
	// error wrapping ErrStartupTimeout that names what is missing.
	// Default 0: wait until the context ends.
	StartupTimeout time.Duration
	// HTTPClient sends the webhooks. Redirects are never followed (a 3xx is
	// a failure). For subscriptions without AllowPrivate its Transport must
	// be nil or an *http.Transport (a copy gets the dial-time address check
	// and no proxy), and for subscriptions with TLS files too (a copy gets
	// their certificates). Default: a keep-alive client with connect and
	// TLS handshake timeouts and no proxy.
	HTTPClient *http.Client
	// Logger receives the consumer's records (keys subscription, endpoint,
	// event_id, attempt). Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the delivery and breaker metrics
	// (jsbridge_consumer_*; see docs/observability.md). Default nil: no metrics.
	Registerer prometheus.Registerer
	// TracerProvider makes the span of each delivery attempt (one per
	// attempt, continuing the trace in the message's traceparent header,
	// which the POST carries on). Default: OpenTelemetry's global
	// provider, a no-op until the application installs one.
	TracerProvider trace.TracerProvider
	// Partitions is the number of partitions the events of Stream are
	// hashed into by stream (docs/ordering.md), each leased by one
	// replica at a time: at most this many replicas share the work; the
	// same on every replica. Default DefaultPartitions.
	Partitions int
	// ReplicaID names this replica in partition leases, `consumer status`
	// and the Jsbridge-Replica webhook header: [A-Za-z0-9_-]+. Default
	// "<hostname>-<pid>-<random>", chosen by New (Consumer.Config shows
	// it); it also names the attempt records unless Attempts.Replica does.
	ReplicaID string
	// LeaseTTL is how long a partition lease and a membership heartbeat
	// live unless renewed: a killed or frozen replica's partitions move
	// after at most LeaseTTL (the new owner reads on from the partition's
	// record). Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// OrderStuckAfter bounds how long the head of an ordered stream is
	// retried while the receiver's order gate refuses it (409
	// Jsbridge-Order gap or in-progress): past it the head is
	// dead-lettered and its stream parked, whatever OnDeadLetter says (the
	// order-stuck state: `consumer status`, the metric
	// jsbridge_consumer_streams_order_stuck), until `consumer dlq replay`
	// or `consumer dlq skip`. Default DefaultOrderStuckAfter; negative is
	// an error.
	OrderStuckAfter time.Duration
	// Attempts, when set, keeps a record of the attempts that failed
	// (and, with AttemptsConfig.Record AttemptsRecordAll, of every attempt)
	// in a JetStream stream for `consumer trace` and TraceEvent (see
	// AttemptsConfig). Default nil: no records.
	Attempts *AttemptsConfig
	// Health configures the automatic disabling of subscriptions (410
	// Gone, sustained failure) and its operational webhook (see
	// HealthConfig).
	Health HealthConfig
}

// AttemptsConfig configures the attempts record: the outcome of the
// attempts Record keeps (by default every attempt but a success on the
// first one) written, after each ended, to a JetStream stream bounded by
// age and size,
// asynchronously (a delivery never waits for or fails on its record; a
// record that finds the queue full or that JetStream does not store is
// dropped and counted in
// jsbridge_consumer_attempt_records_dropped_total{reason}). Provision
// creates the stream when missing (with Config.Replicas) and fails with
// ErrAttemptsSubjects when an existing one does not hold its subjects.
// Zero fields take their defaults.
type AttemptsConfig struct {
	// Stream is the JetStream stream. Default DefaultAttemptsStream.
	Stream string
	// MaxAge is how long records are kept when Provision creates the
	// stream. Default DefaultAttemptsMaxAge (72 h).
	MaxAge time.Duration
	// MaxBytes bounds the stream's size when Provision creates it; the
	// oldest records go first. Default DefaultAttemptsMaxBytes (1 GiB).
	MaxBytes int64
	// Replica names this process in its records. Default
	// Config.ReplicaID, so that records and partition leases name a
	// replica alike.
	Replica string
	// Record says which attempts are recorded. Default (""):
	// AttemptsRecordFailures. Another value than the two is an error
	// (ErrInvalidConfig).
	Record AttemptsRecord
}

// AttemptsRecord says which attempts the attempts record keeps
// (AttemptsConfig.Record, `consumer run --attempts-record`).
type AttemptsRecord = attemptlog.Mode

const (
	// AttemptsRecordFailures records every attempt that did not succeed,
	// and the success that ends a series with a failure in it (an attempt
	// after the first, or one after an attempt retried in place), so the
	// trace of an event that had trouble shows how it ended. A success on
	// the first attempt is counted in
	// jsbridge_consumer_deliveries_total{outcome="ack"} and not recorded:
	// on the success path the record would store every event a second
	// time, about as big as on the events stream. `consumer trace` tells
	// such an event's delivery from the positions bucket (TraceEvent,
	// EventTrace.Deliveries). The default.
	AttemptsRecordFailures AttemptsRecord = attemptlog.ModeFailures
	// AttemptsRecordAll records every attempt, one record per webhook.
	AttemptsRecordAll AttemptsRecord = attemptlog.ModeAll
)

// ErrAttemptsSubjects is wrapped by Provision (and Start) when the
// existing attempts stream does not hold the attempts subjects
// (attempts.>).
var ErrAttemptsSubjects = attemptlog.ErrSubjects

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
	if len(c.Subscriptions) == 0 && c.SubscriptionStore == nil {
		return bad("Subscriptions: none given (want at least one, or a SubscriptionStore)")
	}
	if len(c.Subscriptions) > 0 && c.SubscriptionStore != nil {
		return bad("Subscriptions: %d given with a SubscriptionStore (give one source)", len(c.Subscriptions))
	}
	names := make(map[string]int, len(c.Subscriptions))
	for i, s := range c.Subscriptions {
		if err := s.engine().Validate(); err != nil {
			return c, fmt.Errorf("%w: Subscriptions[%d]: %w", ErrInvalidConfig, i, err)
		}
		if err := s.checkLocalhost(); err != nil {
			return c, fmt.Errorf("%w: Subscriptions[%d]: %w", ErrInvalidConfig, i, err)
		}
		if j, dup := names[s.Name]; dup {
			return bad("Subscriptions[%d].Name %q: used by Subscriptions[%d] too (a name is a subscription's position)", i, s.Name, j)
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
	if a := c.Attempts; a != nil && (a.MaxAge < 0 || a.MaxBytes < 0) {
		return bad("Attempts.MaxAge %s, Attempts.MaxBytes %d: want 0 (the default) or more", a.MaxAge, a.MaxBytes)
	}
	if a := c.Attempts; a != nil {
		if _, err := attemptlog.ParseMode(string(a.Record)); err != nil {
			return bad("Attempts.Record %q: want %q (the default) or %q", a.Record, AttemptsRecordFailures, AttemptsRecordAll)
		}
	}
	if err := c.Health.validate(); err != nil {
		return bad("%v", err)
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
