package shared

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/jsapi"
)

// The operator's requests on parked streams (`consumer dlq replay` and
// `skip`, docs/design/next-engine.md section 3): the command writes a
// unpark.Request under unpark.Key in the positions bucket, every
// replica watches them (one watch, unpark.Requests), and the owner of
// the stream's partition applies it in its cursors' round (CatchUp),
// which a new request starts at once (the loop's poke). The watch is
// one of the replica's parts (Start).

// Sender returns the attempt.Sender of the replica's subscription name
// (its endpoint, signer and client), nil when the replica has none: a
// replay's POST (attempt.Sender.Direct) goes through it. It needs no
// Start.
func (r *Replica) Sender(name string) *attempt.Sender { return r.senders.Get(name) }

// ParkedHead reports whether subscription sub's stream (a
// wire.StreamKey) is parked with its head at events stream sequence
// head, as the partition records of the positions bucket kv hold it (an
// aside in state fanout.AsideParked with From head; position.ReadAll,
// what `consumer status` reads). A nil kv (no positions bucket) holds
// none. Errors are the bucket's.
func ParkedHead(ctx context.Context, kv jetstream.KeyValue, sub, stream string, head uint64) (bool, error) {
	if kv == nil || head == 0 {
		return false, nil
	}
	parts, err := position.ReadAll(ctx, kv)
	if err != nil {
		return false, fmt.Errorf("shared: read the parked streams: %w", err)
	}
	for _, p := range parts {
		for _, a := range p.Record.Asides {
			if a.Sub == sub && a.Stream == stream && a.State == fanout.AsideParked && a.From == head {
				return true, nil
			}
		}
	}
	return false, nil
}

// PositionsBucket returns the positions bucket named name
// (position.DefaultBucket when "") without creating it: nil and no
// error when it does not exist (no shared engine ran there).
func PositionsBucket(ctx context.Context, js jetstream.JetStream, name string) (jetstream.KeyValue, error) {
	if name == "" {
		name = position.DefaultBucket
	}
	kv, err := jsapi.ExistingKeyValue(ctx, js, name)
	if err != nil {
		return nil, fmt.Errorf("shared: positions bucket %s: %w", name, err)
	}
	return kv, nil
}
