package webhook_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
)

// rfc8032Key is TEST 1 of RFC 8032 section 7.1: an ed25519 seed and the
// public key it derives. Parsing it checks the whsk_/whpk_ encodings
// against published values, not against our own output.
var rfc8032Key = struct{ seed, pub string }{
	seed: "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
	pub:  "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// rfcKeys returns the RFC 8032 key as a whsk_ secret key (64-byte form),
// the same as a 32-byte seed, and its whpk_ public key.
func rfcKeys(t *testing.T) (whsk, whskSeed, whpk string) {
	t.Helper()
	seed, pub := mustHex(t, rfc8032Key.seed), mustHex(t, rfc8032Key.pub)
	enc := base64.StdEncoding.EncodeToString
	return "whsk_" + enc(append(append([]byte(nil), seed...), pub...)), "whsk_" + enc(seed), "whpk_" + enc(pub)
}

// newKeyPair generates a fresh whsk_/whpk_ pair.
func newKeyPair(t testing.TB) (whsk, whpk string) {
	t.Helper()
	sk, pk, err := webhook.GenerateKeyPair()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(sk, "whsk_") && strings.HasPrefix(pk, "whpk_"))
	return sk, pk
}

// TestParseEd25519Keys: both whsk_ forms give the RFC 8032 public key, and
// a whpk_ key parses.
func TestParseEd25519Keys(t *testing.T) {
	t.Parallel()
	whsk, whskSeed, whpk := rfcKeys(t)
	for _, in := range []string{whsk, whskSeed} {
		sec, err := webhook.ParseSecret(in)
		require.NoError(t, err)
		pub, ok := sec.PublicKey()
		require.True(t, ok)
		require.Equal(t, whpk, pub)
	}
	sec, err := webhook.ParseSecret(whpk)
	require.NoError(t, err)
	_, ok := sec.PublicKey()
	require.False(t, ok, "a public key has no public key of its own to give")
	sec, err = webhook.ParseSecret(whsecOld)
	require.NoError(t, err)
	_, ok = sec.PublicKey()
	require.False(t, ok)

	sk, pk := newKeyPair(t)
	sec, err = webhook.ParseSecret(sk)
	require.NoError(t, err)
	got, _ := sec.PublicKey()
	require.Equal(t, pk, got, "GenerateKeyPair's public key is its secret key's")
}

func TestParseEd25519KeysRejectsBadKeys(t *testing.T) {
	t.Parallel()
	seed, pub := mustHex(t, rfc8032Key.seed), mustHex(t, rfc8032Key.pub)
	otherPub := append([]byte(nil), pub...)
	otherPub[0] ^= 1
	enc := base64.StdEncoding.EncodeToString
	for name, tc := range map[string]struct {
		in      string
		problem string
	}{
		"whsk_ short":           {"whsk_" + enc(seed[:31]), "whsk_ key is 31 bytes"},
		"whsk_ mismatched half": {"whsk_" + enc(append(append([]byte(nil), seed...), otherPub...)), "public half does not match"},
		"whsk_ bad base64":      {"whsk_***", "not valid base64"},
		"whsk_ empty":           {"whsk_", "empty key"},
		"whpk_ long":            {"whpk_" + enc(append(pub, 0)), "whpk_ key is 33 bytes"},
		"whpk_ bad base64":      {"whpk_!!", "not valid base64"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := webhook.ParseSecret(tc.in)
			require.ErrorIs(t, err, webhook.ErrInvalidSecret)
			require.Contains(t, err.Error(), tc.problem)
			if body := tc.in[5:]; len(body) > 4 {
				require.NotContains(t, err.Error(), body)
			}
		})
	}
}

// TestEd25519KeysFitTheirRole: a whpk_ key cannot sign, a whsk_ key is not
// given to a verifier, and neither works under hmac-sha256.
func TestEd25519KeysFitTheirRole(t *testing.T) {
	t.Parallel()
	sk, pk := newKeyPair(t)
	for name, try := range map[string]func() error{
		"sign with whpk_":   func() error { _, err := webhook.NewSigner(webhook.SchemeStandard, whsecOld, pk); return err },
		"verify with whsk_": func() error { _, err := webhook.NewVerifier(webhook.SchemeStandard, []string{pk, sk}); return err },
		"hmac-sha256 signs": func() error { _, err := webhook.NewSigner(webhook.SchemeHMACSHA256, rawOld, sk); return err },
		"hmac-sha256 verifies": func() error {
			_, err := webhook.NewVerifier(webhook.SchemeHMACSHA256, []string{rawOld, pk})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := try()
			require.ErrorIs(t, err, webhook.ErrInvalidSecret)
			require.Contains(t, err.Error(), "secrets[1]")
			require.NotContains(t, err.Error(), strings.TrimPrefix(sk, "whsk_"))
		})
	}
}

// TestV1aKnownAnswer: the v1a entry is ed25519 over
// "<webhook-id>.<webhook-timestamp>.<body>" under the RFC 8032 key,
// base64-encoded, computed here from the spec with crypto/ed25519 alone;
// the signature verifies under the published public key.
func TestV1aKnownAnswer(t *testing.T) {
	t.Parallel()
	const (
		msgID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		unix  = 1614265330
	)
	body := []byte(`{"test": 2432232314}`)
	priv := ed25519.NewKeyFromSeed(mustHex(t, rfc8032Key.seed))
	content := []byte(msgID + "." + strconv.Itoa(unix) + "." + string(body))
	want := "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, content))

	whsk, whskSeed, whpk := rfcKeys(t)
	for _, key := range []string{whsk, whskSeed} {
		s, err := webhook.NewSigner(webhook.SchemeStandard, key)
		require.NoError(t, err)
		h := http.Header{}
		s.Sign(h, msgID, time.Unix(unix, 0), body)
		require.Equal(t, msgID, h.Get("webhook-id"))
		require.Equal(t, "1614265330", h.Get("webhook-timestamp"))
		require.Equal(t, want, h.Get("webhook-signature"))

		sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(h.Get("webhook-signature"), "v1a,"))
		require.NoError(t, err)
		require.True(t, ed25519.Verify(ed25519.PublicKey(mustHex(t, rfc8032Key.pub)), content, sig), "the RFC 8032 public key verifies it")
		require.NoError(t, newVerifier(t, webhook.SchemeStandard, time.Unix(unix, 0), whpk).Verify(h, body))
	}
}

// TestV1aFailures: a v1a signature fails for a tampered body, id or
// timestamp, another key, and a verifier holding only whsec_ secrets.
func TestV1aFailures(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	sk, pk := newKeyPair(t)
	_, otherPK := newKeyPair(t)
	good := func() http.Header { return sign(t, webhook.SchemeStandard, b.now, b.body, sk) }
	v := newVerifier(t, webhook.SchemeStandard, b.now, pk)
	require.NoError(t, v.Verify(good(), b.body))

	require.ErrorIs(t, v.Verify(good(), append([]byte(nil), append(b.body, ' ')...)), webhook.ErrBadSignature)
	h := good()
	h.Set("webhook-id", "43")
	require.ErrorIs(t, v.Verify(h, b.body), webhook.ErrBadSignature)
	h = good()
	h.Set("webhook-timestamp", strconv.FormatInt(b.now.Unix()+1, 10))
	require.ErrorIs(t, v.Verify(h, b.body), webhook.ErrBadSignature)
	h = good()
	h.Set("webhook-signature", strings.Replace(h.Get("webhook-signature"), "v1a,", "v1,", 1))
	require.ErrorIs(t, v.Verify(h, b.body), webhook.ErrBadSignature, "a v1a signature relabelled v1 is not checked as ed25519")
	h = good()
	h.Set("webhook-signature", "v1a,AAAA v1a,"+base64.StdEncoding.EncodeToString(make([]byte, 64)))
	require.ErrorIs(t, v.Verify(h, b.body), webhook.ErrBadSignature, "short and zero signatures")

	require.ErrorIs(t, newVerifier(t, webhook.SchemeStandard, b.now, otherPK).Verify(good(), b.body), webhook.ErrBadSignature, "another public key")
	require.ErrorIs(t, newVerifier(t, webhook.SchemeStandard, b.now, whsecOld).Verify(good(), b.body), webhook.ErrBadSignature, "a whsec_ verifier ignores v1a")
	require.ErrorIs(t, v.Verify(sign(t, webhook.SchemeStandard, b.now, b.body, whsecOld), b.body), webhook.ErrBadSignature, "a whpk_ verifier ignores v1")
	require.ErrorIs(t, v.Verify(sign(t, webhook.SchemeStandard, b.now.Add(-webhook.DefaultTolerance-time.Second), b.body, sk), b.body), webhook.ErrTimestampStale)
}

// TestV1aRotationAndMixedLists: every key signs, so a receiver holding any
// one of them (public key or HMAC secret) accepts, including while a
// sender moves from whsec_ to whsk_.
func TestV1aRotationAndMixedLists(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	skOld, pkOld := newKeyPair(t)
	skNew, pkNew := newKeyPair(t)

	h := sign(t, webhook.SchemeStandard, b.now, b.body, skOld, skNew)
	entries := strings.Fields(h.Get("webhook-signature"))
	require.Len(t, entries, 2)
	for _, e := range entries {
		require.True(t, strings.HasPrefix(e, "v1a,"), e)
	}
	for _, pk := range []string{pkOld, pkNew} {
		require.NoError(t, newVerifier(t, webhook.SchemeStandard, b.now, pk).Verify(h, b.body))
	}

	mixed := sign(t, webhook.SchemeStandard, b.now, b.body, whsecOld, skNew)
	entries = strings.Fields(mixed.Get("webhook-signature"))
	require.Len(t, entries, 2)
	require.True(t, strings.HasPrefix(entries[0], "v1,") && strings.HasPrefix(entries[1], "v1a,"), entries)
	require.NoError(t, newVerifier(t, webhook.SchemeStandard, b.now, whsecOld).Verify(mixed, b.body), "old receiver, HMAC")
	require.NoError(t, newVerifier(t, webhook.SchemeStandard, b.now, pkNew).Verify(mixed, b.body), "new receiver, ed25519")

	both := newVerifier(t, webhook.SchemeStandard, b.now, whsecNew, pkOld)
	require.NoError(t, both.Verify(sign(t, webhook.SchemeStandard, b.now, b.body, whsecNew), b.body))
	require.NoError(t, both.Verify(sign(t, webhook.SchemeStandard, b.now, b.body, skOld), b.body))
	require.ErrorIs(t, both.Verify(sign(t, webhook.SchemeStandard, b.now, b.body, skNew), b.body), webhook.ErrBadSignature)
}

func TestSecretKeyNeverPrints(t *testing.T) {
	t.Parallel()
	sk, _ := newKeyPair(t)
	s, err := webhook.NewSigner(webhook.SchemeStandard, sk)
	require.NoError(t, err)
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sk, "whsk_"))
	require.NoError(t, err)
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("signer", "secret", s.Secrets[0], "signer", s)
	for _, out := range []string{
		fmt.Sprintf("%v %+v %#v %s %x", *s, *s, *s, s.Secrets, s.Secrets),
		logged.String(),
	} {
		require.NotContains(t, out, strings.TrimPrefix(sk, "whsk_"))
		require.NotContains(t, out, hex.EncodeToString(raw[:32]))
		require.Contains(t, out, "redacted")
	}
}

// BenchmarkV1a is BenchmarkSign and BenchmarkVerify for one whsk_ key:
// ed25519 costs far more than HMAC-SHA256, on both sides.
func BenchmarkV1a(b *testing.B) {
	body := benchBody()
	now := time.Unix(1_700_000_000, 0)
	sk, pk, err := webhook.GenerateKeyPair()
	require.NoError(b, err)
	s, err := webhook.NewSigner(webhook.SchemeStandard, sk)
	require.NoError(b, err)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{pk}, webhook.WithClock(func() time.Time { return now }))
	require.NoError(b, err)
	b.Run("sign", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		h := http.Header{}
		for b.Loop() {
			s.Sign(h, "42", now, body)
		}
	})
	b.Run("verify", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		h := http.Header{}
		s.Sign(h, "42", now, body)
		for b.Loop() {
			if err := v.Verify(h, body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzVerifyV1a: a whpk_ verifier never panics and never accepts content
// ("<id>.<timestamp>.<body>") other than the signed one, whatever extra
// entries the header carries. (An id with a "." can shift bytes between id
// and body with the same content; the spec says ids must not hold one, and
// jsbridge's are decimal event ids.)
func FuzzVerifyV1a(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	f.Add([]byte(`{"a":1}`), []byte(`{"a":2}`), "42", "43", "")
	f.Add([]byte(`x`), []byte(`x`), "id", "id", "v1a,AAAA v1,AAAA v1a,")
	f.Add([]byte{}, []byte{}, "", "", "v1a,"+base64.StdEncoding.EncodeToString(make([]byte, 64)))
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "jsbridge-fuzz-seed")
	priv := ed25519.NewKeyFromSeed(seed)
	sk := "whsk_" + base64.StdEncoding.EncodeToString(priv)
	pk := "whpk_" + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
	f.Fuzz(func(t *testing.T, signed, received []byte, signedID, receivedID, extra string) {
		s, err := webhook.NewSigner(webhook.SchemeStandard, sk)
		require.NoError(t, err)
		v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{pk}, webhook.WithClock(func() time.Time { return now }))
		require.NoError(t, err)
		h := http.Header{}
		s.Sign(h, signedID, now, signed)
		h.Set("webhook-id", receivedID)
		if extra != "" {
			h.Set("webhook-signature", extra+" "+h.Get("webhook-signature"))
		}
		err = v.Verify(h, received)
		if err == nil && signedID+"."+string(signed) != receivedID+"."+string(received) {
			t.Fatalf("accepted what was not signed: signed %q/%q, received %q/%q", signedID, signed, receivedID, received)
		}
	})
}
