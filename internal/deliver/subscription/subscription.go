package subscription

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrForbiddenAddress is egress.ErrForbiddenAddress: an endpoint address a
// subscription without AllowPrivate may not reach. Validate wraps it for
// an IP literal in the refused ranges; the engine's dial guard wraps it
// for a name that resolves to one.
var ErrForbiddenAddress = egress.ErrForbiddenAddress

// ErrPlainHTTP is wrapped by Validate when a subscription's URL is plain
// http and neither AllowHTTP nor AllowPrivate allows it.
var ErrPlainHTTP = errors.New("plain http")

// TLSFiles configures a subscription's client certificate and CA bundle
// (egress.TLSFiles).
type TLSFiles = egress.TLSFiles

// ErrInvalidSubscription is wrapped by Subscription.Validate, and by the
// engine's New and Fleet.Put, when a subscription is misconfigured. The message names the subscription, the
// field and the value (never a secret or a header value).
var ErrInvalidSubscription = errors.New("invalid subscription")

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
	// OrderingNone delivers with maximum parallelism: one durable pull
	// consumer shared by every replica, retries Nak'd with a delay, so a
	// retried event can arrive after its successors, and with several
	// replicas two events of one stream can be in flight at once.
	OrderingNone Ordering = "none"
)

// DeadLetterPolicy says what an ordered subscription does with the later
// events of a stream whose event was dead-lettered.
type DeadLetterPolicy string

const (
	// DeadLetterPark holds the stream's later events (un-acked, not
	// delivered) until an operator replays the dead-lettered head
	// (Consumer.Replay, `consumer dlq replay`) or skips it (Consumer.Skip,
	// `consumer dlq skip`). The default.
	DeadLetterPark DeadLetterPolicy = "park"
	// DeadLetterSkip lets the stream go on with the next version.
	DeadLetterSkip DeadLetterPolicy = "skip"
)

// DefaultOrdering is the Ordering of a subscription without one.
const DefaultOrdering = OrderingStream

// AckWaitIgnored is the warning a consumer logs, once per subscription,
// for a subscription that sets the deprecated AckWait (ack_wait).
const AckWaitIgnored = "ack_wait is deprecated and ignored: the shared engine does not use it (its reader acks nothing, so nothing is redelivered after a wait); remove it from the subscription"

// Subscription defaults: what WithDefaults sets a zero field to.
const (
	// DefaultTimeout bounds one POST (Subscription.Timeout): 10 s.
	DefaultTimeout = 10 * time.Second
	// DefaultAckWait was the durable consumers' AckWait: 30 s.
	//
	// Deprecated: Subscription.AckWait is ignored (see there); nothing
	// sets it. Removed in the next release.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is the attempts of one event before it is
	// dead-lettered (Subscription.MaxDeliver): 10.
	DefaultMaxDeliver = 10
	// DefaultMaxInFlight is the concurrent deliveries per consumer
	// process (Subscription.MaxInFlight): 64.
	DefaultMaxInFlight = 64
	// DefaultMaxAckPending is the durable consumers' MaxAckPending
	// (Subscription.MaxAckPending): 1000, or MaxInFlight when larger.
	DefaultMaxAckPending = 1000
)

// DefaultBackOff returns the retry backoff of a subscription without one:
// 1 s, 5 s, 30 s, 2 min, 5 min. The delay after attempt n is entry n-1, the
// last entry repeating.
func DefaultBackOff() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute}
}

// Subscription is one webhook endpoint fed by one durable pull consumer on
// the JetStream stream. Zero fields take their defaults.
type Subscription struct {
	// Name is the durable consumer's name and the subscription's name in
	// logs and metrics: [A-Za-z0-9_-]+. Required.
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
	// replace the headers deliver sets (Content-Type, Idempotency-Key,
	// User-Agent, the signature and ce-* headers).
	Headers map[string]string
	// Timeout bounds one POST, connection to end of response body.
	// Default 10 s. An ordered POST is also cut at its partition's lease
	// deadline by the lease fence (docs/ordering.md, "The POST's time and
	// the lease"), so a stale replica's POST never overlaps the next
	// owner's.
	Timeout time.Duration
	// AckWait was the durable consumers' JetStream AckWait.
	//
	// Deprecated: the shared engine does not use it: its reader reads the
	// events stream without a consumer that acks, so nothing is
	// redelivered after a wait. It is accepted (a subscriptions file or
	// bucket document of an earlier release still loads) and ignored; the
	// consumer warns once per subscription that sets it (AckWaitIgnored).
	// Removed in the next release.
	AckWait time.Duration
	// MaxDeliver is the number of delivery attempts of one event: a
	// retryable failure on attempt MaxDeliver or later is dead-lettered.
	// Default 10; -1 means no limit. The attempt is JetStream's delivery
	// count, so a message returned unsent (breaker open, shutdown) uses one
	// up, but it is dead-lettered only after a POST failed. The consumer
	// enforces it, not the server (see deadletter.Writer).
	MaxDeliver int
	// BackOff is the delay before each retry: after attempt n the message is
	// Nak'd with BackOff[n-1], the last entry repeating, unless the endpoint
	// sent Retry-After. Default DefaultBackOff().
	BackOff []time.Duration
	// MaxInFlight is the number of concurrent deliveries per consumer
	// process, and the client-side pull buffer. Default 64. With
	// OrderingNone the events of one stream are delivered in parallel like
	// any others, up to MaxInFlight here and MaxAckPending across the
	// replicas; ordered, they are delivered one after another (one lane
	// per stream), and events waiting for their turn do not count.
	MaxInFlight int
	// RateLimit caps the subscription's POSTs per consumer replica, in
	// requests per second. Default 0: no cap. A 429 or 503 from the
	// endpoint lowers the rate below it for a while (the engine's
	// throttle, internal/deliver/throttle).
	RateLimit float64
	// MaxAckPending is the durable consumer's MaxAckPending: the messages
	// out for delivery or waiting for a delayed retry, across all consumer
	// replicas. Default 1000; at least MaxInFlight.
	MaxAckPending int
	// AllowPrivate lets the endpoint be on a loopback, private, shared,
	// link-local (cloud metadata) or reserved address, and over plain
	// http. Default false: an IP literal in those ranges is rejected by
	// Validate, and a name resolving to one is refused when dialled
	// (ErrForbiddenAddress: the delivery is dead-lettered, nothing is sent).
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
	// Start is where the subscription's position begins when it is first
	// provisioned: StartNew (default, the zero value), StartAll,
	// StartTime or StartSequence. An existing position is kept. See Start.
	Start Start
}

// Ordered reports whether s delivers each stream in order (OrderingStream,
// the default).
func (s Subscription) Ordered() bool {
	return s.Ordering == OrderingStream || (s.Ordering == "" && DefaultOrdering == OrderingStream)
}

var validName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ValidName reports whether name matches [A-Za-z0-9_-]+, the rule for a
// subscription's Name (a JetStream consumer name and a KV key token); the
// engine holds its replica ids to it too.
func ValidName(name string) bool { return validName.MatchString(name) }

// WithDefaults returns a copy of s with zero fields set to their defaults
// (the Default* constants, DefaultBackOff, webhook.SchemeStandard,
// BodyStructured, DeadLetterPark; MaxAckPending at least MaxInFlight).
func (s Subscription) WithDefaults() Subscription {
	if s.Scheme == "" {
		s.Scheme = webhook.SchemeStandard
	}
	if s.Body == "" {
		s.Body = BodyStructured
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.MaxDeliver == 0 {
		s.MaxDeliver = DefaultMaxDeliver
	}
	if len(s.BackOff) == 0 {
		s.BackOff = DefaultBackOff()
	}
	if s.MaxInFlight == 0 {
		s.MaxInFlight = DefaultMaxInFlight
	}
	if s.MaxAckPending == 0 {
		s.MaxAckPending = max(DefaultMaxAckPending, s.MaxInFlight)
	}
	if s.Ordering == "" {
		s.Ordering = DefaultOrdering
	}
	if s.OnDeadLetter == "" {
		s.OnDeadLetter = DeadLetterPark
	}
	return s
}

// reservedHeaders are set by deliver itself; a subscription cannot override
// them (lower case).
var reservedHeaders = map[string]bool{
	"content-type":      true,
	"content-length":    true,
	"host":              true,
	"user-agent":        true,
	"transfer-encoding": true,
	strings.ToLower(wire.HeaderIdempotencyKey):      true,
	strings.ToLower(wire.HeaderReplica):             true,
	strings.ToLower(wire.HeaderPartition):           true,
	strings.ToLower(wire.HeaderLeaseEpoch):          true,
	strings.ToLower(webhook.HeaderWebhookID):        true,
	strings.ToLower(webhook.HeaderWebhookTimestamp): true,
	strings.ToLower(webhook.HeaderWebhookSignature): true,
	strings.ToLower(webhook.HeaderTimestamp):        true,
	strings.ToLower(webhook.HeaderSignature):        true,
}

// Validate reports the first misconfigured field, with defaults applied, as
// an error wrapping ErrInvalidSubscription that names the subscription, the
// field and the value (and the webhook package's ErrInvalidScheme or
// ErrInvalidSecret for those fields). Secrets, header values and the URL's
// userinfo and query are never printed. It reads the TLS files, so a
// missing or unreadable one is reported here, by field and path.
func (s Subscription) Validate() error {
	s = s.WithDefaults()
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("%w %q: %s: %s", ErrInvalidSubscription, s.Name, field, fmt.Sprintf(format, args...))
	}
	if !validName.MatchString(s.Name) {
		return bad("Name", "%q does not match [A-Za-z0-9_-]+", s.Name)
	}
	if len(s.FilterSubjects) == 0 {
		return bad("FilterSubjects", "none given (want at least one, e.g. \"events.order.>\")")
	}
	for i, f := range s.FilterSubjects {
		if f == "" || strings.ContainsAny(f, " \t\r\n") || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") || strings.Contains(f, "..") {
			return bad(fmt.Sprintf("FilterSubjects[%d]", i), "%q is not a valid subject filter", f)
		}
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return bad("URL", "%q is not an absolute http or https URL", breaker.Endpoint(s.URL))
	}
	if u.Scheme == "http" && !s.AllowHTTP && !s.AllowPrivate {
		return fmt.Errorf("%w %q: URL: %q is %w: use https, or allow it with AllowHTTP for a public address or AllowPrivate for a private one", ErrInvalidSubscription, s.Name, breaker.Endpoint(s.URL), ErrPlainHTTP)
	}
	if !s.AllowPrivate {
		if err := egress.CheckLiteralHost(u.Hostname()); err != nil {
			return fmt.Errorf("%w %q: URL: %q: %w: %v", ErrInvalidSubscription, s.Name, breaker.Endpoint(s.URL), ErrForbiddenAddress, err)
		}
	}
	if _, err := webhook.ParseScheme(string(s.Scheme)); err != nil {
		return fmt.Errorf("%w %q: Scheme: %w", ErrInvalidSubscription, s.Name, err)
	}
	if _, err := webhook.NewSigner(s.Scheme, s.Secrets...); err != nil {
		return fmt.Errorf("%w %q: Secrets: %w", ErrInvalidSubscription, s.Name, err)
	}
	if s.Body != BodyStructured && s.Body != BodyBinary {
		return bad("Body", "%q (want %q or %q)", s.Body, BodyStructured, BodyBinary)
	}
	for name, v := range s.Headers {
		if !validHeaderName(name) {
			return bad("Headers", "%q is not a valid header name", name)
		}
		if lower := strings.ToLower(name); reservedHeaders[lower] || strings.HasPrefix(lower, wire.HeaderPrefixCE) {
			return bad("Headers", "%q is set by deliver and cannot be overridden", name)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return bad("Headers", "value of %q contains CR, LF or NUL", name)
		}
	}
	if s.Timeout < 0 {
		return bad("Timeout", "%s must be positive", s.Timeout)
	}
	if s.MaxDeliver < -1 {
		return bad("MaxDeliver", "%d (want a positive number, or -1 for no limit)", s.MaxDeliver)
	}
	for i, d := range s.BackOff {
		if d <= 0 {
			return bad(fmt.Sprintf("BackOff[%d]", i), "%s must be positive", d)
		}
	}
	if s.MaxInFlight < 0 {
		return bad("MaxInFlight", "%d must be positive", s.MaxInFlight)
	}
	if math.IsNaN(s.RateLimit) || math.IsInf(s.RateLimit, 0) || s.RateLimit < 0 {
		return bad("RateLimit", "%v (want requests per second, more than 0; 0 for no limit)", s.RateLimit)
	}
	if s.MaxAckPending < s.MaxInFlight {
		return bad("MaxAckPending", "%d is below MaxInFlight %d", s.MaxAckPending, s.MaxInFlight)
	}
	if s.Ordering != OrderingStream && s.Ordering != OrderingNone {
		return bad("Ordering", "%q (want %q or %q)", s.Ordering, OrderingStream, OrderingNone)
	}
	if s.OnDeadLetter != DeadLetterPark && s.OnDeadLetter != DeadLetterSkip {
		return bad("OnDeadLetter", "%q (want %q or %q)", s.OnDeadLetter, DeadLetterPark, DeadLetterSkip)
	}
	if err := s.Start.validate(); err != nil {
		return bad("Start", "%v", err)
	}
	if !s.TLS.IsZero() && u.Scheme != "https" {
		return bad("TLS", "set for %q, which is not https", breaker.Endpoint(s.URL))
	}
	if _, err := s.TLS.Load(); err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidSubscription, s.Name, err)
	}
	return nil
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Equal reports whether a and b are the same subscription, field by field
// as written (defaults not applied: a zero field and its default differ).
// Starts are equal when they write the same (Start.String), so one time in
// two zones is one start. Every field but the ignored AckWait counts: the engine restarts a
// running subscription when anything but its signing changed.
func Equal(a, b Subscription) bool {
	return a.Name == b.Name && slices.Equal(a.FilterSubjects, b.FilterSubjects) && a.URL == b.URL && a.Scheme == b.Scheme &&
		slices.Equal(a.Secrets, b.Secrets) && a.Body == b.Body && maps.Equal(a.Headers, b.Headers) &&
		a.Timeout == b.Timeout && a.MaxDeliver == b.MaxDeliver && slices.Equal(a.BackOff, b.BackOff) &&
		a.MaxInFlight == b.MaxInFlight && a.RateLimit == b.RateLimit && a.MaxAckPending == b.MaxAckPending &&
		a.AllowPrivate == b.AllowPrivate && a.AllowHTTP == b.AllowHTTP && a.TLS == b.TLS && a.Ordering == b.Ordering &&
		a.OnDeadLetter == b.OnDeadLetter && a.Start.String() == b.Start.String()
}
