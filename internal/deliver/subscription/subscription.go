package subscription

import (
	"cmp"
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

// ErrInvalidSubscription is wrapped by Subscription.Validate when a
// subscription is misconfigured. The message names the subscription, the
// field and the value (never a secret or a header value).
var ErrInvalidSubscription = errors.New("invalid subscription")

// The enums and defaults below are the front door's (consumer.BodyMode,
// consumer.Ordering, consumer.DeadLetterPolicy, consumer.Default*), which
// document what each means to an application.

// BodyMode selects the webhook body's CloudEvents content mode.
type BodyMode string

// BodyMode values: the CloudEvents HTTP binding's structured content
// mode (the JSON envelope, the default) and binary content mode (the
// data as the body, the attributes as ce-* headers).
const (
	BodyStructured BodyMode = "structured"
	BodyBinary     BodyMode = "binary"
)

// Ordering says what order a subscription's endpoint sees events in.
type Ordering string

// Ordering values: each source stream in version order across the
// replicas (docs/ordering.md; the default), or none (maximum
// parallelism, even within a stream).
const (
	OrderingStream Ordering = "stream"
	OrderingNone   Ordering = "none"
)

// DeadLetterPolicy says what an ordered subscription does with the later
// events of a stream whose event was dead-lettered.
type DeadLetterPolicy string

// DeadLetterPolicy values: park the stream until an operator replays or
// skips its dead-lettered head (the default), or go on with the next
// version.
const (
	DeadLetterPark DeadLetterPolicy = "park"
	DeadLetterSkip DeadLetterPolicy = "skip"
)

// DefaultOrdering is the Ordering of a subscription without one.
const DefaultOrdering = OrderingStream

// AckWaitIgnored is the warning a consumer logs, once per subscription,
// for a subscription that sets the deprecated AckWait (ack_wait).
const AckWaitIgnored = "ack_wait is deprecated and ignored: the shared engine does not use it (its reader acks nothing, so nothing is redelivered after a wait); remove it from the subscription"

// Subscription defaults: what WithDefaults sets a zero field to.
const (
	// DefaultTimeout bounds one POST: 10 s.
	DefaultTimeout = 10 * time.Second
	// DefaultAckWait was the durable consumers' AckWait: 30 s.
	//
	// Deprecated: Subscription.AckWait is ignored; nothing sets it.
	// Removed in the next release.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is the attempts of one event before it is
	// dead-lettered: 10.
	DefaultMaxDeliver = 10
	// DefaultMaxInFlight is the concurrent POSTs per consumer process: 64.
	DefaultMaxInFlight = 64
	// DefaultMaxAckPending is the events a partition holds in hand for a
	// subscription: 1000, or MaxInFlight when larger.
	DefaultMaxAckPending = 1000
)

// DefaultBackOff returns the retry backoff of a subscription without one:
// 1 s, 5 s, 30 s, 2 min, 5 min. The delay after attempt n is entry n-1, the
// last entry repeating.
func DefaultBackOff() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute}
}

// Subscription is one webhook endpoint and the events of the events
// stream it takes, as the engine runs it. Zero fields take their
// defaults (WithDefaults). consumer.Subscription, which converts into
// it field by field, documents each field as an application sets it.
type Subscription struct {
	// Name is the subscription's name in its positions, logs and
	// metrics: [A-Za-z0-9_-]+. Required.
	Name string
	// FilterSubjects select the events ("events.order.>"). At least one.
	FilterSubjects []string
	// URL is the endpoint, http or https. Required; never logged whole
	// (breaker.Endpoint).
	URL string
	// Scheme is the signature scheme. Default webhook.SchemeStandard.
	Scheme webhook.Scheme
	// Secrets sign every request (several during a rotation). At least one.
	Secrets []string
	// Body is the content mode. Default BodyStructured.
	Body BodyMode
	// Headers are extra request headers; not those the engine sets
	// (reservedHeaders, ce-*).
	Headers map[string]string
	// Timeout bounds one POST. Default DefaultTimeout.
	Timeout time.Duration
	// AckWait is ignored.
	//
	// Deprecated: accepted so that an earlier release's configuration
	// loads; the consumer warns (AckWaitIgnored). Removed in the next
	// release.
	AckWait time.Duration
	// MaxDeliver is the POSTs of one event before a retryable failure is
	// dead-lettered. Default DefaultMaxDeliver; -1: no limit.
	MaxDeliver int
	// BackOff is the delay before each retry, the last entry repeating,
	// unless the endpoint sent Retry-After. Default DefaultBackOff().
	BackOff []time.Duration
	// MaxInFlight is the concurrent POSTs per consumer process. Default
	// DefaultMaxInFlight.
	MaxInFlight int
	// RateLimit caps the POSTs per consumer replica, in requests per
	// second (the engine's throttle lowers it on 429 and 503). Default 0:
	// no cap.
	RateLimit float64
	// MaxAckPending bounds the events a partition holds in hand for the
	// subscription; past it, it reads on from a cursor. Default
	// DefaultMaxAckPending; at least MaxInFlight.
	MaxAckPending int
	// AllowPrivate lets the endpoint be on a loopback, private, shared,
	// link-local or reserved address (ErrForbiddenAddress), and over
	// plain http. Default false.
	AllowPrivate bool
	// AllowHTTP lets the endpoint use plain http on a public address
	// (ErrPlainHTTP). Default false.
	AllowHTTP bool
	// TLS adds a client certificate and a CA bundle; https only.
	TLS TLSFiles
	// Ordering is OrderingStream (default) or OrderingNone.
	Ordering Ordering
	// OnDeadLetter is an ordered subscription's DeadLetterPolicy. Default
	// DeadLetterPark.
	OnDeadLetter DeadLetterPolicy
	// Start is where the subscription's position begins when it is first
	// provisioned. Default StartNew.
	Start Start
}

// Ordered reports whether s delivers each stream in order (OrderingStream,
// the default).
func (s Subscription) Ordered() bool {
	return cmp.Or(s.Ordering, DefaultOrdering) == OrderingStream
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
	s.Scheme = cmp.Or(s.Scheme, webhook.SchemeStandard)
	s.Body = cmp.Or(s.Body, BodyStructured)
	s.Timeout = cmp.Or(s.Timeout, DefaultTimeout)
	s.MaxDeliver = cmp.Or(s.MaxDeliver, DefaultMaxDeliver)
	if len(s.BackOff) == 0 {
		s.BackOff = DefaultBackOff()
	}
	s.MaxInFlight = cmp.Or(s.MaxInFlight, DefaultMaxInFlight)
	s.MaxAckPending = cmp.Or(s.MaxAckPending, max(DefaultMaxAckPending, s.MaxInFlight))
	s.Ordering = cmp.Or(s.Ordering, DefaultOrdering)
	s.OnDeadLetter = cmp.Or(s.OnDeadLetter, DeadLetterPark)
	return s
}

// reservedHeaders are set by the engine itself; a subscription cannot override
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
