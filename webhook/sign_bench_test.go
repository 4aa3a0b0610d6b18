package webhook_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/webhook"
)

// BenchmarkSignWebhook measures one webhook's signing as the consumer does it:
// Sign alone (an unordered webhook) and Sign then SignOrder (an ordered
// one), with a Signer from NewSigner (keyed HMACs pooled) and with a
// struct literal of the same secrets (a new HMAC a signature), for one
// secret and for two (a rotation). Allocations are the figure to watch.
func BenchmarkSignWebhook(b *testing.B) {
	first, err := webhook.GenerateSecret()
	if err != nil {
		b.Fatal(err)
	}
	second, err := webhook.GenerateSecret()
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 700)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	ts := time.Unix(1_700_000_000, 0)
	order := webhook.OrderFields{Stream: "order-4711", Version: 12, Previous: 11, Partition: 7, Epoch: 3}
	for _, secrets := range []struct {
		name string
		list []string
	}{{"one secret", []string{first}}, {"rotation", []string{first, second}}} {
		pooled, err := webhook.NewSigner(webhook.SchemeStandard, secrets.list...)
		if err != nil {
			b.Fatal(err)
		}
		literal := &webhook.Signer{Scheme: pooled.Scheme, Secrets: pooled.Secrets}
		for _, signer := range []struct {
			name string
			s    *webhook.Signer
		}{{"NewSigner", pooled}, {"literal", literal}} {
			b.Run(secrets.name+"/"+signer.name+"/unordered", func(b *testing.B) {
				h := make(http.Header, 8)
				b.ReportAllocs()
				for b.Loop() {
					signer.s.Sign(h, "01J9Z8Q4C1V7W3X5Y6Z7A8B9C0", ts, body)
				}
			})
			b.Run(secrets.name+"/"+signer.name+"/ordered", func(b *testing.B) {
				h := make(http.Header, 8)
				b.ReportAllocs()
				for b.Loop() {
					signer.s.Sign(h, "01J9Z8Q4C1V7W3X5Y6Z7A8B9C0", ts, body)
					signer.s.SignOrder(h, "01J9Z8Q4C1V7W3X5Y6Z7A8B9C0", ts, order)
				}
			})
		}
	}
}
