// Package pull is what the engine's two pulls share: an unordered
// subscription's (package unordered) and an ordered partition's (the
// engine's root): the idle heartbeat asked for on pull requests, whether an
// error says a durable consumer is gone, and the workers that run the
// pulled messages' deliveries on reused goroutines.
package pull

import (
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Heartbeat is the idle heartbeat asked for on pull requests. When two
// are missed, nats.go drops the pull requests it thinks are pending and
// issues new ones: a pull request lost on the server's side (seen under CPU
// starvation: nothing delivered although messages wait, "no heartbeat
// received"; nats.go issue 1622) then stalls the subscription for about 4 s
// instead of the 30 s of the default (half the 30 s pull expiry). An idle
// subscription gets one heartbeat message every 2 s.
const Heartbeat = 2 * time.Second

// ErrConsumerGone says a durable consumer no longer exists (its pull
// found it missing): the caller creates it again.
var ErrConsumerGone = errors.New("durable consumer no longer exists")

// ConsumerGone reports whether err says the durable consumer (or its
// stream) is gone, or no longer answers, so it must be created again
// (CreateOrUpdateConsumer is idempotent: doing so when it exists is
// harmless).
func ConsumerGone(err error) bool {
	return errors.Is(err, ErrConsumerGone) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrConsumerDoesNotExist) || errors.Is(err, nats.ErrNoResponders)
}
