package webhook_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// A receiver: verify, deduplicate by Idempotency-Key, decode the CloudEvent.
// The second half plays the sender (package deliver) posting one event twice.
func Example() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	verifier, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	if err != nil {
		panic(err)
	}
	receiver := webhook.Handler(verifier, webhook.NewMemoryStore(0), 24*time.Hour,
		func(_ context.Context, r *http.Request, body []byte) error {
			ce, err := webhook.DecodeCloudEvent(r, body)
			if err != nil {
				return &webhook.StatusError{Status: http.StatusUnprocessableEntity, Err: err}
			}
			fmt.Println("handled", ce.Type, ce.ID, string(ce.Data))
			return nil
		})
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	signer, _ := webhook.NewSigner(webhook.SchemeStandard, secret)
	body := []byte(`{"specversion":"1.0","id":"42","source":"/shop","type":"OrderPlaced","streamversion":0,"data":{"total":12.5}}`)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", event.ContentTypeCloudEventsJSON)
		req.Header.Set(wire.HeaderIdempotencyKey, "42")
		signer.Sign(req.Header, "42", time.Now(), body)
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	// Output:
	// handled OrderPlaced 42 {"total":12.5}
	// 204
	// 204
}

// Verifying by hand, without the middleware, e.g. inside another framework.
func ExampleVerifier_Verify() {
	verifier, _ := webhook.NewVerifier(webhook.SchemeHMACSHA256, []string{"old-secret", "new-secret"})
	signer, _ := webhook.NewSigner(webhook.SchemeHMACSHA256, "new-secret")

	h := http.Header{}
	signer.Sign(h, "42", time.Now(), []byte(`{"n":1}`))
	fmt.Println(webhook.Reason(verifier.Verify(h, []byte(`{"n":1}`))) == "")
	fmt.Println(webhook.Reason(verifier.Verify(h, []byte(`{"n":2}`))))
	// Output:
	// true
	// bad-signature
}

// Asymmetric signatures (Standard Webhooks v1a): the sender signs with the
// whsk_ secret key, the receiver verifies with the whpk_ public key alone.
// A sender moving from a whsec_ secret lists both while receivers move.
func ExampleGenerateKeyPair() {
	secretKey, publicKey, _ := webhook.GenerateKeyPair()
	signer, _ := webhook.NewSigner(webhook.SchemeStandard, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", secretKey)
	verifier, _ := webhook.NewVerifier(webhook.SchemeStandard, []string{publicKey})

	h := http.Header{}
	signer.Sign(h, "42", time.Now(), []byte(`{"n":1}`))
	for _, sig := range strings.Fields(h.Get(webhook.HeaderWebhookSignature)) {
		fmt.Println(sig[:strings.IndexByte(sig, ',')])
	}
	fmt.Println(verifier.Verify(h, []byte(`{"n":1}`)) == nil)
	// Output:
	// v1
	// v1a
	// true
}
