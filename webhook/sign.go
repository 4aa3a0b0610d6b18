// Package webhook is what a webhook receiver imports: signing and
// verification of jsbridge webhooks (Standard Webhooks or plain HMAC-SHA256),
// an idempotency store keyed by the Idempotency-Key header, a receiver
// middleware that ties them together, and a CloudEvents decoder for both
// content modes. The sender (package deliver) signs with the same code.
//
// It imports the standard library and package event only; the Postgres
// idempotency store, which needs pgx, is package webhook/pgstore.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Header names of the two signature schemes and of the idempotency contract.
// http.Header canonicalizes them on Set/Get ("webhook-id" travels as
// "Webhook-Id"); HTTP header names are case-insensitive, so both are the same
// header.
const (
	// HeaderWebhookID is the Standard Webhooks message id: the event id, the
	// same on every attempt. Source: Standard Webhooks spec, "Signature scheme".
	HeaderWebhookID = "webhook-id"
	// HeaderWebhookTimestamp is the Standard Webhooks send time in unix seconds.
	HeaderWebhookTimestamp = "webhook-timestamp"
	// HeaderWebhookSignature is the Standard Webhooks signature list:
	// space-separated "v1,<base64>" entries, one per signing secret.
	HeaderWebhookSignature = "webhook-signature"

	// HeaderTimestamp is the HMAC-SHA256 scheme's send time in unix seconds.
	HeaderTimestamp = "X-Webhook-Timestamp"
	// HeaderSignature is the HMAC-SHA256 scheme's signature list:
	// comma-separated "sha256=<hex>" entries, one per signing secret.
	HeaderSignature = "X-Webhook-Signature"

	// HeaderIdempotencyKey carries the event id on every delivery attempt;
	// receivers deduplicate by it.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// Scheme names a signature scheme. It appears in subscription configuration.
type Scheme string

const (
	// SchemeStandard is Standard Webhooks (https://www.standardwebhooks.com):
	// HMAC-SHA256 with a whsec_ secret over "<webhook-id>.<webhook-timestamp>.<body>",
	// sent base64-encoded as "v1,<sig>" in webhook-signature.
	SchemeStandard Scheme = "standard"
	// SchemeHMACSHA256 is HMAC-SHA256 over "<timestamp>.<body>", sent
	// hex-encoded as "sha256=<sig>" in X-Webhook-Signature with the timestamp
	// in X-Webhook-Timestamp.
	SchemeHMACSHA256 Scheme = "hmac-sha256"
)

// ErrInvalidScheme is wrapped by ParseScheme, NewSigner and NewVerifier for a
// scheme name that is neither "standard" nor "hmac-sha256".
var ErrInvalidScheme = errors.New("invalid signature scheme")

// ErrInvalidSecret is wrapped by ParseSecret, NewSigner and NewVerifier for an
// unusable secret. The error names the problem, never the secret.
var ErrInvalidSecret = errors.New("invalid webhook secret")

// ParseScheme returns the Scheme named s ("standard" or "hmac-sha256",
// case-sensitive). Any other value is an error wrapping ErrInvalidScheme.
func ParseScheme(s string) (Scheme, error) {
	switch sc := Scheme(s); sc {
	case SchemeStandard, SchemeHMACSHA256:
		return sc, nil
	}
	return "", fmt.Errorf("%w: scheme %q (want %q or %q)", ErrInvalidScheme, s, SchemeStandard, SchemeHMACSHA256)
}

// whsecPrefix marks a Standard Webhooks secret: the key is the base64
// (standard alphabet, padded) text after it.
const whsecPrefix = "whsec_"

// Secret is an HMAC key. Its zero value is no key. It never prints itself:
// fmt, %#v and slog all show "[redacted]".
type Secret struct {
	key []byte
	// whsec is true when the secret was given in the whsec_<base64> form.
	whsec bool
}

// ParseSecret parses a signing secret.
//
//   - "whsec_<base64>" (the Standard Webhooks form): the key is the
//     base64-decoded text after the prefix (standard alphabet, padded).
//   - anything else: the key is the raw bytes of s. Only SchemeHMACSHA256
//     accepts such secrets.
//
// Empty secrets, empty keys, invalid base64 and leading or trailing
// whitespace (usually a stray newline from a file or env var) are errors
// wrapping ErrInvalidSecret; they name the problem and never echo s.
func ParseSecret(s string) (Secret, error) {
	if s == "" {
		return Secret{}, fmt.Errorf("%w: secret is empty", ErrInvalidSecret)
	}
	if strings.TrimSpace(s) != s {
		return Secret{}, fmt.Errorf("%w: secret has leading or trailing whitespace", ErrInvalidSecret)
	}
	enc, ok := strings.CutPrefix(s, whsecPrefix)
	if !ok {
		return Secret{key: []byte(s)}, nil
	}
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		var corrupt base64.CorruptInputError
		if errors.As(err, &corrupt) {
			return Secret{}, fmt.Errorf("%w: text after whsec_ is not valid base64 (at byte %d)", ErrInvalidSecret, int64(corrupt)+int64(len(whsecPrefix)))
		}
		return Secret{}, fmt.Errorf("%w: text after whsec_ is not valid base64", ErrInvalidSecret)
	}
	if len(key) == 0 {
		return Secret{}, fmt.Errorf("%w: whsec_ secret has an empty key", ErrInvalidSecret)
	}
	return Secret{key: key, whsec: true}, nil
}

// String returns "[redacted]".
func (Secret) String() string { return "[redacted]" }

// GoString returns "webhook.Secret([redacted])".
func (Secret) GoString() string { return "webhook.Secret([redacted])" }

// LogValue keeps the key out of slog output.
func (Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// parseSecrets parses the secrets of a signer or verifier for scheme.
func parseSecrets(scheme Scheme, secrets []string) ([]Secret, error) {
	if _, err := ParseScheme(string(scheme)); err != nil {
		return nil, err
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secrets given (need at least one)", ErrInvalidSecret)
	}
	out := make([]Secret, 0, len(secrets))
	for i, s := range secrets {
		sec, err := ParseSecret(s)
		if err != nil {
			return nil, fmt.Errorf("secrets[%d]: %w", i, err)
		}
		if scheme == SchemeStandard && !sec.whsec {
			return nil, fmt.Errorf("secrets[%d]: %w: scheme %q needs a whsec_<base64> secret", i, ErrInvalidSecret, scheme)
		}
		out = append(out, sec)
	}
	return out, nil
}

// Signer signs outgoing webhooks. Every secret signs, so during a rotation
// (old and new secret both listed) receivers holding either one accept.
// Build it with NewSigner; a struct literal works too when its Secrets come
// from ParseSecret (an empty Scheme means SchemeStandard).
type Signer struct {
	// Scheme selects the headers and signed content.
	Scheme Scheme
	// Secrets sign in order; each adds one signature.
	Secrets []Secret

	// macs[i] holds keyed HMACs of Secrets[i] for reuse (set by NewSigner;
	// a struct literal keys a new HMAC per signature).
	macs []*sync.Pool
}

// keyedMAC is an HMAC-SHA256 keyed with one secret, and scratch space for
// one signature.
type keyedMAC struct {
	h   hash.Hash
	buf []byte
}

// NewSigner returns a Signer for scheme with one or more secrets (see
// ParseSecret; SchemeStandard needs whsec_ secrets). Errors wrap
// ErrInvalidScheme or ErrInvalidSecret and name the offending secret by index.
func NewSigner(scheme Scheme, secrets ...string) (*Signer, error) {
	secs, err := parseSecrets(scheme, secrets)
	if err != nil {
		return nil, fmt.Errorf("new signer: %w", err)
	}
	macs := make([]*sync.Pool, len(secs))
	for i, sec := range secs {
		macs[i] = &sync.Pool{New: func() any { return &keyedMAC{h: hmac.New(sha256.New, sec.key)} }}
	}
	return &Signer{Scheme: scheme, Secrets: secs, macs: macs}, nil
}

// Canonical forms of the signature headers (http.Header keys), so Sign
// assigns them without canonicalizing on every call.
var (
	canonicalWebhookID        = http.CanonicalHeaderKey(HeaderWebhookID)
	canonicalWebhookTimestamp = http.CanonicalHeaderKey(HeaderWebhookTimestamp)
	canonicalWebhookSignature = http.CanonicalHeaderKey(HeaderWebhookSignature)
	canonicalTimestamp        = http.CanonicalHeaderKey(HeaderTimestamp)
	canonicalSignature        = http.CanonicalHeaderKey(HeaderSignature)
)

// Sign sets the scheme's headers on h for a request whose body is exactly
// body, sent at ts (truncated to unix seconds):
//
//   - SchemeStandard: webhook-id = msgID (use the event id, the same on every
//     attempt), webhook-timestamp, webhook-signature "v1,<base64>" per secret,
//     space-separated.
//   - SchemeHMACSHA256: X-Webhook-Timestamp, X-Webhook-Signature
//     "sha256=<hex>" per secret, comma-separated. msgID is not signed or sent.
//
// Existing values of those headers are replaced. A Signer with no secrets
// sets no signature header; an unknown Scheme sets nothing.
func (s *Signer) Sign(h http.Header, msgID string, ts time.Time, body []byte) {
	var tsBuf [20]byte
	unix := string(strconv.AppendInt(tsBuf[:0], ts.Unix(), 10))
	var (
		sigKey string
		sep    byte
		tag    string
		encode func(dst, src []byte) []byte
	)
	switch s.Scheme {
	case SchemeStandard, "":
		h[canonicalWebhookID] = []string{msgID}
		h[canonicalWebhookTimestamp] = []string{unix}
		sigKey, sep, tag, encode = canonicalWebhookSignature, ' ', "v1,", base64.StdEncoding.AppendEncode
	case SchemeHMACSHA256:
		h[canonicalTimestamp] = []string{unix}
		sigKey, sep, tag, encode = canonicalSignature, ',', "sha256=", hex.AppendEncode
	default:
		return
	}
	delete(h, sigKey)
	if len(s.Secrets) == 0 {
		return
	}
	prefix := signedPrefix(s.Scheme, msgID, unix)
	var sigs []byte
	for i := range s.Secrets {
		if i > 0 {
			sigs = append(sigs, sep)
		}
		sigs = append(sigs, tag...)
		sum := s.mac(i, prefix, body)
		sigs = encode(sigs, sum[:])
	}
	h[sigKey] = []string{string(sigs)}
}

// signedPrefix is what precedes the body in the content a scheme signs:
// "<id>.<ts>." for Standard Webhooks, "<ts>." for HMAC-SHA256.
func signedPrefix(scheme Scheme, id, ts string) string {
	if scheme == SchemeHMACSHA256 {
		return ts + "."
	}
	return id + "." + ts + "."
}

// mac returns HMAC-SHA256(Secrets[i], prefix + body) on a pooled keyed
// HMAC.
func (s *Signer) mac(i int, prefix string, body []byte) [sha256.Size]byte {
	var km *keyedMAC
	if i < len(s.macs) {
		km = s.macs[i].Get().(*keyedMAC)
		defer s.macs[i].Put(km)
		km.h.Reset()
	} else {
		km = &keyedMAC{h: hmac.New(sha256.New, s.Secrets[i].key)}
	}
	km.buf = append(km.buf[:0], prefix...)
	km.h.Write(km.buf)
	km.h.Write(body)
	km.buf = km.h.Sum(km.buf[:0])
	return [sha256.Size]byte(km.buf)
}

// macOf is HMAC-SHA256(key, prefix + body), prefix from signedPrefix.
func macOf(key []byte, prefix string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(prefix))
	m.Write(body)
	return m.Sum(nil)
}
