package consumer

import (
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

// BodyMode selects the webhook body's CloudEvents content mode.
type BodyMode string

const (
	// BodyStructured sends the CloudEvents JSON envelope with the event data
	// byte for byte in "data" (Content-Type application/cloudevents+json).
	// The default. Source: CloudEvents HTTP binding, structured content mode.
	BodyStructured BodyMode = "structured"
	// BodyBinary sends the event data as the body (Content-Type
	// application/json) and the attributes as ce-* headers. Source:
	// CloudEvents HTTP binding, binary content mode.
	BodyBinary BodyMode = "binary"
)

// Ordering says what order a subscription's endpoint sees events in.
type Ordering string

const (
	// OrderingStream delivers each source stream in version order across
	// every consumer replica: version v+1 is not sent before v was
	// accepted (2xx) or dead-lettered, a failing event is retried in place
	// (its stream waits, others go on), and never two replicas deliver one
	// stream at once (docs/ordering.md). The default.
	OrderingStream Ordering = "stream"
	// OrderingNone delivers with maximum parallelism: the events of one
	// stream sent in parallel like any others (up to MaxInFlight per
	// replica), each retried with its own backoff: a receiver gets no
	// order, not even within a stream.
	OrderingNone Ordering = "none"
)

// DefaultOrdering is the Ordering of a subscription without one.
const DefaultOrdering = OrderingStream

// DeadLetterPolicy says what an ordered subscription does with the later
// events of a stream whose event was dead-lettered.
type DeadLetterPolicy string

const (
	// DeadLetterPark holds the stream's later events (un-acked, not
	// delivered) until an operator replays the dead-lettered head
	// (Consumer.Replay, `consumer dlq replay`) or skips it
	// (DeadLetters.Skip, `consumer dlq skip`). The default.
	DeadLetterPark DeadLetterPolicy = "park"
	// DeadLetterSkip lets the stream go on with the next version.
	DeadLetterSkip DeadLetterPolicy = "skip"
)

// TLSFiles configures the client side of a subscription's TLS connections:
// a client certificate for endpoints that require one (mutual TLS) and the
// CAs that verify the endpoint's certificate. The files are PEM and are
// read once, by Config.Validate and New; a later change needs a restart.
// The zero value uses no client certificate and the system roots.
type TLSFiles struct {
	// ClientCertFile is the client certificate chain presented to the
	// endpoint, leaf first. Set with ClientKeyFile or not at all.
	ClientCertFile string
	// ClientKeyFile is the private key of ClientCertFile (PKCS #1, PKCS #8
	// or SEC 1).
	ClientKeyFile string
	// CAFile is a bundle of CA certificates that verify the endpoint's
	// certificate, in place of the system roots. Default "": system roots.
	CAFile string
}

// Errors a subscription's Validate wraps (with ErrInvalidConfig) for its
// URL; a delivery refused at dial time wraps ErrForbiddenAddress too (and
// is dead-lettered).
var (
	// ErrForbiddenAddress: the endpoint is (or resolves to) a loopback,
	// private, shared, link-local (cloud metadata) or reserved address,
	// and the subscription does not set AllowPrivate.
	ErrForbiddenAddress = subscription.ErrForbiddenAddress
	// ErrPlainHTTP: the URL is plain http and neither AllowHTTP nor
	// AllowPrivate is set.
	ErrPlainHTTP = subscription.ErrPlainHTTP
)

// Subscription is one webhook endpoint and the events of the events
// stream it takes. Zero fields take their defaults.
type Subscription struct {
	// Name is the subscription's name in its positions, logs and
	// metrics: [A-Za-z0-9_-]+. Required.
	Name string
	// FilterSubjects select the events, e.g. "events.order.>" (a category)
	// or "events.*.*.OrderPlaced" (an event name). At least one is required.
	FilterSubjects []string
	// URL is the endpoint, http or https. Required. Userinfo and query are
	// sent but never logged (see breaker.Endpoint).
	URL string
	// Scheme is the signature scheme. Default webhook.SchemeStandard.
	Scheme webhook.Scheme
	// Secrets sign every request (several during a rotation). At least one
	// is required. SchemeStandard takes whsec_ secrets (HMAC-SHA256, "v1"
	// signatures) and whsk_ ed25519 secret keys ("v1a" signatures, which
	// receivers verify with the whpk_ public key), in any mix.
	Secrets []string
	// Body is the content mode. Default BodyStructured.
	Body BodyMode
	// Headers are extra request headers (e.g. Authorization). They cannot
	// replace the headers the consumer sets (Content-Type,
	// Idempotency-Key, User-Agent, the signature and ce-* headers).
	Headers map[string]string
	// Timeout bounds one POST, connection to end of response body.
	// Default DefaultTimeout (10 s). An ordered POST is also cut at its
	// partition's lease deadline (docs/ordering.md, "The POST's time and
	// the lease"), so a stale replica's POST never overlaps the next
	// owner's.
	Timeout time.Duration
	// AckWait was the durable consumers' JetStream AckWait.
	//
	// Deprecated: the shared engine does not use it (its reader acks
	// nothing, so nothing is redelivered after a wait). It is accepted and
	// ignored, New logging one warning per subscription that sets it, so
	// that a configuration or a subscriptions bucket document of an
	// earlier release still loads. Removed in the next release.
	AckWait time.Duration
	// MaxDeliver is the number of delivery attempts of one event: a
	// retryable failure on attempt MaxDeliver or later is dead-lettered.
	// Default DefaultMaxDeliver (10); -1 means no limit. The attempt is
	// JetStream's delivery count, so a message returned unsent (breaker
	// open, shutdown) uses one up, but it is dead-lettered only after a
	// POST failed.
	MaxDeliver int
	// BackOff is the delay before each retry: after attempt n the message
	// waits BackOff[n-1], the last entry repeating, unless the endpoint
	// sent Retry-After. Default DefaultBackOff().
	BackOff []time.Duration
	// MaxInFlight is the number of concurrent deliveries per consumer
	// process, and the client-side pull buffer. Default DefaultMaxInFlight
	// (64). With OrderingNone the events of one stream are delivered in
	// parallel too; ordered, one after another.
	MaxInFlight int
	// RateLimit caps the POSTs to the endpoint, in requests per second per
	// consumer replica. Default 0: no cap. A 429 (or a 503 with
	// Retry-After) lowers the rate for a while, whatever it is
	// (docs/failing-endpoints.md, "Throttling").
	RateLimit float64
	// MaxAckPending bounds the events a partition holds in hand for the
	// subscription (out for delivery or waiting for a delayed retry);
	// past it the subscription reads on from a cursor. Default
	// DefaultMaxAckPending (1000); at least MaxInFlight.
	MaxAckPending int
	// AllowPrivate lets the endpoint be on a loopback, private, shared,
	// link-local (cloud metadata) or reserved address, and over plain
	// http. Default false: an IP literal in those ranges, and "localhost"
	// or a name under ".localhost", are rejected by Validate, and another
	// name resolving to one is refused when dialled (the delivery is
	// dead-lettered, nothing is sent).
	AllowPrivate bool
	// AllowHTTP lets the endpoint use plain http:// on a public address.
	// Default false: only https (or http with AllowPrivate).
	AllowHTTP bool
	// TLS adds a client certificate (mutual TLS) and a CA bundle for the
	// endpoint's certificate. Default: none, system roots. Only for https
	// URLs. It combines with the address check of AllowPrivate false.
	TLS TLSFiles
	// Ordering is OrderingStream (default DefaultOrdering) or
	// OrderingNone. An ordered subscription's filters must start with the
	// events' subject prefix ("events.").
	Ordering Ordering
	// OnDeadLetter is what an ordered subscription does after dead-lettering
	// an event: DeadLetterPark (default) or DeadLetterSkip. Not used with
	// OrderingNone (the stream always goes on).
	OnDeadLetter DeadLetterPolicy
	// Start is where the subscription begins when it is first
	// delivered: StartNew (the zero value: only events stored after
	// Provision, as webhook platforms do for a new endpoint), StartAll
	// (every event the events stream holds), StartAtTime(t) or
	// StartAtSequence(n) (the events stream's sequence, also for ordered
	// subscriptions). A subscription the positions bucket holds keeps its
	// position: Start applies only to one it does not know yet.
	// docs/subscriptions-start.md.
	Start Start
}

// Start says where a subscription begins when it is first delivered;
// the zero value is StartNew. Read one with ParseStart ("new",
// "all", "time:<RFC 3339>", "sequence:<n>"); String writes it back.
type Start = subscription.Start

// StartPolicy is the kind of a Start.
type StartPolicy = subscription.StartPolicy

// Start policies (see Subscription.Start).
const (
	// StartNew delivers only the events stored after the subscription
	// was first provisioned. The default.
	StartNew = subscription.StartNew
	// StartAll delivers every event the events stream still holds.
	StartAll = subscription.StartAll
	// StartTime delivers the events the events stream stored at or after
	// Start.Time.
	StartTime = subscription.StartTime
	// StartSequence delivers from the events stream's sequence
	// Start.Sequence on.
	StartSequence = subscription.StartSequence
)

// ErrInvalidStart is wrapped by ParseStart for a start it cannot read.
var ErrInvalidStart = subscription.ErrInvalidStart

// StartAtTime returns the Start at the first event the events stream
// stored at or after t.
func StartAtTime(t time.Time) Start { return subscription.StartAtTime(t) }

// StartAtSequence returns the Start at the events stream's sequence seq
// (1 or more).
func StartAtSequence(seq uint64) Start { return subscription.StartAtSequence(seq) }

// ParseStart reads "new", "all", "time:<RFC 3339>" or "sequence:<n>" ("" is
// "new"); an error wraps ErrInvalidStart and quotes the value.
func ParseStart(s string) (Start, error) { return subscription.ParseStart(s) }

// engine converts s into the engine's subscription.
func (s Subscription) engine() subscription.Subscription {
	return subscription.Subscription{
		Name: s.Name, FilterSubjects: s.FilterSubjects, URL: s.URL, Scheme: s.Scheme, Secrets: s.Secrets,
		Body: subscription.BodyMode(s.Body), Headers: s.Headers, Timeout: s.Timeout, AckWait: s.AckWait,
		MaxDeliver: s.MaxDeliver, BackOff: s.BackOff, MaxInFlight: s.MaxInFlight, MaxAckPending: s.MaxAckPending,
		RateLimit:    s.RateLimit,
		AllowPrivate: s.AllowPrivate, AllowHTTP: s.AllowHTTP,
		TLS:      subscription.TLSFiles{ClientCertFile: s.TLS.ClientCertFile, ClientKeyFile: s.TLS.ClientKeyFile, CAFile: s.TLS.CAFile},
		Ordering: subscription.Ordering(s.Ordering), OnDeadLetter: subscription.DeadLetterPolicy(s.OnDeadLetter),
		Start: s.Start,
	}
}

// engineSubscriptions converts subs into the engine's subscriptions.
func engineSubscriptions(subs []Subscription) []subscription.Subscription {
	out := make([]subscription.Subscription, len(subs))
	for i, s := range subs {
		out[i] = s.engine()
	}
	return out
}

// Validate reports the first misconfigured field of s, with defaults
// applied, as an error wrapping ErrInvalidConfig that names the
// subscription, the field and the value (and the webhook package's
// ErrInvalidScheme or ErrInvalidSecret for those fields). Secrets, header
// values and the URL's userinfo and query are never printed. It reads the
// TLS files, so a missing or unreadable one is reported here, by field and
// path. Config.Validate checks every subscription the same way.
func (s Subscription) Validate() error {
	if err := s.engine().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := s.checkLocalhost(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}
