package webhook

import (
	"crypto/ed25519"
	"crypto/hmac"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Verification failures. Verify wraps exactly one of them (test with
// errors.Is); Reason turns it into a short stable string for a 401 body.
var (
	// ErrMissingSignature: the signature header is absent or empty.
	ErrMissingSignature = errors.New("missing signature")
	// ErrMissingTimestamp: the timestamp header is absent, empty or not
	// base-10 unix seconds.
	ErrMissingTimestamp = errors.New("missing timestamp")
	// ErrTimestampStale: the timestamp is older than now minus the tolerance
	// (a replay, or a very late retry that the sender should have re-signed).
	ErrTimestampStale = errors.New("timestamp too old")
	// ErrTimestampFuture: the timestamp is later than now plus the tolerance.
	ErrTimestampFuture = errors.New("timestamp in the future")
	// ErrBadSignature: no listed signature matches the body under any secret
	// or public key (tampered body, wrong secret, malformed signature list,
	// only v1a entries for a verifier holding only whsec_ secrets or the
	// reverse, or for SchemeStandard a missing webhook-id).
	ErrBadSignature = errors.New("bad signature")
)

// ErrInvalidOption is wrapped by NewVerifier for an option with a bad value.
var ErrInvalidOption = errors.New("invalid option")

// DefaultTolerance is how far a signature timestamp may be from the
// receiver's clock, in either direction, unless WithTolerance says otherwise.
// Five minutes, as Standard Webhooks recommends.
const DefaultTolerance = 5 * time.Minute

// Verifier checks signatures on incoming webhooks. It is safe for concurrent
// use. Build it with NewVerifier.
type Verifier struct {
	scheme    Scheme
	secrets   []Secret
	tolerance time.Duration
	now       func() time.Time
}

// VerifierOption configures a Verifier in NewVerifier.
type VerifierOption func(*Verifier) error

// WithTolerance sets how far the signed timestamp may be from now, in either
// direction (default DefaultTolerance, 5 minutes). d must be positive.
func WithTolerance(d time.Duration) VerifierOption {
	return func(v *Verifier) error {
		if d <= 0 {
			return fmt.Errorf("%w: tolerance %v (must be > 0)", ErrInvalidOption, d)
		}
		v.tolerance = d
		return nil
	}
}

// WithClock sets the clock the timestamp is checked against (default
// time.Now). now must not be nil.
func WithClock(now func() time.Time) VerifierOption {
	return func(v *Verifier) error {
		if now == nil {
			return fmt.Errorf("%w: clock is nil", ErrInvalidOption)
		}
		v.now = now
		return nil
	}
}

// NewVerifier returns a Verifier for scheme accepting a signature made with
// any of secrets (list old and new during a rotation; see ParseSecret).
// SchemeStandard takes whsec_ secrets, which verify "v1" entries, and whpk_
// ed25519 public keys, which verify "v1a" entries, in any mix (a sender
// moving from one to the other signs with both for a while); a whsk_ secret
// key is refused, a receiver needs only the public key. Errors wrap
// ErrInvalidScheme, ErrInvalidSecret or ErrInvalidOption.
func NewVerifier(scheme Scheme, secrets []string, opts ...VerifierOption) (*Verifier, error) {
	secs, err := parseSecrets(scheme, secrets, true)
	if err != nil {
		return nil, fmt.Errorf("new verifier: %w", err)
	}
	v := &Verifier{scheme: scheme, secrets: secs, tolerance: DefaultTolerance, now: time.Now}
	for _, o := range opts {
		if err := o(v); err != nil {
			return nil, fmt.Errorf("new verifier: %w", err)
		}
	}
	return v, nil
}

// Scheme returns the scheme v verifies.
func (v *Verifier) Scheme() Scheme { return v.scheme }

// Verify checks that h carries a valid signature of body, the exact bytes
// received, made within the tolerance of now. It checks, in order: signature
// header present (ErrMissingSignature), timestamp present and numeric
// (ErrMissingTimestamp), timestamp not too old (ErrTimestampStale) nor too
// new (ErrTimestampFuture), and one listed signature matching under one
// secret (ErrBadSignature). Under SchemeStandard, "v1" entries are checked
// against the whsec_ secrets and "v1a" entries against the whpk_ public keys
// (ed25519). HMAC signatures are compared in constant time; entries of
// unknown versions or encodings are skipped. nil means valid.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	sigHeader, tsHeader := HeaderWebhookSignature, HeaderWebhookTimestamp
	if v.scheme == SchemeHMACSHA256 {
		sigHeader, tsHeader = HeaderSignature, HeaderTimestamp
	}
	sigs := strings.TrimSpace(h.Get(sigHeader))
	if sigs == "" {
		return fmt.Errorf("verify: %s header: %w", sigHeader, ErrMissingSignature)
	}
	ts := strings.TrimSpace(h.Get(tsHeader))
	if ts == "" {
		return fmt.Errorf("verify: %s header: %w", tsHeader, ErrMissingTimestamp)
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("verify: %s header %q is not unix seconds: %w", tsHeader, ts, ErrMissingTimestamp)
	}
	// Compare in whole seconds, the wire's unit, as bounds on unix so that
	// far-off int64 timestamps cannot overflow.
	tol := int64(v.tolerance / time.Second)
	switch nowUnix := v.now().Unix(); {
	case unix < nowUnix-tol:
		return fmt.Errorf("verify: signed at unix %d, now %d, tolerance %v: %w", unix, nowUnix, v.tolerance, ErrTimestampStale)
	case unix > nowUnix+tol:
		return fmt.Errorf("verify: signed at unix %d, now %d, tolerance %v: %w", unix, nowUnix, v.tolerance, ErrTimestampFuture)
	}

	switch v.scheme {
	case SchemeHMACSHA256:
		prefix := signedPrefix(v.scheme, "", ts)
		for entry := range strings.SplitSeq(sigs, ",") {
			hexSig, ok := strings.CutPrefix(strings.TrimSpace(entry), "sha256=")
			if !ok {
				continue
			}
			got, err := hex.DecodeString(hexSig)
			if err != nil {
				continue
			}
			for _, sec := range v.secrets {
				if hmac.Equal(got, macOf(sec.key, prefix, body)) {
					return nil
				}
			}
		}
	default:
		id := h.Get(HeaderWebhookID)
		if id == "" {
			return fmt.Errorf("verify: %s header missing, nothing to check the signature against: %w", HeaderWebhookID, ErrBadSignature)
		}
		prefix := signedPrefix(v.scheme, id, ts)
		// msg is prefix+body for ed25519, built on the first v1a entry.
		var msg []byte
		for entry := range strings.FieldsSeq(sigs) {
			version, b64, ok := strings.Cut(entry, ",")
			if !ok || (version != "v1" && version != "v1a") {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				continue
			}
			for _, sec := range v.secrets {
				switch {
				case version == "v1" && sec.kind == kindWhsec:
					if hmac.Equal(got, macOf(sec.key, prefix, body)) {
						return nil
					}
				case version == "v1a" && sec.kind == kindWhpk && len(got) == ed25519.SignatureSize:
					if msg == nil {
						msg = append(append(make([]byte, 0, len(prefix)+len(body)), prefix...), body...)
					}
					if ed25519.Verify(ed25519.PublicKey(sec.key), msg, got) {
						return nil
					}
				}
			}
		}
	}
	return fmt.Errorf("verify: no signature in %s matches: %w", sigHeader, ErrBadSignature)
}

// Reason returns a short stable string for a verification error, fit for a
// 401 response body or a metric label: "missing-signature",
// "missing-timestamp", "stale", "future", "bad-signature",
// "missing-order-signature" or "bad-order-signature"; "" for nil and
// "invalid" for any other error.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrMissingSignature):
		return "missing-signature"
	case errors.Is(err, ErrMissingTimestamp):
		return "missing-timestamp"
	case errors.Is(err, ErrTimestampStale):
		return "stale"
	case errors.Is(err, ErrTimestampFuture):
		return "future"
	case errors.Is(err, ErrBadSignature):
		return "bad-signature"
	case errors.Is(err, ErrMissingOrderSignature):
		return "missing-order-signature"
	case errors.Is(err, ErrBadOrderSignature):
		return "bad-order-signature"
	}
	return "invalid"
}
