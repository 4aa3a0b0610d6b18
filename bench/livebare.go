package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
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
	cons, err := js.CreateOrUpdateConsumer(ctx, wire.DefaultEventsStream, jetstream.ConsumerConfig{
		Durable: bareLiveDurable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxAckPending: 1000, FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)},
	})
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: bareLiveInFlight, MaxConnsPerHost: bareLiveInFlight}, Timeout: 10 * time.Second}
	// The heartbeat as bareDeliver's, for the same reason (nats.go issue
	// 1622: a pull the server no longer holds).
	iter, err := cons.Messages(jetstream.PullMaxMessages(bareLiveInFlight), jetstream.PullHeartbeat(2*time.Second),
		jetstream.WithMessagesErrOnMissingHeartbeat(false))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range bareLiveInFlight {
		wg.Go(func() {
			for {
				msg, err := iter.Next()
				if err != nil {
					if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						fmt.Fprintf(os.Stderr, "bench: bare delivery: worker stops: %v\n", err)
					}
					return
				}
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
				resp, err := client.Do(req)
				if err != nil {
					_ = msg.Nak()
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					_ = msg.Ack()
				} else {
					_ = msg.Nak()
				}
			}
		})
	}
	<-ctx.Done()
	iter.Stop()
	wg.Wait()
	return nil
}
