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

	"github.com/jsbridge/jsbridge/wire"
)

// Order signature failures. VerifyOrder wraps exactly one of them, or
// ErrMissingTimestamp; Reason maps them to "missing-order-signature" and
// "bad-order-signature".
var (
	// ErrMissingOrderSignature: the Jsbridge-Order-Signature header is
	// absent or empty.
	ErrMissingOrderSignature = errors.New("missing order signature")
	// ErrBadOrderSignature: no entry of Jsbridge-Order-Signature matches the
	// ordering fields under any secret or public key (an altered stream,
	// version, previous version, partition or epoch, a wrong secret, or a
	// missing message id).
	ErrBadOrderSignature = errors.New("bad order signature")
)

// OrderFields are the ordering fields of one webhook of an ordered
// subscription: the version chain (Stream, Version, Previous) and, when a
// partition's owner sends it, the partition and lease epoch. The sender
// signs them with Signer.SignOrder; a receiver checks them with
// Verifier.VerifyOrder.
type OrderFields struct {
	// Stream is the stream id as the receiver reads it: ce-subject
	// (binary mode) or "subject" of the JSON envelope (structured mode),
	// decoded, not percent-encoded.
	Stream string
	// Version is the event's stream version (ce-streamversion /
	// "streamversion"), >= 0.
	Version int64
	// Previous is the version of Stream this subscription delivered (2xx)
	// before Version, or -1 for none (wire.HeaderPreviousVersion).
	Previous int64
	// Partition is the sending owner's partition (wire.HeaderPartition),
	// or -1 when the webhook is not sent by a partition's owner (dead-letter
	// replay, replay by time): then neither the partition nor the epoch is
	// sent or signed.
	Partition int
	// Epoch is the owner's lease epoch (wire.HeaderLeaseEpoch); ignored
	// when Partition < 0.
	Epoch uint64
}

// SignedContent returns the string an order signature signs, the fields
// joined by '.', the stream last so that the join is unambiguous:
//
//	<msgID>.<unix>.<previous>.<version>.<partition>.<epoch>.<stream>
//
// msgID is the request's message id (webhook-id under SchemeStandard,
// Idempotency-Key under SchemeHMACSHA256: both the event id), unix its
// signing timestamp in unix seconds (webhook-timestamp /
// X-Webhook-Timestamp), previous "none" or base 10, version base 10, and
// partition and epoch base 10, or both empty when f.Partition < 0.
func (f OrderFields) SignedContent(msgID string, unix int64) string {
	return string(f.appendSignedContent(make([]byte, 0, len(msgID)+len(f.Stream)+64), msgID, unix))
}

// appendSignedContent appends SignedContent(msgID, unix) to dst.
func (f OrderFields) appendSignedContent(dst []byte, msgID string, unix int64) []byte {
	dst = append(dst, msgID...)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, unix, 10)
	dst = append(dst, '.')
	dst = appendPreviousVersion(dst, f.Previous)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, f.Version, 10)
	dst = append(dst, '.')
	if f.Partition >= 0 {
		dst = strconv.AppendInt(dst, int64(f.Partition), 10)
		dst = append(dst, '.')
		dst = strconv.AppendUint(dst, f.Epoch, 10)
	} else {
		dst = append(dst, '.')
	}
	dst = append(dst, '.')
	return append(dst, f.Stream...)
}

// appendPreviousVersion appends wire.FormatPreviousVersion(v) to dst.
func appendPreviousVersion(dst []byte, v int64) []byte {
	if v < 0 {
		return append(dst, wire.PreviousNone...)
	}
	return strconv.AppendInt(dst, v, 10)
}

// OrderSignature returns the Jsbridge-Order-Signature value of f for a
// request with message id msgID signed at ts (truncated to unix seconds),
// one entry per secret, space-separated:
//
//   - SchemeStandard (or ""): "v1,<base64 HMAC-SHA256>" for a whsec_
//     secret, "v1a,<base64 ed25519 signature>" for a whsk_ secret key, as
//     in webhook-signature;
//   - SchemeHMACSHA256: "sha256=<hex HMAC-SHA256>".
//
// The content is f.SignedContent(msgID, ts.Unix()). Keys that cannot sign
// under the scheme add no entry, as in Sign; "" when none can.
func (s *Signer) OrderSignature(msgID string, ts time.Time, f OrderFields) string {
	var buf [128]byte
	return string(s.appendOrderSignature(buf[:0], msgID, ts, f))
}

// appendOrderSignature appends OrderSignature(msgID, ts, f) to dst.
func (s *Signer) appendOrderSignature(dst []byte, msgID string, ts time.Time, f OrderFields) []byte {
	if s.Scheme != SchemeStandard && s.Scheme != "" && s.Scheme != SchemeHMACSHA256 {
		return dst
	}
	var contentBuf [160]byte
	content := f.appendSignedContent(contentBuf[:0], msgID, ts.Unix())
	signed := false
	for i, sec := range s.Secrets {
		if sec.kind == kindWhpk || (sec.kind == kindWhsk && s.Scheme == SchemeHMACSHA256) {
			continue
		}
		if signed {
			dst = append(dst, ' ')
		}
		signed = true
		switch {
		case s.Scheme == SchemeHMACSHA256:
			sum := s.mac(i, content, nil)
			dst = hex.AppendEncode(append(dst, "sha256="...), sum[:])
		case sec.kind == kindWhsk:
			dst = base64.StdEncoding.AppendEncode(append(dst, "v1a,"...), ed25519.Sign(ed25519.PrivateKey(sec.key), content))
		default:
			sum := s.mac(i, content, nil)
			dst = base64.StdEncoding.AppendEncode(append(dst, "v1,"...), sum[:])
		}
	}
	return dst
}

// SignOrder sets the ordering headers of an ordered webhook on h, beside
// what Sign sets (call both with the same msgID and ts):
// wire.HeaderPreviousVersion (f.Previous, or "none"),
// wire.HeaderPartition and wire.HeaderLeaseEpoch (removed when
// f.Partition < 0, as on replay paths), and wire.HeaderOrderSignature
// (OrderSignature). The stream and version travel as the content mode
// puts them (ce-subject and ce-streamversion headers, or the envelope's
// "subject" and "streamversion") and are not set here.
func (s *Signer) SignOrder(h http.Header, msgID string, ts time.Time, f OrderFields) {
	// The four values are built in one buffer and become one string,
	// which they slice; they share one backing array, each capped so that
	// an append to one copies it.
	var buf [192]byte
	text := appendPreviousVersion(buf[:0], f.Previous)
	ends := [3]int{len(text), len(text), len(text)}
	if f.Partition >= 0 {
		text = strconv.AppendInt(text, int64(f.Partition), 10)
		ends[1] = len(text)
		text = strconv.AppendUint(text, f.Epoch, 10)
		ends[2] = len(text)
	}
	text = s.appendOrderSignature(text, msgID, ts, f)
	all := string(text)
	vals := make([]string, 4)
	vals[0], vals[1], vals[2], vals[3] = all[:ends[0]], all[ends[0]:ends[1]], all[ends[1]:ends[2]], all[ends[2]:]
	h[wire.HeaderPreviousVersion] = vals[0:1:1]
	if f.Partition >= 0 {
		h[wire.HeaderPartition] = vals[1:2:2]
		h[wire.HeaderLeaseEpoch] = vals[2:3:3]
	} else {
		delete(h, wire.HeaderPartition)
		delete(h, wire.HeaderLeaseEpoch)
	}
	h[wire.HeaderOrderSignature] = vals[3:4:4]
}

// VerifyOrder checks that h's Jsbridge-Order-Signature signs f, the
// ordering fields as the receiver read them from the request, under one of
// v's secrets or public keys. The message id is h's webhook-id
// (SchemeStandard) or Idempotency-Key (SchemeHMACSHA256), the timestamp
// the scheme's timestamp header; Verify checks that timestamp's freshness
// and VerifyOrder only uses it. Entries may be separated by spaces or
// commas; "v1" entries are checked against whsec_ secrets, "v1a" against
// whpk_ keys, "sha256=" under SchemeHMACSHA256, HMACs in constant time.
// Errors wrap ErrMissingOrderSignature, ErrMissingTimestamp (absent or not
// unix seconds) or ErrBadOrderSignature; nil means the fields are the
// sender's.
func (v *Verifier) VerifyOrder(h http.Header, f OrderFields) error {
	sigs := strings.TrimSpace(h.Get(wire.HeaderOrderSignature))
	if sigs == "" {
		return fmt.Errorf("verify order: %s header: %w", wire.HeaderOrderSignature, ErrMissingOrderSignature)
	}
	tsHeader, idHeader := HeaderWebhookTimestamp, HeaderWebhookID
	if v.scheme == SchemeHMACSHA256 {
		tsHeader, idHeader = HeaderTimestamp, wire.HeaderIdempotencyKey
	}
	ts := strings.TrimSpace(h.Get(tsHeader))
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("verify order: %s header %q is not unix seconds: %w", tsHeader, ts, ErrMissingTimestamp)
	}
	id := h.Get(idHeader)
	if id == "" {
		return fmt.Errorf("verify order: %s header missing, the order signature signs it: %w", idHeader, ErrBadOrderSignature)
	}
	content := []byte(f.SignedContent(id, unix))
	// Commas separate entries under SchemeHMACSHA256 only: a Standard
	// Webhooks entry holds one ("v1,<base64>").
	entries := strings.FieldsFunc(sigs, func(r rune) bool { return r == ' ' || (r == ',' && v.scheme == SchemeHMACSHA256) })
	for _, entry := range entries {
		if v.verifyOrderEntry(entry, content) {
			return nil
		}
	}
	return fmt.Errorf("verify order: no signature in %s matches the ordering fields: %w", wire.HeaderOrderSignature, ErrBadOrderSignature)
}

// verifyOrderEntry reports whether one signature entry signs content under
// one of v's keys.
func (v *Verifier) verifyOrderEntry(entry string, content []byte) bool {
	if v.scheme == SchemeHMACSHA256 {
		hexSig, ok := strings.CutPrefix(entry, "sha256=")
		if !ok {
			return false
		}
		got, err := hex.DecodeString(hexSig)
		if err != nil {
			return false
		}
		for _, sec := range v.secrets {
			if hmac.Equal(got, macOf(sec.key, "", content)) {
				return true
			}
		}
		return false
	}
	version, b64, ok := strings.Cut(entry, ",")
	if !ok {
		return false
	}
	got, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return false
	}
	for _, sec := range v.secrets {
		switch {
		case version == "v1" && sec.kind == kindWhsec:
			if hmac.Equal(got, macOf(sec.key, "", content)) {
				return true
			}
		case version == "v1a" && sec.kind == kindWhpk && len(got) == ed25519.SignatureSize:
			if ed25519.Verify(ed25519.PublicKey(sec.key), content, got) {
				return true
			}
		}
	}
	return false
}
