package deliver_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
)

// A consumer delivering every order event to one endpoint, signed with
// Standard Webhooks, with breakers and metrics on the default registry and
// dead letters in the DLQ stream.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	breakers, err := breaker.NewSet(breaker.Settings{OpenTimeout: time.Minute}, logger, prometheus.DefaultRegisterer)
	if err != nil {
		panic(err)
	}
	// Deliveries given up on go to the DLQ stream, created when missing.
	dlq := deadletter.New(js, deadletter.Config{})
	if err := dlq.Provision(ctx); err != nil {
		panic(err)
	}
	c, err := deliver.New(js, deliver.Config{Breakers: breakers, Logger: logger, Registerer: prometheus.DefaultRegisterer, DeadLetters: dlq},
		subscription.Subscription{
			Name:           "billing-orders",
			FilterSubjects: []string{"events.order.>"},
			URL:            "https://billing.example/webhooks/orders",
			Scheme:         webhook.SchemeStandard,
			Secrets:        []string{os.Getenv("BILLING_WEBHOOK_SECRET")},
		})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
}
