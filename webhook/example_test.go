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

// An order gate inside Handler (verify → order gate → deduplicate → next):
// per stream, version last+1 is processed once, a processed version is a
// duplicate, a gap and a stale sender's late POST are refused with 409 and
// retried by the sender. The second half plays two consumer replicas: the
// old owner of the stream's partition (lease epoch 7), then the new one (9).
func ExampleOrderGate() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	verifier, _ := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	gate := webhook.NewOrderGate(webhook.NewMemoryOrderStore())
	receiver := webhook.Handler(verifier, webhook.NewMemoryStore(0), 24*time.Hour,
		func(_ context.Context, r *http.Request, body []byte) error {
			ce, err := webhook.DecodeCloudEvent(r, body)
			if err != nil {
				return &webhook.StatusError{Status: http.StatusUnprocessableEntity, Err: err}
			}
			fmt.Printf("handled %s v%d\n", ce.Subject, ce.StreamVersion)
			return nil
		}, webhook.WithOrderGate(gate))
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	signer, _ := webhook.NewSigner(webhook.SchemeStandard, secret)
	// The sender signs the body, then the ordering fields: the version
	// chain (this version and the one it delivered before), the partition
	// and its lease epoch.
	send := func(version, previous int64, epoch uint64) {
		id := fmt.Sprint("e", version)
		body := fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"/shop","type":"OrderPlaced","subject":"order-42","streamversion":%d}`, id, version)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", event.ContentTypeCloudEventsJSON)
		req.Header.Set(wire.HeaderIdempotencyKey, id)
		now := time.Now()
		signer.Sign(req.Header, id, now, body)
		signer.SignOrder(req.Header, id, now, webhook.OrderFields{Stream: "order-42", Version: version, Previous: previous, Partition: 3, Epoch: epoch})
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		last := ""
		if l := resp.Header.Get(wire.HeaderOrderLast); l != "" {
			last = "(last " + l + ")"
		}
		fmt.Println(strings.TrimSpace(fmt.Sprintf("v%d after %s epoch %d: %d %s %s", version,
			wire.FormatPreviousVersion(previous), epoch, resp.StatusCode, resp.Header.Get(wire.HeaderOrder), last)))
	}
	send(0, -1, 7)
	send(3, 1, 7) // a gap: v1 is not processed yet
	send(1, 0, 7)
	send(3, 1, 7) // a filtered subscription: v2 does not match, v3 follows v1
	send(1, 0, 9) // the new owner repeats v1
	send(4, 3, 9)
	send(4, 3, 7) // the old owner's late POST
	// Output:
	// handled order-42 v0
	// v0 after none epoch 7: 204
	// v3 after 1 epoch 7: 409 gap (last 0)
	// handled order-42 v1
	// v1 after 0 epoch 7: 204
	// handled order-42 v3
	// v3 after 1 epoch 7: 204
	// v1 after 0 epoch 9: 204 duplicate
	// handled order-42 v4
	// v4 after 3 epoch 9: 204
	// v4 after 3 epoch 7: 409 stale-epoch
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
