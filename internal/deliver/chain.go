package deliver

import (
	"context"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// The version chain (docs/ordering.md, "The version chain"): every
// webhook of an ordered subscription names, in Jsbridge-Previous-Version,
// the version of its stream the subscription delivered (answered 2xx)
// before it, or none. A partition knows it for the streams it delivered
// since it was taken (chain.delivered). For a stream's first event since
// then it reads it from state that says so, never from a timeout: the
// stream's last event before it in the partitioned copy that the
// partition consumer's filters match, at or above the consumer's start
// (every such event was delivered or dead-lettered before this one: the
// stream's events are settled in order), stepped over the versions the
// park bucket records as dead-lettered and not delivered since
// (deadletter.Skipped).

// noPrevious is a predecessor's version when there is none (the header's
// "none"): deadletter.NoPrevious.
const noPrevious = deadletter.NoPrevious

// chain is one partition's version chain: the version each stream was
// last delivered at while the partition is owned, and how to look up a
// stream's predecessor of an event when it does not know. The lanes of
// the partition call it, one lane per stream at a time.
type chain struct {
	// lookup returns the version the subscription delivered before the
	// event at sequence seq of the partitioned copy, of the stream with
	// copy stream key key (noPrevious: none).
	lookup func(ctx context.Context, key string, seq uint64) (int64, error)

	mu   sync.Mutex
	last map[string]int64 // copy stream key → version delivered last (noPrevious: none)
}

// newChain returns a chain looking predecessors up with lookup; nil
// lookup: none is ever found.
func newChain(lookup func(ctx context.Context, key string, seq uint64) (int64, error)) *chain {
	if lookup == nil {
		lookup = func(context.Context, string, uint64) (int64, error) { return noPrevious, nil }
	}
	return &chain{lookup: lookup, last: map[string]int64{}}
}

// previous returns the predecessor to send with m, of copy stream key
// key: known when the partition delivered the stream since it was taken
// and m comes after what it delivered, none for a stream's version 0,
// else looked up. A redelivery of a version already delivered (JetStream
// sends it again when its ack was lost in a failover) is looked up too:
// the last version delivered is that very version or a later one, never
// its predecessor, and a gate refuses a chain whose previous version is
// not below its version (it answers duplicate for a version it
// processed, which the sender acks).
func (c *chain) previous(ctx context.Context, key string, m jetstream.Msg) (int64, error) {
	v, versioned := streamVersion(m)
	if !versioned {
		// No ce-streamversion (a message another program published to
		// the events stream): it goes without the chain (orderFieldsOf),
		// so nothing is looked up, and nothing holds its stream.
		return noPrevious, nil
	}
	c.mu.Lock()
	prev, ok := c.last[key]
	c.mu.Unlock()
	if ok && v > prev {
		return prev, nil
	}
	if v == 0 {
		return noPrevious, nil // nothing of the stream comes before its version 0
	}
	return c.lookup(ctx, key, streamSeq(m))
}

// delivered records that version v of stream key was answered 2xx; a
// redelivered earlier version leaves the later one recorded.
func (c *chain) delivered(key string, v int64) {
	c.mu.Lock()
	if last, ok := c.last[key]; !ok || v > last {
		c.last[key] = v
	}
	c.mu.Unlock()
}

// forget drops what the chain knows of stream key: its next event looks
// its predecessor up (after a dead letter that parked it, whose replay
// or skip another process decides; after an order gate's gap answer).
func (c *chain) forget(key string) {
	c.mu.Lock()
	delete(c.last, key)
	c.mu.Unlock()
}

// chainSource is where a subscription's predecessors are looked up
// (deadletter.Predecessor): the partitioned copy (as its stream leader
// has it), the subscription's filters on it and its start there, and
// the park bucket's skipped versions.
type chainSource struct {
	js           jetstream.JetStream
	copyName     string
	eventsPrefix string
	sub          string
	// filters are the subscription's filters on the copy, one partition's
	// or every partition's ("*" in the partition token).
	filters []string
	// from is the copy sequence the partition consumers start at (0: the
	// copy's first).
	from  uint64
	parks jetstream.KeyValue // nil: no skipped versions are read
}

// previous returns the version the subscription delivered before the
// event at copy sequence seq of the stream with copy stream key key
// (noPrevious: none).
func (cs chainSource) previous(ctx context.Context, key string, seq uint64) (int64, error) {
	return deadletter.Predecessor(ctx, cs.js, cs.parks, deadletter.Lookup{Stream: cs.copyName, Subscription: cs.sub,
		Filters: cs.filters, Key: key, EventsKey: wire.EventsSubject(cs.eventsPrefix, key), From: cs.from, Before: seq})
}

// ChainFromMetadataKey is the partition consumer metadata key holding the
// copy sequence (base 10) the subscription first started at, when the
// consumer was made again later from another one (a consumer deleted at
// run time is made again from its ack floor): the version chain looks a
// stream's predecessors up from there, since what the subscription
// delivered before the new start is still its own.
const ChainFromMetadataKey = "jsbridge_chain_from"

// chainStart is the copy sequence the subscription's partition consumer
// with config cfg first started at, what the subscription delivered
// begins there (0: the copy's first): ChainFromMetadataKey, else its
// start sequence.
func chainStart(cfg jetstream.ConsumerConfig) uint64 {
	if v, ok := cfg.Metadata[ChainFromMetadataKey]; ok {
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			return n
		}
	}
	if cfg.DeliverPolicy == jetstream.DeliverByStartSequencePolicy {
		return cfg.OptStartSeq
	}
	return 0
}

// recordChainFrom records from as cfg's ChainFromMetadataKey.
func recordChainFrom(cfg *jetstream.ConsumerConfig, from uint64) {
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	cfg.Metadata[ChainFromMetadataKey] = strconv.FormatUint(from, 10)
}

// keepStart makes cfg keep the start of the existing durable consumer's
// config have (subscription.KeepStart) and the version chain's start
// (ChainFromMetadataKey), so that an update never moves them.
func keepStart(cfg *jetstream.ConsumerConfig, have jetstream.ConsumerConfig) {
	subscription.KeepStart(cfg, have, ChainFromMetadataKey)
}
