package deadletter

import (
	"context"
	"strconv"
	"time"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
	"github.com/nats-io/nats.go"
)

// Letter is a delivery the engine gave up on: a permanent failure, the
// last attempt failing, or a message it cannot turn into a webhook.
type Letter struct {
	// Subscription is the subscription's name.
	Subscription string
	// Endpoint is the endpoint as breaker.Endpoint renders it.
	Endpoint string
	// EventID is the event id (Nats-Msg-Id); empty when the message has none.
	EventID string
	// Attempt is the attempt that failed, 1-based.
	Attempt int
	// Status is the last HTTP status, 0 when there was no response.
	Status int
	// Reason says why, e.g. "HTTP 410 Gone".
	Reason string
	// At is when the last attempt was made (zero: now).
	At time.Time
	// Event is the event given up on, as the events stream holds it
	// (the zero Event: none).
	Event Event
	// OrderStuck says that the receiver's order gate refused the event
	// (gap, in-progress) for longer than the consumer's OrderStuckAfter:
	// it is dead-lettered and its stream parked whatever the
	// subscription's OnDeadLetter, so the operator decides (replay or
	// skip) instead of the stream waiting for ever.
	OrderStuck bool
	// Previous, Partition and Epoch are the ordering headers the failed
	// attempt of an ordered subscription sent (Jsbridge-Previous-Version:
	// "none" or a version in base 10; Jsbridge-Partition and
	// Jsbridge-Lease-Epoch, base 10), kept on the dead letter; "" when
	// it sent none.
	Previous, Partition, Epoch string
}

// Event is the event a dead letter gives up on, as the events stream
// holds it: the letter keeps its subject, data and reader headers, and
// names its sequence and the time the stream stored it (Seq 0: unknown,
// neither named).
type Event struct {
	Seq     uint64
	Subject string
	Header  nats.Header
	Data    []byte
	Time    time.Time
}

// WithOrder returns dl with the ordering headers of order, the failed
// attempt's place in its stream's version chain (nil: none, dl as it
// is): the dead-letter stream keeps them, so that a replay sends the
// predecessor the event had. A negative order.Partition (a webhook sent
// by no partition's owner) leaves Partition and Epoch empty.
func (dl Letter) WithOrder(order *webhook.OrderFields) Letter {
	if order == nil {
		return dl
	}
	dl.Previous = wire.FormatPreviousVersion(order.Previous)
	if order.Partition >= 0 {
		dl.Partition = strconv.Itoa(order.Partition)
		dl.Epoch = strconv.FormatUint(order.Epoch, 10)
	}
	return dl
}

// Writer takes deliveries the engine gave up on, before the event is
// settled. When it returns an error the write is retried in place and the
// event stays unsettled, so nothing is lost while the dead-letter store
// is down. DLQ is the JetStream implementation.
type Writer interface {
	DeadLetter(ctx context.Context, dl Letter) error
}
