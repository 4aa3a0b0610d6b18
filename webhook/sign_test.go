package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
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

// Secrets used across the tests: two Standard Webhooks secrets and two raw.
const (
	whsecOld = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	whsecNew = "whsec_c2Vjb25kLXNlY3JldC1rZXktZm9yLXJvdGF0aW9u" // "second-secret-key-for-rotation"
	rawOld   = "old-raw-secret"
	rawNew   = "new-raw-secret"
)

// signTestBundle is what the signing tests share: a fixed clock and a body.
type signTestBundle struct {
	now  time.Time
	body []byte
}

func setupSign(t *testing.T) signTestBundle {
	t.Helper()
	return signTestBundle{
		now:  time.Unix(1_700_000_000, 0),
		body: []byte(`{"specversion":"1.0","id":"42","type":"OrderPlaced"}`),
	}
}

// secretsFor returns an old and a new secret in the form scheme needs.
func secretsFor(scheme webhook.Scheme) (oldSecret, newSecret string) {
	if scheme == webhook.SchemeStandard {
		return whsecOld, whsecNew
	}
	return rawOld, rawNew
}

func newVerifier(t *testing.T, scheme webhook.Scheme, now time.Time, secrets ...string) *webhook.Verifier {
	t.Helper()
	v, err := webhook.NewVerifier(scheme, secrets, webhook.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	return v
}

func sign(t *testing.T, scheme webhook.Scheme, ts time.Time, body []byte, secrets ...string) http.Header {
	t.Helper()
	s, err := webhook.NewSigner(scheme, secrets...)
	require.NoError(t, err)
	h := http.Header{}
	s.Sign(h, "42", ts, body)
	return h
}

var schemes = []webhook.Scheme{webhook.SchemeStandard, webhook.SchemeHMACSHA256}

func TestParseScheme(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"standard", "hmac-sha256"} {
		got, err := webhook.ParseScheme(s)
		require.NoError(t, err)
		require.Equal(t, webhook.Scheme(s), got)
	}
	_, err := webhook.ParseScheme("HMAC")
	require.ErrorIs(t, err, webhook.ErrInvalidScheme)
	require.Contains(t, err.Error(), `"HMAC"`)
}

func TestParseSecret(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		in      string
		problem string
	}{
		"empty":          {"", "empty"},
		"bad base64":     {"whsec_not*base64!!", "not valid base64"},
		"empty key":      {"whsec_", "empty key"},
		"trailing space": {"topsecret\n", "whitespace"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := webhook.ParseSecret(tc.in)
			require.ErrorIs(t, err, webhook.ErrInvalidSecret)
			require.Contains(t, err.Error(), tc.problem)
			if tc.in != "" && tc.in != "whsec_" {
				require.NotContains(t, err.Error(), strings.TrimPrefix(strings.TrimSpace(tc.in), "whsec_"))
			}
		})
	}
}

func TestSecretNeverPrints(t *testing.T) {
	t.Parallel()
	s, err := webhook.NewSigner(webhook.SchemeHMACSHA256, rawOld)
	require.NoError(t, err)
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("signer", "secret", s.Secrets[0], "signer", s)
	for _, out := range []string{
		fmt.Sprintf("%v %+v %#v %s %x", *s, *s, *s, s.Secrets, s.Secrets),
		logged.String(),
	} {
		require.NotContains(t, out, rawOld)
		require.NotContains(t, out, hex.EncodeToString([]byte(rawOld)))
		require.Contains(t, out, "redacted")
	}
}

func TestNewSignerRejectsBadInput(t *testing.T) {
	t.Parallel()
	_, err := webhook.NewSigner("nope", rawOld)
	require.ErrorIs(t, err, webhook.ErrInvalidScheme)
	_, err = webhook.NewSigner(webhook.SchemeHMACSHA256)
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)
	_, err = webhook.NewSigner(webhook.SchemeStandard, whsecOld, rawOld)
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)
	require.Contains(t, err.Error(), "secrets[1]")
	require.NotContains(t, err.Error(), rawOld)

	_, err = webhook.NewVerifier(webhook.SchemeStandard, []string{whsecOld}, webhook.WithTolerance(0))
	require.ErrorIs(t, err, webhook.ErrInvalidOption)
	require.Contains(t, err.Error(), "tolerance 0s")
	_, err = webhook.NewVerifier(webhook.SchemeStandard, []string{whsecOld}, webhook.WithClock(nil))
	require.ErrorIs(t, err, webhook.ErrInvalidOption)
}

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	for _, scheme := range schemes {
		t.Run(string(scheme), func(t *testing.T) {
			t.Parallel()
			b := setupSign(t)
			secret, _ := secretsFor(scheme)
			h := sign(t, scheme, b.now, b.body, secret)
			require.NoError(t, newVerifier(t, scheme, b.now, secret).Verify(h, b.body))
		})
	}
}

// TestStandardKnownAnswer checks the Standard Webhooks wire format against the
// spec's formula computed here independently, and against the published
// example vector of the Standard Webhooks reference libraries.
func TestStandardKnownAnswer(t *testing.T) {
	t.Parallel()
	const (
		msgID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		unix  = 1614265330
		want  = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	body := []byte(`{"test": 2432232314}`)
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(whsecOld, "whsec_"))
	require.NoError(t, err)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(msgID + "." + strconv.Itoa(unix) + "." + string(body)))
	require.Equal(t, want, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))

	s, err := webhook.NewSigner(webhook.SchemeStandard, whsecOld)
	require.NoError(t, err)
	h := http.Header{}
	s.Sign(h, msgID, time.Unix(unix, 0), body)
	require.Equal(t, msgID, h.Get("webhook-id"))
	require.Equal(t, "1614265330", h.Get("webhook-timestamp"))
	require.Equal(t, want, h.Get("webhook-signature"))
	require.NoError(t, newVerifier(t, webhook.SchemeStandard, time.Unix(unix, 0), whsecOld).Verify(h, body))
}

func TestHMACKnownAnswer(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	mac := hmac.New(sha256.New, []byte(rawOld))
	mac.Write([]byte("1700000000." + string(b.body)))
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))

	h := sign(t, webhook.SchemeHMACSHA256, b.now, b.body, rawOld)
	require.Equal(t, "1700000000", h.Get("X-Webhook-Timestamp"))
	require.Equal(t, want, h.Get("X-Webhook-Signature"))
	require.Empty(t, h.Get("webhook-id"))
}

// TestHMACWhsecSecret: a whsec_ secret under the HMAC-SHA256 scheme keys the
// HMAC with its decoded bytes, as under Standard Webhooks.
func TestHMACWhsecSecret(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	mac := hmac.New(sha256.New, []byte("second-secret-key-for-rotation"))
	mac.Write([]byte("1700000000." + string(b.body)))
	h := sign(t, webhook.SchemeHMACSHA256, b.now, b.body, whsecNew)
	require.Equal(t, "sha256="+hex.EncodeToString(mac.Sum(nil)), h.Get("X-Webhook-Signature"))
}

func TestVerifyFailureReasons(t *testing.T) {
	t.Parallel()
	sentinels := []error{webhook.ErrMissingSignature, webhook.ErrMissingTimestamp, webhook.ErrTimestampStale, webhook.ErrTimestampFuture, webhook.ErrBadSignature}
	for _, scheme := range schemes {
		sigHeader, tsHeader := "webhook-signature", "webhook-timestamp"
		if scheme == webhook.SchemeHMACSHA256 {
			sigHeader, tsHeader = "X-Webhook-Signature", "X-Webhook-Timestamp"
		}
		cases := []struct {
			name   string
			want   error
			reason string
			// mutate builds the request from a good signature.
			mutate func(b signTestBundle, secret string) (http.Header, []byte)
		}{
			{"missing signature", webhook.ErrMissingSignature, "missing-signature", func(b signTestBundle, secret string) (http.Header, []byte) {
				h := sign(t, scheme, b.now, b.body, secret)
				h.Del(sigHeader)
				return h, b.body
			}},
			{"missing timestamp", webhook.ErrMissingTimestamp, "missing-timestamp", func(b signTestBundle, secret string) (http.Header, []byte) {
				h := sign(t, scheme, b.now, b.body, secret)
				h.Del(tsHeader)
				return h, b.body
			}},
			{"malformed timestamp", webhook.ErrMissingTimestamp, "missing-timestamp", func(b signTestBundle, secret string) (http.Header, []byte) {
				h := sign(t, scheme, b.now, b.body, secret)
				h.Set(tsHeader, "yesterday")
				return h, b.body
			}},
			{"stale", webhook.ErrTimestampStale, "stale", func(b signTestBundle, secret string) (http.Header, []byte) {
				return sign(t, scheme, b.now.Add(-webhook.DefaultTolerance-time.Second), b.body, secret), b.body
			}},
			{"future", webhook.ErrTimestampFuture, "future", func(b signTestBundle, secret string) (http.Header, []byte) {
				return sign(t, scheme, b.now.Add(webhook.DefaultTolerance+time.Second), b.body, secret), b.body
			}},
			{"tampered body", webhook.ErrBadSignature, "bad-signature", func(b signTestBundle, secret string) (http.Header, []byte) {
				return sign(t, scheme, b.now, b.body, secret), append([]byte(nil), append(b.body, ' ')...)
			}},
			{"wrong secret", webhook.ErrBadSignature, "bad-signature", func(b signTestBundle, _ string) (http.Header, []byte) {
				_, other := secretsFor(scheme)
				return sign(t, scheme, b.now, b.body, other), b.body
			}},
			{"timestamp changed after signing", webhook.ErrBadSignature, "bad-signature", func(b signTestBundle, secret string) (http.Header, []byte) {
				h := sign(t, scheme, b.now, b.body, secret)
				h.Set(tsHeader, strconv.FormatInt(b.now.Unix()+1, 10))
				return h, b.body
			}},
			{"garbage signature", webhook.ErrBadSignature, "bad-signature", func(b signTestBundle, secret string) (http.Header, []byte) {
				h := sign(t, scheme, b.now, b.body, secret)
				h.Set(sigHeader, "v1,!!!! sha256=zz v2,abc")
				return h, b.body
			}},
		}
		if scheme == webhook.SchemeStandard {
			cases = append(cases, struct {
				name   string
				want   error
				reason string
				mutate func(b signTestBundle, secret string) (http.Header, []byte)
			}{"webhook-id changed", webhook.ErrBadSignature, "bad-signature", func(b signTestBundle, secret string) (http.Header, []byte) {
				h := sign(t, scheme, b.now, b.body, secret)
				h.Set("webhook-id", "43")
				return h, b.body
			}})
		}
		for _, tc := range cases {
			t.Run(string(scheme)+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := setupSign(t)
				secret, _ := secretsFor(scheme)
				h, body := tc.mutate(b, secret)
				err := newVerifier(t, scheme, b.now, secret).Verify(h, body)
				require.ErrorIs(t, err, tc.want)
				for _, other := range sentinels {
					if other != tc.want {
						require.False(t, errors.Is(err, other), "error %v also matches %v", err, other)
					}
				}
				require.Equal(t, tc.reason, webhook.Reason(err))
			})
		}
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	require.Equal(t, "", webhook.Reason(nil))
	require.Equal(t, "invalid", webhook.Reason(errors.New("other")))
	seen := map[string]bool{}
	for _, err := range []error{webhook.ErrMissingSignature, webhook.ErrMissingTimestamp, webhook.ErrTimestampStale, webhook.ErrTimestampFuture, webhook.ErrBadSignature, webhook.ErrMissingOrderSignature, webhook.ErrBadOrderSignature} {
		r := webhook.Reason(fmt.Errorf("wrapped: %w", err))
		require.False(t, seen[r], "reason %q repeats", r)
		seen[r] = true
	}
}

func TestVerifyToleranceEdges(t *testing.T) {
	t.Parallel()
	for _, scheme := range schemes {
		t.Run(string(scheme), func(t *testing.T) {
			t.Parallel()
			b := setupSign(t)
			secret, _ := secretsFor(scheme)
			v, err := webhook.NewVerifier(scheme, []string{secret}, webhook.WithTolerance(time.Minute), webhook.WithClock(func() time.Time { return b.now }))
			require.NoError(t, err)
			require.NoError(t, v.Verify(sign(t, scheme, b.now.Add(-time.Minute), b.body, secret), b.body))
			require.NoError(t, v.Verify(sign(t, scheme, b.now.Add(time.Minute), b.body, secret), b.body))
			require.ErrorIs(t, v.Verify(sign(t, scheme, b.now.Add(-time.Minute-time.Second), b.body, secret), b.body), webhook.ErrTimestampStale)
			require.ErrorIs(t, v.Verify(sign(t, scheme, b.now.Add(time.Minute+time.Second), b.body, secret), b.body), webhook.ErrTimestampFuture)
		})
	}
}

func TestRotation(t *testing.T) {
	t.Parallel()
	for _, scheme := range schemes {
		t.Run(string(scheme), func(t *testing.T) {
			t.Parallel()
			b := setupSign(t)
			oldSecret, newSecret := secretsFor(scheme)

			both := sign(t, scheme, b.now, b.body, oldSecret, newSecret)
			require.NoError(t, newVerifier(t, scheme, b.now, newSecret).Verify(both, b.body), "signed with old+new, verifier knows only new")
			require.NoError(t, newVerifier(t, scheme, b.now, oldSecret).Verify(both, b.body), "signed with old+new, verifier knows only old")

			bothVerifier := newVerifier(t, scheme, b.now, oldSecret, newSecret)
			require.NoError(t, bothVerifier.Verify(sign(t, scheme, b.now, b.body, oldSecret), b.body), "verifier knows both, signed with old")
			require.NoError(t, bothVerifier.Verify(sign(t, scheme, b.now, b.body, newSecret), b.body), "verifier knows both, signed with new")

			require.ErrorIs(t, newVerifier(t, scheme, b.now, newSecret).Verify(sign(t, scheme, b.now, b.body, oldSecret), b.body), webhook.ErrBadSignature, "retired secret is rejected")
		})
	}
}

// FuzzVerify: under both schemes, Verify never panics, whatever the
// headers, and never accepts a body other than the signed one.
func FuzzVerify(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	f.Add([]byte(`{"a":1}`), []byte(`{"a":2}`), "42", int64(0), "", "", false)
	f.Add([]byte(`x`), []byte(`x`), "id", int64(-400), "v1,AAAA sha256=00", "", true)
	f.Add([]byte{}, []byte{0}, "", int64(1<<62), " , v1,", "-1", false)
	f.Add([]byte(`{}`), []byte(`{}`), "42", int64(0), "", "99999999999999999999", true)
	f.Fuzz(func(t *testing.T, signed, received []byte, msgID string, skew int64, extraSig, rawTimestamp string, hmacScheme bool) {
		scheme, secret := webhook.SchemeStandard, whsecOld
		sigHeader, tsHeader := "webhook-signature", "webhook-timestamp"
		if hmacScheme {
			scheme, secret = webhook.SchemeHMACSHA256, rawOld
			sigHeader, tsHeader = "X-Webhook-Signature", "X-Webhook-Timestamp"
		}
		s, err := webhook.NewSigner(scheme, secret)
		require.NoError(t, err)
		v, err := webhook.NewVerifier(scheme, []string{secret}, webhook.WithClock(func() time.Time { return now }))
		require.NoError(t, err)

		h := http.Header{}
		s.Sign(h, msgID, now, signed)
		if extraSig != "" {
			h.Set(sigHeader, h.Get(sigHeader)+" "+extraSig)
		}
		if skew != 0 {
			h.Set(tsHeader, strconv.FormatInt(now.Unix()+skew, 10))
		}
		if rawTimestamp != "" {
			h.Set(tsHeader, rawTimestamp)
		}
		err = v.Verify(h, received)
		if err == nil && string(signed) != string(received) {
			t.Fatalf("accepted a body different from the signed one: signed %q, received %q", signed, received)
		}
		if err != nil && webhook.Reason(err) == "invalid" {
			t.Fatalf("error without a reason: %v", err)
		}
	})
}

func benchBody() []byte { return []byte(strings.Repeat(`{"k":"v"}`, 114)) } // ~1 KiB

func BenchmarkSign(b *testing.B) {
	body := benchBody()
	now := time.Unix(1_700_000_000, 0)
	for _, scheme := range schemes {
		secret, _ := secretsFor(scheme)
		s, err := webhook.NewSigner(scheme, secret)
		require.NoError(b, err)
		b.Run(string(scheme), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			h := http.Header{}
			for b.Loop() {
				s.Sign(h, "42", now, body)
			}
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	body := benchBody()
	now := time.Unix(1_700_000_000, 0)
	for _, scheme := range schemes {
		secret, _ := secretsFor(scheme)
		s, err := webhook.NewSigner(scheme, secret)
		require.NoError(b, err)
		v, err := webhook.NewVerifier(scheme, []string{secret}, webhook.WithClock(func() time.Time { return now }))
		require.NoError(b, err)
		h := http.Header{}
		s.Sign(h, "42", now, body)
		b.Run(string(scheme), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := v.Verify(h, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSignerConcurrentRotation: one Signer used from many goroutines at
// once (its keyed HMACs are pooled and shared) signs every request under
// every secret of a rotation, each signature verifiable with either
// secret alone, the ordering signature too.
func TestSignerConcurrentRotation(t *testing.T) {
	t.Parallel()
	b := setupSign(t)
	s, err := webhook.NewSigner(webhook.SchemeStandard, whsecOld, whsecNew)
	require.NoError(t, err)
	verifiers := []*webhook.Verifier{newVerifier(t, webhook.SchemeStandard, b.now, whsecOld), newVerifier(t, webhook.SchemeStandard, b.now, whsecNew)}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 200 {
				id := fmt.Sprintf("evt-%d-%d", g, i)
				body := []byte(fmt.Sprintf(`{"goroutine":%d,"n":%d,"pad":%q}`, g, i, strings.Repeat("x", i)))
				f := webhook.OrderFields{Stream: id, Version: int64(i), Previous: int64(i) - 1, Partition: g, Epoch: uint64(i)}
				h := http.Header{}
				s.Sign(h, id, b.now, body)
				s.SignOrder(h, id, b.now, f)
				for _, v := range verifiers {
					if err := v.Verify(h, body); err != nil {
						errs <- fmt.Errorf("%s: %w", id, err)
						return
					}
					if err := v.VerifyOrder(h, f); err != nil {
						errs <- fmt.Errorf("%s order: %w", id, err)
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}
