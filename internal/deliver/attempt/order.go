package attempt

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/internal/deliver/payload"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// OrderFieldsOf returns the ordering fields of the webhook of a message
// with headers mh sent with predecessor previous by the owner of
// partition (-1: not a partition's owner) under lease epoch: nil when mh
// has no stream version (ce-streamversion) or stream (ce-subject), as for
// a message not from an events table, which goes without the chain.
func OrderFieldsOf(mh nats.Header, previous int64, partition int, epoch uint64) *webhook.OrderFields {
	v, err := strconv.ParseInt(payload.HeaderValue(mh, wire.HeaderStreamVersion), 10, 64)
	if err != nil {
		return nil
	}
	stream, err := wire.DecodeHeaderValue(payload.HeaderValue(mh, wire.HeaderSubject))
	if err != nil || stream == "" {
		return nil
	}
	return &webhook.OrderFields{Stream: stream, Version: v, Previous: previous, Partition: partition, Epoch: epoch}
}
