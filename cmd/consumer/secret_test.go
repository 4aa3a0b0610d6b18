package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
)

// secretLines runs `consumer secret` (with --ed25519 when ed) and returns
// its stdout lines.
func secretLines(t *testing.T, ed bool) []string {
	t.Helper()
	var out, note bytes.Buffer
	require.NoError(t, (&secretCmd{Ed25519: ed}).write(&out, &note))
	require.Contains(t, note.String(), "Standard Webhooks", "stderr says what the output is for")
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

// signed returns headers and body signed by the consumer's signer with
// secret, as a delivery would be.
func signed(t *testing.T, secret string) (http.Header, []byte) {
	t.Helper()
	signer, err := webhook.NewSigner(webhook.SchemeStandard, secret)
	require.NoError(t, err)
	h, body := http.Header{}, []byte(`{"id":"42"}`)
	signer.Sign(h, "42", time.Now(), body)
	return h, body
}

// The whsec_ secret signs a v1 signature that the receiver verifies with
// the same secret, and that the Standard Webhooks recipe (HMAC-SHA256 of
// "<id>.<timestamp>.<body>" under the base64-decoded key) reproduces.
func TestSecretSignsAndVerifies(t *testing.T) {
	t.Parallel()
	lines := secretLines(t, false)
	require.Len(t, lines, 1)
	secret := lines[0]
	require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	require.NoError(t, err)
	require.Len(t, key, webhook.SecretSize)
	require.NotEqual(t, secret, secretLines(t, false)[0], "each run prints a new secret")

	h, body := signed(t, secret)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	require.NoError(t, v.Verify(h, body))

	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)))
	require.Equal(t, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)), h.Get("webhook-signature"))
}

// With --ed25519: line 1 (whsk_) signs v1a, line 2 (whpk_) verifies it,
// in the webhook package and with crypto/ed25519 directly.
func TestSecretEd25519SignsAndVerifies(t *testing.T) {
	t.Parallel()
	lines := secretLines(t, true)
	require.Len(t, lines, 2)
	secretKey, publicKey := lines[0], lines[1]
	require.True(t, strings.HasPrefix(secretKey, "whsk_"), secretKey)
	require.True(t, strings.HasPrefix(publicKey, "whpk_"), publicKey)

	h, body := signed(t, secretKey)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{publicKey})
	require.NoError(t, err)
	require.NoError(t, v.Verify(h, body))
	_, err = webhook.NewVerifier(webhook.SchemeStandard, []string{secretKey})
	require.Error(t, err, "a receiver is given the public key, never the secret key")

	pub, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(publicKey, "whpk_"))
	require.NoError(t, err)
	sig, ok := strings.CutPrefix(h.Get("webhook-signature"), "v1a,")
	require.True(t, ok, h.Get("webhook-signature"))
	raw, err := base64.StdEncoding.DecodeString(sig)
	require.NoError(t, err)
	msg := h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)
	require.True(t, ed25519.Verify(ed25519.PublicKey(pub), []byte(msg), raw))
}

// The note on stderr names the subscriptions file's fields for a secret;
// a file written as it says loads, and the subscription signs with the
// printed secret (the hint once named a secrets: field that does not
// exist, which the file's parser refuses).
func TestSecretHintNamesFieldsTheFileTakes(t *testing.T) {
	for _, ed := range []bool{false, true} {
		var out, note bytes.Buffer
		require.NoError(t, (&secretCmd{Ed25519: ed}).write(&out, &note))
		secret := strings.SplitN(out.String(), "\n", 2)[0]
		fields := regexp.MustCompile(`([a-z_]+): \[([A-Z]+)\]`).FindAllStringSubmatch(note.String(), -1)
		require.Len(t, fields, 2, "the hint names two fields: %s", note.String())

		dir := t.TempDir()
		path := filepath.Join(dir, "billing.secret")
		require.NoError(t, os.WriteFile(path, []byte(secret+"\n"), 0o600))
		t.Setenv("BILLING_SECRET", secret)
		for _, f := range fields {
			value := map[string]string{"VAR": "BILLING_SECRET", "PATH": path}[f[2]]
			require.NotEmpty(t, value, "placeholder %s in the hint", f[2])
			file := "subscriptions:\n  - name: billing\n    filter_subjects: [events.>]\n    url: https://billing.example.com/hooks\n" +
				"    " + f[1] + ": [" + value + "]\n"
			subs, _, err := parseSubscriptions([]byte(file), "--config hint.yaml")
			require.NoError(t, err, "following the hint (%s): %s", f[1], file)
			require.Equal(t, []string{secret}, subs[0].Secrets, f[1])
		}
	}
}
