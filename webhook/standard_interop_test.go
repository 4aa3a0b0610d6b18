package webhook_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
)

// The reference library checks timestamps against time.Now with its own
// fixed 5-minute tolerance, so these tests sign at time.Now.

// TestStandardInteropOursVerifiedByReference: what our Signer sends (one
// secret, and two during a rotation) verifies with the Standard Webhooks
// reference Go library; a tampered body does not.
func TestStandardInteropOursVerifiedByReference(t *testing.T) {
	t.Parallel()
	body := []byte(`{"specversion":"1.0","id":"42","type":"OrderPlaced","data":{"total":12.5}}`)
	for name, secrets := range map[string][]string{
		"one secret":    {whsecOld},
		"rotation, old": {whsecOld, whsecNew},
		"rotation, new": {whsecNew, whsecOld},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := webhook.NewSigner(webhook.SchemeStandard, secrets...)
			require.NoError(t, err)
			h := http.Header{}
			s.Sign(h, "msg_42", time.Now(), body)
			for _, secret := range secrets {
				ref, err := standardwebhooks.NewWebhook(secret)
				require.NoError(t, err)
				require.NoError(t, ref.Verify(body, h), "reference library rejects our signature for one of the secrets")
				require.ErrorIs(t, ref.Verify(append([]byte(nil), append(body, ' ')...), h), standardwebhooks.ErrNoMatchingSignature)
			}
		})
	}
}

// TestStandardInteropReferenceVerifiedByOurs: what the reference library
// signs verifies with our Verifier, including when it sits among other
// signatures, and fails ours for a tampered body, id or timestamp.
func TestStandardInteropReferenceVerifiedByOurs(t *testing.T) {
	t.Parallel()
	body := []byte(`{"test": 2432232314}`)
	now := time.Now()
	ref, err := standardwebhooks.NewWebhook(whsecNew)
	require.NoError(t, err)
	sig, err := ref.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", now, body)
	require.NoError(t, err)

	headers := func(sigs string) http.Header {
		h := http.Header{}
		h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
		h.Set("webhook-timestamp", itoa(now.Unix()))
		h.Set("webhook-signature", sigs)
		return h
	}
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{whsecOld, whsecNew})
	require.NoError(t, err)
	require.NoError(t, v.Verify(headers(sig), body))
	require.NoError(t, v.Verify(headers("v1,bm90LXRoaXMtb25l v2,whatever "+sig), body), "the matching entry is not first")
	require.NoError(t, ref.Verify(body, headers(sig)), "the reference library agrees")

	require.ErrorIs(t, v.Verify(headers(sig), []byte(`{"test": 2432232315}`)), webhook.ErrBadSignature)
	h := headers(sig)
	h.Set("webhook-id", "msg_other")
	require.ErrorIs(t, v.Verify(h, body), webhook.ErrBadSignature)
	h = headers(sig)
	h.Set("webhook-timestamp", itoa(now.Unix()-1))
	require.ErrorIs(t, v.Verify(h, body), webhook.ErrBadSignature)

	onlyOld, err := webhook.NewVerifier(webhook.SchemeStandard, []string{whsecOld})
	require.NoError(t, err)
	require.ErrorIs(t, onlyOld.Verify(headers(sig), body), webhook.ErrBadSignature, "signed with a secret the verifier does not hold")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestStandardInteropMixedV1a: the reference Go library (v0.0.1, the only
// version on the Go module proxy) verifies v1 only; it has no v1a. A header
// our Signer fills during a move from whsec_ to whsk_ (a v1 and a v1a
// entry) still verifies with it, since it skips the v1a entry as the spec
// wants unknown versions skipped, and a v1a-only header does not.
func TestStandardInteropMixedV1a(t *testing.T) {
	t.Parallel()
	body := []byte(`{"specversion":"1.0","id":"42","type":"OrderPlaced"}`)
	sk, pk, err := webhook.GenerateKeyPair()
	require.NoError(t, err)
	ref, err := standardwebhooks.NewWebhook(whsecOld)
	require.NoError(t, err)

	for name, secrets := range map[string][]string{"v1a first": {sk, whsecOld}, "v1 first": {whsecOld, sk}} {
		s, err := webhook.NewSigner(webhook.SchemeStandard, secrets...)
		require.NoError(t, err)
		h := http.Header{}
		s.Sign(h, "msg_42", time.Now(), body)
		require.NoError(t, ref.Verify(body, h), name)
		v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{pk})
		require.NoError(t, err)
		require.NoError(t, v.Verify(h, body), name)
	}

	only, err := webhook.NewSigner(webhook.SchemeStandard, sk)
	require.NoError(t, err)
	h := http.Header{}
	only.Sign(h, "msg_42", time.Now(), body)
	require.ErrorIs(t, ref.Verify(body, h), standardwebhooks.ErrNoMatchingSignature)
}
