package deliver

import (
	"errors"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrUnknownSubscription is wrapped by a dead-letter replay or a replay
// by time naming a subscription the consumer was not given.
var ErrUnknownSubscription = errors.New("subscription not configured")

// ReplayResult is the outcome of replaying one dead letter.
type ReplayResult struct {
	// Letter is the dead letter replayed.
	Letter deadletter.Stored
	// Delivered is true when the endpoint answered 2xx and the dead letter
	// was removed from the dead-letter stream.
	Delivered bool
	// Status is the HTTP status (0 without a response).
	Status int
	// Err says why it was not delivered or not removed; nil when Delivered.
	Err error
}

// ReplayOrder returns the ordering fields a replay of dl sends: the
// stream, version and predecessor of its failed attempt, no partition
// (a replay is no partition's owner); nil when dl carries no version
// chain (an unordered subscription's, or stored before the chain).
func ReplayOrder(dl deadletter.Stored) *webhook.OrderFields {
	if dl.PreviousVersion == "" {
		return nil
	}
	prev, err := wire.ParsePreviousVersion(dl.PreviousVersion)
	if err != nil {
		return nil
	}
	return attempt.OrderFieldsOf(dl.Header, prev, -1, 0)
}
