package subkv

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Document is a subscription as the bucket stores it: the value of the
// key named after it, JSON (docs/wire.md, "Subscriptions bucket").
// Durations are Go duration strings ("10s"); zero fields are omitted and
// mean the engine's defaults. The URL, the secrets and the header values
// are only in Sealed; Endpoint is the URL without userinfo and query, for
// listing.
type Document struct {
	Version        int      `json:"version"`
	Name           string   `json:"name"`
	FilterSubjects []string `json:"filter_subjects"`
	Endpoint       string   `json:"endpoint"`
	HeaderNames    []string `json:"header_names,omitempty"`
	Scheme         string   `json:"scheme,omitempty"`
	Body           string   `json:"body,omitempty"`
	Timeout        string   `json:"timeout,omitempty"`
	// AckWait is read from a document of an earlier release and never
	// written: Subscription.AckWait is deprecated and ignored.
	AckWait       string       `json:"ack_wait,omitempty"`
	MaxDeliver    int          `json:"max_deliver,omitempty"`
	BackOff       []string     `json:"backoff,omitempty"`
	MaxInFlight   int          `json:"max_in_flight,omitempty"`
	MaxAckPending int          `json:"max_ack_pending,omitempty"`
	RateLimit     float64      `json:"rate_limit,omitempty"`
	AllowPrivate  bool         `json:"allow_private,omitempty"`
	AllowHTTP     bool         `json:"allow_http,omitempty"`
	TLS           *DocumentTLS `json:"tls,omitempty"`
	Ordering      string       `json:"ordering,omitempty"`
	OnDeadLetter  string       `json:"on_dead_letter,omitempty"`
	Start         string       `json:"start,omitempty"`
	Paused        bool         `json:"paused,omitempty"`
	Sealed        Sealed       `json:"sealed"`
	Created       time.Time    `json:"created"`
	Updated       time.Time    `json:"updated"`
}

// DocumentTLS is a subscription's TLS files: paths on each replica.
type DocumentTLS struct {
	ClientCertFile string `json:"client_cert_file,omitempty"`
	ClientKeyFile  string `json:"client_key_file,omitempty"`
	CAFile         string `json:"ca_file,omitempty"`
}

// sealedPart is what Document.Sealed holds, once opened.
type sealedPart struct {
	URL     string            `json:"url"`
	Secrets []string          `json:"secrets"`
	Headers map[string]string `json:"headers,omitempty"`
}

// encode makes the document of s (validated by the caller), sealing its
// URL, secrets and headers with keys.
func encode(s subscription.Subscription, paused bool, keys *Keyring, created, updated time.Time) (Document, error) {
	d := Document{
		Version: wire.SubscriptionDocumentVersion, Name: s.Name, FilterSubjects: s.FilterSubjects,
		Endpoint: breaker.Endpoint(s.URL), Scheme: string(s.Scheme), Body: string(s.Body),
		MaxDeliver: s.MaxDeliver, MaxInFlight: s.MaxInFlight, MaxAckPending: s.MaxAckPending, RateLimit: s.RateLimit,
		AllowPrivate: s.AllowPrivate, AllowHTTP: s.AllowHTTP,
		Ordering: string(s.Ordering), OnDeadLetter: string(s.OnDeadLetter),
		Paused: paused, Created: created.UTC(), Updated: updated.UTC(),
	}
	if s.Timeout != 0 {
		d.Timeout = s.Timeout.String()
	}
	for _, b := range s.BackOff {
		d.BackOff = append(d.BackOff, b.String())
	}
	if !s.TLS.IsZero() {
		d.TLS = &DocumentTLS{ClientCertFile: s.TLS.ClientCertFile, ClientKeyFile: s.TLS.ClientKeyFile, CAFile: s.TLS.CAFile}
	}
	if s.Start.Policy != "" {
		d.Start = s.Start.String()
	}
	for k := range s.Headers {
		d.HeaderNames = append(d.HeaderNames, k)
	}
	plain, err := json.Marshal(sealedPart{URL: s.URL, Secrets: s.Secrets, Headers: s.Headers})
	if err != nil {
		return Document{}, err
	}
	if d.Sealed, err = keys.seal(s.Name, plain); err != nil {
		return Document{}, fmt.Errorf("seal subscription %q: %w", s.Name, err)
	}
	return d, nil
}

// decode reads the document's fields into a subscription. With keys it
// opens the sealed part (URL, secrets, headers); without (nil) the
// subscription has URL = Endpoint, no secrets and the header names with
// empty values: a redacted view, which cannot run.
func (d Document) decode(keys *Keyring) (subscription.Subscription, error) {
	if d.Version > wire.SubscriptionDocumentVersion || d.Version < 1 {
		return subscription.Subscription{}, fmt.Errorf("subscription %q: document version %d (this binary reads 1 to %d; upgrade it)", d.Name, d.Version, wire.SubscriptionDocumentVersion)
	}
	bad := func(field, v string) error {
		return fmt.Errorf("subscription %q: document field %s: %q is not a duration", d.Name, field, v)
	}
	s := subscription.Subscription{
		Name: d.Name, FilterSubjects: d.FilterSubjects, URL: d.Endpoint, Scheme: webhook.Scheme(d.Scheme),
		Body: subscription.BodyMode(d.Body), MaxDeliver: d.MaxDeliver, MaxInFlight: d.MaxInFlight, MaxAckPending: d.MaxAckPending,
		RateLimit:    d.RateLimit,
		AllowPrivate: d.AllowPrivate, AllowHTTP: d.AllowHTTP,
		Ordering: subscription.Ordering(d.Ordering), OnDeadLetter: subscription.DeadLetterPolicy(d.OnDeadLetter),
	}
	var err error
	if d.Timeout != "" {
		if s.Timeout, err = time.ParseDuration(d.Timeout); err != nil {
			return s, bad("timeout", d.Timeout)
		}
	}
	if d.AckWait != "" {
		// Deprecated and ignored: kept on the Subscription only so that
		// the consumer can warn (subscription.AckWaitIgnored); a value
		// that does not parse is ignored too.
		s.AckWait, _ = time.ParseDuration(d.AckWait)
	}
	for i, b := range d.BackOff {
		v, err := time.ParseDuration(b)
		if err != nil {
			return s, bad(fmt.Sprintf("backoff[%d]", i), b)
		}
		s.BackOff = append(s.BackOff, v)
	}
	if d.TLS != nil {
		s.TLS = subscription.TLSFiles{ClientCertFile: d.TLS.ClientCertFile, ClientKeyFile: d.TLS.ClientKeyFile, CAFile: d.TLS.CAFile}
	}
	if s.Start, err = subscription.ParseStart(d.Start); err != nil {
		return s, fmt.Errorf("subscription %q: document field start: %w", d.Name, err)
	}
	if keys == nil {
		if len(d.HeaderNames) > 0 {
			s.Headers = map[string]string{}
			for _, k := range d.HeaderNames {
				s.Headers[k] = ""
			}
		}
		return s, nil
	}
	plain, err := keys.open(d.Name, d.Sealed)
	if err != nil {
		return s, fmt.Errorf("subscription %q: %w", d.Name, err)
	}
	var p sealedPart
	if err := json.Unmarshal(plain, &p); err != nil {
		return s, fmt.Errorf("subscription %q: sealed part: %w", d.Name, err)
	}
	s.URL, s.Secrets, s.Headers = p.URL, p.Secrets, p.Headers
	return s, nil
}
