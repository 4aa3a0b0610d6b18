// Package webhook is what a webhook receiver imports: signing and
// verification of jsbridge webhooks (Standard Webhooks v1 and v1a, or plain HMAC-SHA256),
// an idempotency store keyed by the Idempotency-Key header, a receiver
// middleware that ties them together, and a CloudEvents decoder for both
// content modes. The sender (package deliver) signs with the same code.
//
// It imports the standard library and package event only; the Postgres
// idempotency store, which needs pgx, is package webhook/pgstore.
package webhook

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
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
	// space-separated "v1,<base64>" (HMAC-SHA256, whsec_ secret) and
	// "v1a,<base64>" (ed25519, whsk_ secret key) entries, one per signing
	// secret.
	HeaderWebhookSignature = "webhook-signature"

	// HeaderTimestamp is the HMAC-SHA256 scheme's send time in unix seconds.
	HeaderTimestamp = "X-Webhook-Timestamp"
	// HeaderSignature is the HMAC-SHA256 scheme's signature list:
	// comma-separated "sha256=<hex>" entries, one per signing secret.
	HeaderSignature = "X-Webhook-Signature"
)

// Scheme names a signature scheme. It appears in subscription configuration.
type Scheme string

const (
	// SchemeStandard is Standard Webhooks (https://www.standardwebhooks.com):
	// a signature over "<webhook-id>.<webhook-timestamp>.<body>", sent
	// base64-encoded in webhook-signature. The key's prefix picks the
	// algorithm, as the spec intends: a whsec_ secret signs HMAC-SHA256
	// ("v1,<sig>"), a whsk_ secret key signs ed25519 ("v1a,<sig>"), and a
	// receiver verifies v1a with the matching whpk_ public key.
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

// Key prefixes of Standard Webhooks (spec, "Signature scheme"): the key is
// the base64 (standard alphabet, padded) text after the prefix.
const (
	// whsecPrefix marks a symmetric secret: HMAC-SHA256, "v1" signatures.
	whsecPrefix = "whsec_"
	// whskPrefix marks an ed25519 secret key: "v1a" signatures.
	whskPrefix = "whsk_"
	// whpkPrefix marks an ed25519 public key: verifies "v1a" signatures.
	whpkPrefix = "whpk_"
)

// keyKind is what a Secret holds.
type keyKind uint8

const (
	// kindRaw: the raw bytes of the text, an HMAC key (SchemeHMACSHA256 only).
	kindRaw keyKind = iota
	// kindWhsec: a whsec_ HMAC key.
	kindWhsec
	// kindWhsk: a whsk_ ed25519 private key; it signs v1a.
	kindWhsk
	// kindWhpk: a whpk_ ed25519 public key; it verifies v1a.
	kindWhpk
)

// Secret is a signing or verification key: an HMAC key, an ed25519 secret
// key or an ed25519 public key. Its zero value is no key. It never prints
// itself: fmt, %#v and slog all show "[redacted]".
type Secret struct {
	// key is the HMAC key (kindRaw, kindWhsec), the ed25519 private key
	// (kindWhsk, 64 bytes: seed then public key) or the ed25519 public key
	// (kindWhpk, 32 bytes).
	key  []byte
	kind keyKind
}

// ParseSecret parses a signing secret or verification key.
//
//   - "whsec_<base64>" (Standard Webhooks, symmetric): the HMAC key is the
//     base64-decoded text after the prefix (standard alphabet, padded).
//   - "whsk_<base64>" (Standard Webhooks, asymmetric): an ed25519 secret
//     key, 64 bytes (the 32-byte seed then the 32-byte public key, the form
//     of Go's ed25519.PrivateKey and of libsodium) or the 32-byte seed
//     alone. It signs "v1a" under SchemeStandard only.
//   - "whpk_<base64>": an ed25519 public key, 32 bytes. It only verifies
//     "v1a" signatures (NewVerifier, SchemeStandard).
//   - anything else: the key is the raw bytes of s. Only SchemeHMACSHA256
//     accepts such secrets.
//
// Empty secrets, empty keys, invalid base64, ed25519 keys of the wrong
// length or whose public half does not match the seed, and leading or
// trailing whitespace (usually a stray newline from a file or env var) are
// errors wrapping ErrInvalidSecret; they name the problem and never echo s.
func ParseSecret(s string) (Secret, error) {
	if s == "" {
		return Secret{}, fmt.Errorf("%w: secret is empty", ErrInvalidSecret)
	}
	if strings.TrimSpace(s) != s {
		return Secret{}, fmt.Errorf("%w: secret has leading or trailing whitespace", ErrInvalidSecret)
	}
	for _, p := range []struct {
		prefix string
		kind   keyKind
	}{{whsecPrefix, kindWhsec}, {whskPrefix, kindWhsk}, {whpkPrefix, kindWhpk}} {
		enc, ok := strings.CutPrefix(s, p.prefix)
		if !ok {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			var corrupt base64.CorruptInputError
			if errors.As(err, &corrupt) {
				return Secret{}, fmt.Errorf("%w: text after %s is not valid base64 (at byte %d)", ErrInvalidSecret, p.prefix, int64(corrupt)+int64(len(p.prefix)))
			}
			return Secret{}, fmt.Errorf("%w: text after %s is not valid base64", ErrInvalidSecret, p.prefix)
		}
		if len(key) == 0 {
			return Secret{}, fmt.Errorf("%w: %s secret has an empty key", ErrInvalidSecret, p.prefix)
		}
		switch p.kind {
		case kindWhsk:
			switch len(key) {
			case ed25519.SeedSize:
				key = ed25519.NewKeyFromSeed(key)
			case ed25519.PrivateKeySize:
				derived := ed25519.NewKeyFromSeed(key[:ed25519.SeedSize])
				if !hmac.Equal(derived[ed25519.SeedSize:], key[ed25519.SeedSize:]) {
					return Secret{}, fmt.Errorf("%w: whsk_ key's public half does not match its seed", ErrInvalidSecret)
				}
			default:
				return Secret{}, fmt.Errorf("%w: whsk_ key is %d bytes (want %d, seed and public key, or the %d-byte seed)", ErrInvalidSecret, len(key), ed25519.PrivateKeySize, ed25519.SeedSize)
			}
		case kindWhpk:
			if len(key) != ed25519.PublicKeySize {
				return Secret{}, fmt.Errorf("%w: whpk_ key is %d bytes (want %d)", ErrInvalidSecret, len(key), ed25519.PublicKeySize)
			}
		}
		return Secret{key: key, kind: p.kind}, nil
	}
	return Secret{key: []byte(s), kind: kindRaw}, nil
}

// PublicKey returns the whpk_ public key of a whsk_ secret key: what the
// receivers of its v1a signatures verify with. It is not secret. For any
// other secret it returns "" and false.
func (s Secret) PublicKey() (string, bool) {
	if s.kind != kindWhsk {
		return "", false
	}
	pub := ed25519.PrivateKey(s.key).Public().(ed25519.PublicKey)
	return whpkPrefix + base64.StdEncoding.EncodeToString(pub), true
}

// SecretSize is the length in bytes of the HMAC keys GenerateSecret makes:
// Standard Webhooks asks for 24 to 64.
const SecretSize = 32

// GenerateSecret returns a new Standard Webhooks signing secret,
// "whsec_<base64>" of SecretSize random bytes: the sender signs "v1" with
// it and receivers verify with the same string. It fails only when the
// system's random source does.
func GenerateSecret() (string, error) {
	key := make([]byte, SecretSize)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("generate secret: %w", err)
	}
	return whsecPrefix + base64.StdEncoding.EncodeToString(key), nil
}

// GenerateKeyPair returns a new Standard Webhooks ed25519 key pair: the
// whsk_ secret key (64 bytes, seed then public key) for the sender's
// secrets and the whpk_ public key for receivers. It fails only when the
// system's random source does.
func GenerateKeyPair() (secretKey, publicKey string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate ed25519 key pair: %w", err)
	}
	return whskPrefix + base64.StdEncoding.EncodeToString(priv), whpkPrefix + base64.StdEncoding.EncodeToString(pub), nil
}

// String returns "[redacted]".
func (Secret) String() string { return "[redacted]" }

// GoString returns "webhook.Secret([redacted])".
func (Secret) GoString() string { return "webhook.Secret([redacted])" }

// LogValue keeps the key out of slog output.
func (Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// parseSecrets parses the secrets of a signer (verify false) or verifier
// (verify true) for scheme, and checks each fits: SchemeStandard takes
// whsec_ and whsk_ secrets to sign, whsec_ and whpk_ keys to verify;
// SchemeHMACSHA256 takes whsec_ and raw secrets.
func parseSecrets(scheme Scheme, secrets []string, verify bool) ([]Secret, error) {
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
		var problem string
		switch {
		case scheme == SchemeStandard && sec.kind == kindRaw:
			problem = "needs a whsec_<base64> secret, or a whsk_ secret key (sender) or whpk_ public key (receiver) for ed25519"
		case scheme == SchemeHMACSHA256 && (sec.kind == kindWhsk || sec.kind == kindWhpk):
			problem = "takes HMAC secrets only; ed25519 keys (whsk_, whpk_) sign and verify under scheme \"standard\" (v1a)"
		case !verify && sec.kind == kindWhpk:
			problem = "cannot sign with a whpk_ public key (give the sender the whsk_ secret key)"
		case verify && sec.kind == kindWhsk:
			problem = "verifies ed25519 with the whpk_ public key; a receiver should never hold the whsk_ secret key"
		}
		if problem != "" {
			return nil, fmt.Errorf("secrets[%d]: %w: scheme %q %s", i, ErrInvalidSecret, scheme, problem)
		}
		out = append(out, sec)
	}
	return out, nil
}

// Signer signs outgoing webhooks. Every secret signs, so during a rotation
// (old and new secret both listed, including from whsec_ to whsk_)
// receivers holding either one accept.
// Build it with NewSigner; a struct literal works too when its Secrets come
// from ParseSecret (an empty Scheme means SchemeStandard).
type Signer struct {
	// Scheme selects the headers and signed content.
	Scheme Scheme
	// Secrets sign in order; each adds one signature.
	Secrets []Secret

	// macs[i] holds keyed HMACs of Secrets[i] for reuse (set by NewSigner,
	// nil for ed25519 keys; a struct literal keys a new HMAC per signature).
	macs []*sync.Pool
}

// keyedMAC is an HMAC-SHA256 keyed with one secret, and scratch space for
// one signature.
type keyedMAC struct {
	h   hash.Hash
	buf []byte
}

// NewSigner returns a Signer for scheme with one or more secrets (see
// ParseSecret; SchemeStandard needs whsec_ secrets or whsk_ secret keys, in
// any mix; a whpk_ public key cannot sign). Errors wrap ErrInvalidScheme or
// ErrInvalidSecret and name the offending secret by index.
func NewSigner(scheme Scheme, secrets ...string) (*Signer, error) {
	secs, err := parseSecrets(scheme, secrets, false)
	if err != nil {
		return nil, fmt.Errorf("new signer: %w", err)
	}
	macs := make([]*sync.Pool, len(secs))
	for i, sec := range secs {
		if sec.kind == kindWhsk {
			continue
		}
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
//     attempt), webhook-timestamp, webhook-signature with one entry per
//     secret, space-separated: "v1,<base64>" (HMAC-SHA256) for a whsec_
//     secret, "v1a,<base64>" (ed25519) for a whsk_ secret key.
//   - SchemeHMACSHA256: X-Webhook-Timestamp, X-Webhook-Signature
//     "sha256=<hex>" per secret, comma-separated. msgID is not signed or sent.
//
// Existing values of those headers are replaced. A Signer with no secrets
// sets no signature header; an unknown Scheme sets nothing; a key that
// cannot sign under the scheme (a whpk_ public key, or an ed25519 key under
// SchemeHMACSHA256, possible only in a struct literal) adds no entry.
func (s *Signer) Sign(h http.Header, msgID string, ts time.Time, body []byte) {
	// The timestamp and the signatures are built in one buffer and become
	// one string, which the two header values slice; the values share one
	// backing array, each capped so that an append to one copies it.
	var buf [192]byte
	text := strconv.AppendInt(buf[:0], ts.Unix(), 10)
	unixLen := len(text)
	vals := make([]string, 3)
	var (
		sigKey string
		sep    byte
		tag    string
		hexed  bool
	)
	switch s.Scheme {
	case SchemeStandard, "":
		vals[0] = msgID
		h[canonicalWebhookID] = vals[0:1:1]
		sigKey, sep, tag = canonicalWebhookSignature, ' ', "v1,"
	case SchemeHMACSHA256:
		sigKey, sep, tag, hexed = canonicalSignature, ',', "sha256=", true
	default:
		return
	}
	delete(h, sigKey)
	var prefixBuf [96]byte
	prefix := appendSignedPrefix(prefixBuf[:0], s.Scheme, msgID, text)
	// msg is prefix+body, built once for the ed25519 keys (ed25519 signs
	// the whole message, it cannot be streamed).
	var msg []byte
	signed := false
	for i, sec := range s.Secrets {
		if sec.kind == kindWhpk || (sec.kind == kindWhsk && s.Scheme == SchemeHMACSHA256) {
			continue
		}
		if signed {
			text = append(text, sep)
		}
		signed = true
		if sec.kind == kindWhsk {
			if msg == nil {
				msg = append(append(make([]byte, 0, len(prefix)+len(body)), prefix...), body...)
			}
			text = append(text, "v1a,"...)
			text = base64.StdEncoding.AppendEncode(text, ed25519.Sign(ed25519.PrivateKey(sec.key), msg))
			continue
		}
		text = append(text, tag...)
		sum := s.mac(i, prefix, body)
		if hexed {
			text = hex.AppendEncode(text, sum[:])
		} else {
			text = base64.StdEncoding.AppendEncode(text, sum[:])
		}
	}
	all := string(text)
	vals[1] = all[:unixLen]
	if s.Scheme == SchemeHMACSHA256 {
		h[canonicalTimestamp] = vals[1:2:2]
	} else {
		h[canonicalWebhookTimestamp] = vals[1:2:2]
	}
	if len(s.Secrets) == 0 {
		return
	}
	vals[2] = all[unixLen:]
	h[sigKey] = vals[2:3:3]
}

// appendSignedPrefix appends to dst what precedes the body in the
// content a scheme signs: "<id>.<ts>." for Standard Webhooks, "<ts>."
// for HMAC-SHA256.
func appendSignedPrefix(dst []byte, scheme Scheme, id string, ts []byte) []byte {
	if scheme != SchemeHMACSHA256 {
		dst = append(append(dst, id...), '.')
	}
	return append(append(dst, ts...), '.')
}

// signedPrefix is appendSignedPrefix as a string, for the verifier.
func signedPrefix(scheme Scheme, id, ts string) string {
	if scheme == SchemeHMACSHA256 {
		return ts + "."
	}
	return id + "." + ts + "."
}

// mac returns HMAC-SHA256(Secrets[i], prefix + body) on a pooled keyed
// HMAC. prefix is copied into the HMAC's scratch space first, so that
// a caller's stack buffer does not escape through the hash.Hash
// interface.
func (s *Signer) mac(i int, prefix, body []byte) [sha256.Size]byte {
	var km *keyedMAC
	if i < len(s.macs) && s.macs[i] != nil {
		km = s.macs[i].Get().(*keyedMAC)
		defer s.macs[i].Put(km)
		km.h.Reset()
	} else {
		km = &keyedMAC{h: hmac.New(sha256.New, s.Secrets[i].key)}
	}
	km.buf = append(km.buf[:0], prefix...)
	km.h.Write(km.buf)
	if len(body) > 0 {
		km.h.Write(body)
	}
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
