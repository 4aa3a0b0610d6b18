package webhook_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// ownerFields are the ordering fields of a partition owner's webhook; its
// stream name holds dots and a percent sign, which the signature carries
// as they are.
var ownerFields = webhook.OrderFields{Stream: "order-4.2%x", Version: 7, Previous: 3, Partition: 5, Epoch: 1_700_000_000_123_456}

func TestOrderSignedContent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		f    webhook.OrderFields
		want string
	}{
		{ownerFields, "msg-9.1700000000.3.7.5.1700000000123456.order-4.2%x"},
		{webhook.OrderFields{Stream: "s", Version: 0, Previous: -1, Partition: 0, Epoch: 1}, "msg-9.1700000000.none.0.0.1.s"},
		// Replay paths send no partition or epoch: both fields empty.
		{webhook.OrderFields{Stream: "s", Version: 40, Previous: 12, Partition: -1, Epoch: 99}, "msg-9.1700000000.12.40...s"},
	} {
		require.Equal(t, c.want, c.f.SignedContent("msg-9", 1_700_000_000))
	}
}

// TestOrderSignatureKnownAnswer computes each scheme's entry here
// independently from the documented content.
func TestOrderSignatureKnownAnswer(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	content := ownerFields.SignedContent("42", b.now.Unix())

	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(whsecOld, "whsec_"))
	require.NoError(t, err)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(content))
	wantV1 := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))

	whsk, _ := newKeyPair(t)
	sk, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(whsk, "whsk_"))
	require.NoError(t, err)
	wantV1a := "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(ed25519.PrivateKey(sk), []byte(content)))

	s, err := webhook.NewSigner(webhook.SchemeStandard, whsecOld, whsk)
	require.NoError(t, err)
	require.Equal(t, wantV1+" "+wantV1a, s.OrderSignature("42", b.now, ownerFields))

	raw := hmac.New(sha256.New, []byte(rawOld))
	raw.Write([]byte(content))
	rawNewMAC := hmac.New(sha256.New, []byte(rawNew))
	rawNewMAC.Write([]byte(content))
	s, err = webhook.NewSigner(webhook.SchemeHMACSHA256, rawOld, rawNew)
	require.NoError(t, err)
	require.Equal(t, "sha256="+hex.EncodeToString(raw.Sum(nil))+" sha256="+hex.EncodeToString(rawNewMAC.Sum(nil)),
		s.OrderSignature("42", b.now, ownerFields))
}

// orderScheme is one scheme with a signer's secrets and the matching
// verifier's.
type orderScheme struct {
	name            string
	scheme          webhook.Scheme
	signer, checker []string
}

func orderSchemes(t testing.TB) []orderScheme {
	whsk, whpk := newKeyPair(t)
	return []orderScheme{
		{"standard-v1", webhook.SchemeStandard, []string{whsecOld}, []string{whsecOld}},
		{"standard-v1a", webhook.SchemeStandard, []string{whsk}, []string{whpk}},
		{"hmac-sha256", webhook.SchemeHMACSHA256, []string{rawOld}, []string{rawOld}},
	}
}

// signedOrder returns the headers of a request signed under sc carrying f.
func signedOrder(t *testing.T, sc orderScheme, ts time.Time, f webhook.OrderFields) http.Header {
	t.Helper()
	s, err := webhook.NewSigner(sc.scheme, sc.signer...)
	require.NoError(t, err)
	h := http.Header{}
	h.Set(wire.HeaderIdempotencyKey, "42")
	s.Sign(h, "42", ts, []byte("{}"))
	s.SignOrder(h, "42", ts, f)
	return h
}

func TestSignOrderSetsTheOrderingHeaders(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	sc := orderSchemes(t)[0]
	h := signedOrder(t, sc, b.now, ownerFields)
	require.Equal(t, "3", h.Get(wire.HeaderPreviousVersion))
	require.Equal(t, "5", h.Get(wire.HeaderPartition))
	require.Equal(t, "1700000000123456", h.Get(wire.HeaderLeaseEpoch))
	require.NotEmpty(t, h.Get(wire.HeaderOrderSignature))

	// A replay path: no partition, no epoch, even over stale headers.
	replay := webhook.OrderFields{Stream: "s", Version: 0, Previous: -1, Partition: -1}
	s, err := webhook.NewSigner(sc.scheme, sc.signer...)
	require.NoError(t, err)
	s.SignOrder(h, "42", b.now, replay)
	require.Equal(t, "none", h.Get(wire.HeaderPreviousVersion))
	require.Empty(t, h.Values(wire.HeaderPartition))
	require.Empty(t, h.Values(wire.HeaderLeaseEpoch))
	require.NoError(t, newVerifier(t, sc.scheme, b.now, sc.checker...).VerifyOrder(h, replay))
}

// TestVerifyOrderRefusesAlteredFields changes one ordering field at a
// time, under both schemes and both Standard Webhooks algorithms.
func TestVerifyOrderRefusesAlteredFields(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	alter := map[string]func(f *webhook.OrderFields){
		"stream":          func(f *webhook.OrderFields) { f.Stream += "x" },
		"stream-dot":      func(f *webhook.OrderFields) { f.Stream = "order-4.2%x." },
		"version":         func(f *webhook.OrderFields) { f.Version++ },
		"previous":        func(f *webhook.OrderFields) { f.Previous-- },
		"previous-none":   func(f *webhook.OrderFields) { f.Previous = -1 },
		"partition":       func(f *webhook.OrderFields) { f.Partition++ },
		"epoch":           func(f *webhook.OrderFields) { f.Epoch-- },
		"owner-dropped":   func(f *webhook.OrderFields) { f.Partition = -1 },
		"version-swapped": func(f *webhook.OrderFields) { f.Version, f.Previous = f.Previous, f.Version },
	}
	for _, sc := range orderSchemes(t) {
		t.Run(sc.name, func(t *testing.T) {
			h := signedOrder(t, sc, b.now, ownerFields)
			v := newVerifier(t, sc.scheme, b.now, sc.checker...)
			require.NoError(t, v.VerifyOrder(h, ownerFields))
			for name, change := range alter {
				f := ownerFields
				change(&f)
				err := v.VerifyOrder(h, f)
				require.ErrorIs(t, err, webhook.ErrBadOrderSignature, name)
				require.Equal(t, "bad-order-signature", webhook.Reason(err), name)
			}
			// The signature is bound to the message id and the timestamp.
			for _, hdr := range []string{webhook.HeaderWebhookID, wire.HeaderIdempotencyKey, webhook.HeaderWebhookTimestamp, webhook.HeaderTimestamp} {
				if h.Get(hdr) == "" {
					continue
				}
				hh := h.Clone()
				if hdr == webhook.HeaderWebhookTimestamp || hdr == webhook.HeaderTimestamp {
					hh.Set(hdr, strconv.FormatInt(b.now.Unix()+1, 10))
				} else {
					hh.Set(hdr, "43")
				}
				unsigned := (hdr == webhook.HeaderWebhookID && sc.scheme != webhook.SchemeStandard) ||
					(hdr == wire.HeaderIdempotencyKey && sc.scheme == webhook.SchemeStandard)
				if unsigned {
					require.NoError(t, v.VerifyOrder(hh, ownerFields), "%s is not signed under %s", hdr, sc.scheme)
					continue
				}
				require.ErrorIs(t, v.VerifyOrder(hh, ownerFields), webhook.ErrBadOrderSignature, hdr)
			}
		})
	}
}

func TestVerifyOrderFailures(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	for _, sc := range orderSchemes(t) {
		t.Run(sc.name, func(t *testing.T) {
			v := newVerifier(t, sc.scheme, b.now, sc.checker...)
			tsHeader := webhook.HeaderWebhookTimestamp
			if sc.scheme == webhook.SchemeHMACSHA256 {
				tsHeader = webhook.HeaderTimestamp
			}
			for name, c := range map[string]struct {
				edit func(h http.Header)
				want error
			}{
				"missing":      {func(h http.Header) { h.Del(wire.HeaderOrderSignature) }, webhook.ErrMissingOrderSignature},
				"blank":        {func(h http.Header) { h.Set(wire.HeaderOrderSignature, "  ") }, webhook.ErrMissingOrderSignature},
				"no-timestamp": {func(h http.Header) { h.Del(tsHeader) }, webhook.ErrMissingTimestamp},
				"garbage":      {func(h http.Header) { h.Set(wire.HeaderOrderSignature, "v1,!!! sha256=zz v9,AAAA") }, webhook.ErrBadOrderSignature},
				"body-signature": {func(h http.Header) {
					h.Set(wire.HeaderOrderSignature, h.Get(webhook.HeaderWebhookSignature)+h.Get(webhook.HeaderSignature))
				}, webhook.ErrBadOrderSignature},
				"no-message-id": {func(h http.Header) {
					h.Del(webhook.HeaderWebhookID)
					h.Del(wire.HeaderIdempotencyKey)
				}, webhook.ErrBadOrderSignature},
			} {
				h := signedOrder(t, sc, b.now, ownerFields)
				c.edit(h)
				err := v.VerifyOrder(h, ownerFields)
				require.True(t, errors.Is(err, c.want), "%s: %v, want %v", name, err, c.want)
			}
			// A verifier holding another secret refuses.
			other := newVerifier(t, sc.scheme, b.now, map[webhook.Scheme]string{webhook.SchemeStandard: whsecNew, webhook.SchemeHMACSHA256: rawNew}[sc.scheme])
			require.ErrorIs(t, other.VerifyOrder(signedOrder(t, sc, b.now, ownerFields), ownerFields), webhook.ErrBadOrderSignature)
		})
	}
}

// TestVerifyOrderRotation: during a rotation the sender signs with both
// secrets and a receiver holding either accepts; under HMAC-SHA256 commas
// between entries are accepted too, as in X-Webhook-Signature.
func TestVerifyOrderRotation(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	whsk, whpk := newKeyPair(t)
	for _, c := range []struct {
		scheme  webhook.Scheme
		signer  []string
		holders []string
	}{
		{webhook.SchemeStandard, []string{whsecOld, whsk}, []string{whsecOld, whpk}},
		{webhook.SchemeHMACSHA256, []string{rawOld, rawNew}, []string{rawOld, rawNew}},
	} {
		h := signedOrder(t, orderScheme{scheme: c.scheme, signer: c.signer}, b.now, ownerFields)
		require.Len(t, strings.Fields(h.Get(wire.HeaderOrderSignature)), 2)
		for _, holder := range c.holders {
			require.NoError(t, newVerifier(t, c.scheme, b.now, holder).VerifyOrder(h, ownerFields), "%s holding one secret", c.scheme)
		}
		if c.scheme == webhook.SchemeHMACSHA256 {
			h.Set(wire.HeaderOrderSignature, strings.Join(strings.Fields(h.Get(wire.HeaderOrderSignature)), ","))
			require.NoError(t, newVerifier(t, c.scheme, b.now, rawNew).VerifyOrder(h, ownerFields))
		}
	}
}

// TestWireDocOrderExamples: the examples of docs/wire.md's "Ordered
// webhooks" are what the code signs, under both schemes and both
// Standard Webhooks algorithms, for an owner's webhook and a replay's.
func TestWireDocOrderExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/wire.md")
	require.NoError(t, err)
	ts := time.Unix(1_700_000_000, 0)
	owner := webhook.OrderFields{Stream: "order-42", Version: 7, Previous: 3, Partition: 5, Epoch: 1764329000000000}
	replay := owner
	replay.Partition = -1
	whsk, _, whpk := rfcKeys(t)
	seedForm := "whsk_" + base64.StdEncoding.EncodeToString(mustHex(t, rfc8032Key.seed))
	require.Contains(t, string(doc), seedForm)
	require.Contains(t, string(doc), whpk)
	for _, f := range []webhook.OrderFields{owner, replay} {
		require.Contains(t, string(doc), "content:  "+f.SignedContent("1024", ts.Unix()))
		for _, c := range []struct {
			scheme webhook.Scheme
			secret string
		}{{webhook.SchemeStandard, whsecOld}, {webhook.SchemeHMACSHA256, "my-secret"}} {
			s, err := webhook.NewSigner(c.scheme, c.secret)
			require.NoError(t, err)
			require.Contains(t, string(doc), "Jsbridge-Order-Signature: "+s.OrderSignature("1024", ts, f))
		}
	}
	s, err := webhook.NewSigner(webhook.SchemeStandard, whsk)
	require.NoError(t, err)
	require.Contains(t, string(doc), "Jsbridge-Order-Signature: "+s.OrderSignature("1024", ts, owner))
}

// BenchmarkOrderSignature measures what the order signature adds to each
// ordered webhook: SignOrder on the sender, VerifyOrder in the gate.
func BenchmarkOrderSignature(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	for _, sc := range orderSchemes(b) {
		s, err := webhook.NewSigner(sc.scheme, sc.signer...)
		require.NoError(b, err)
		v, err := webhook.NewVerifier(sc.scheme, sc.checker, webhook.WithClock(func() time.Time { return now }))
		require.NoError(b, err)
		h := http.Header{}
		h.Set(wire.HeaderIdempotencyKey, "42")
		s.Sign(h, "42", now, []byte("{}"))
		b.Run("sign/"+sc.name, func(b *testing.B) {
			for b.Loop() {
				s.SignOrder(h, "42", now, ownerFields)
			}
		})
		b.Run("verify/"+sc.name, func(b *testing.B) {
			for b.Loop() {
				if err := v.VerifyOrder(h, ownerFields); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
