package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// The bare reference pipeline's delivery half: with the bare bridge
// (bareBridge) in one process (bench -live-bare-child), the smallest
// pipeline that gets each event to the endpoint: one durable pull
// consumer on EVENTS, bareLiveInFlight workers, each POSTing a message
// signed as the consumer signs (Standard Webhooks, the same secret and
// receiver) and acking it on a 2xx, Nak otherwise. No order, no retry
// policy, no dead letters, no attempt records, no breaker.

// bareLiveInFlight is the bare delivery's workers: the consumer's default
// max_in_flight.
const bareLiveInFlight = 64

// bareLiveDurable is the bare delivery's durable consumer on EVENTS.
const bareLiveDurable = "bench-live-bare"

// bareLiveDeliver delivers EVENTS to hook (POST, binary content mode: the
// data as the body, the message's ce-* headers as the request's, signed
// with the secret in liveSecretEnv) until ctx ends.
func bareLiveDeliver(ctx context.Context, js jetstream.JetStream, hook string) error {
	signer, err := webhook.NewSigner(webhook.SchemeStandard, os.Getenv(liveSecretEnv))
	if err != nil {
		return fmt.Errorf("bare delivery: %s: %w", liveSecretEnv, err)
	}
	request := func(msg jetstream.Msg) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, hook, bytes.NewReader(msg.Data()))
		for k, vs := range msg.Headers() {
			if strings.HasPrefix(strings.ToLower(k), "ce-") && len(vs) > 0 {
				req.Header.Set(k, vs[0])
			}
		}
		req.Header.Set(wire.HeaderContentType, "application/json")
		id := msg.Headers().Get(wire.HeaderID)
		req.Header.Set(wire.HeaderIdempotencyKey, wire.IdempotencyKey(id))
		signer.Sign(req.Header, id, time.Now(), msg.Data())
		return req
	}
	return barePull(ctx, js, bareLiveDurable, bareLiveInFlight, request, func(status int) bool { return status/100 == 2 })
}
