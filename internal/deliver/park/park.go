// Package park is the consumer engine's room for parked streams
// (DeadLetterPark): an ordered subscription's park entries in the park
// bucket (wire.DefaultParkBucket), the events a replica holds behind
// them for the partitions that pulled them, unparking and the re-read of
// a new owner, the keep-alive of held events, and the sweep of the
// bucket's delete markers. It imports nothing of the engine above it: a
// partition is a Holder (its number and how it acks, InProgresses and
// Naks through its lease fence), and the rest comes in Config and Deps.
package park

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/wire"
)

// A parked stream (DeadLetterPark): its dead-lettered head is in the DLQ,
// an entry in the park bucket names it, and its later events stay pending
// on the partition consumer, held in memory by the partition's owner
// (InProgress every AckWait/2) and never delivered, until the entry is
// deleted by Replay (after the head was delivered) or SkipParked. They are
// never acked while parked, so nothing is lost across restarts and
// hand-overs: a new owner gets them again and holds them again. The price:
// each held event occupies one of the partition consumer's MaxAckPending
// slots, so once they press on it the partition sets the stream aside
// (it takes them with TakeHeld): its held events are acked out behind an
// aside record and read again from the copy once it is unparked
// (docs/ordering.md, "Dead letters").

// Config is one ordered subscription's parking.
type Config struct {
	// Subscription is the subscription's name: its park entries' keys
	// (wire.ParkedKey) and the metrics' label.
	Subscription string
	// AckWait is the subscription's AckWait: held events get InProgress
	// every min(AckWait/2, 5 s).
	AckWait time.Duration
	// ReplicaID is this replica's id, recorded in the entries it writes.
	ReplicaID string
	// CopyStream is the partitioned copy's name (wire.OrderedStream), named
	// in the cause of a held event at risk of leaving it.
	CopyStream string
}

// Metrics are the engine's gauges parking sets, each by subscription;
// a nil one is not set.
type Metrics struct {
	// Parked is jsbridge_consumer_streams_parked.
	Parked *prometheus.GaugeVec
	// OrderStuck is jsbridge_consumer_streams_order_stuck.
	OrderStuck *prometheus.GaugeVec
	// OldestHeld is jsbridge_consumer_oldest_held_seconds.
	OldestHeld *prometheus.GaugeVec
}

// Deps are what parking takes from the engine.
type Deps struct {
	// Clock is the engine's clock: entries' times, held events' ages,
	// the keep-alive's ticks, the watch's pause (nil: the wall clock).
	Clock clockwork.Clock
	// Logger logs parks, unparks and failures (nil: discarded).
	Logger *slog.Logger
	// Metrics are the gauges Run sets.
	Metrics Metrics
	// CopyMaxAge is the partitioned copy's MaxAge as last read (0: none;
	// nil: never at risk).
	CopyMaxAge func() time.Duration
	// WatchFailed is called when watching the park bucket failed with
	// err, before the watch is tried again: the engine creates its
	// buckets again when err says they are gone (nil: nothing).
	WatchFailed func(ctx context.Context, err error)
}

// Parking is an ordered subscription's parked streams on this replica:
// the park entries it wrote or watched, the events it holds behind them,
// and the park bucket's side of both. Its methods are safe for
// concurrent use.
type Parking struct {
	sub        string
	ackWait    time.Duration
	replicaID  string
	copyStream string
	log        *slog.Logger
	metrics    Metrics
	clock      clockwork.Clock
	copyMaxAge func() time.Duration
	failed     func(context.Context, error)

	// bucket is the park bucket and the events prefix, once provisioned.
	bucket atomic.Pointer[bucket]

	mu     sync.Mutex
	parked map[string]*parkedStream // by park bucket key
}

// bucket is where the park entries live: the park bucket, and the
// events stream's subject prefix their keys are made from.
type bucket struct {
	kv           jetstream.KeyValue
	eventsPrefix string
}

// New returns the parking of cfg.Subscription. It needs the park bucket
// (Provisioned) before it parks, re-reads or keeps events alive.
func New(cfg Config, deps Deps) *Parking {
	pk := &Parking{sub: cfg.Subscription, ackWait: cfg.AckWait, replicaID: cfg.ReplicaID, copyStream: cfg.CopyStream,
		log: deps.Logger, metrics: deps.Metrics, clock: deps.Clock, copyMaxAge: deps.CopyMaxAge, failed: deps.WatchFailed,
		parked: map[string]*parkedStream{}}
	if pk.log == nil {
		pk.log = slog.New(slog.DiscardHandler)
	}
	if pk.clock == nil {
		pk.clock = clockwork.NewRealClock()
	}
	if pk.copyMaxAge == nil {
		pk.copyMaxAge = func() time.Duration { return 0 }
	}
	if pk.failed == nil {
		pk.failed = func(context.Context, error) {}
	}
	return pk
}

// Provisioned hands parking the park bucket kv and the events stream's
// subject prefix (ordercopy.EventsPrefix), once the engine provisioned
// them.
func (pk *Parking) Provisioned(kv jetstream.KeyValue, eventsPrefix string) {
	pk.bucket.Store(&bucket{kv: kv, eventsPrefix: eventsPrefix})
}

// kv is the park bucket (nil before Provisioned).
func (pk *Parking) kv() jetstream.KeyValue {
	if b := pk.bucket.Load(); b != nil {
		return b.kv
	}
	return nil
}

// eventsPrefix is the events stream's subject prefix (before
// Provisioned: wire.DefaultEventsPrefix).
func (pk *Parking) eventsPrefix() string {
	if b := pk.bucket.Load(); b != nil {
		return b.eventsPrefix
	}
	return wire.DefaultEventsPrefix
}

// parkedStream is a parked stream on this replica: its entry and the
// events this replica holds behind it.
type parkedStream struct {
	entry     deadletter.ParkedStream
	held      []heldMsg // in stream order
	releasing bool      // its entry was deleted: see unpark
}

// heldMsg is an event held behind a parked head.
type heldMsg struct {
	h   *Holder // the partition holding it
	msg jetstream.Msg
	at  time.Time // when it was held, on the engine's clock
}

// Holder is a partition as its parked streams' events see it: its number,
// and how it acks, InProgresses and Naks them (through its lease fence).
// Held events are told apart by their Holder's pointer, so a partition
// makes one and passes the same pointer to every call.
type Holder struct {
	// P is the partition's number, recorded in the park entries it writes.
	P int
	// Ack acks a redelivered head (dead-lettered already, its ack lost).
	Ack func(jetstream.Msg)
	// InProgress keeps a held event pending (not past the partition's
	// lease, nor while disconnected).
	InProgress func(jetstream.Msg) error
	// Nak gives a held event back to JetStream (ReturnHeld).
	Nak func(jetstream.Msg)
}

// errNotProvisioned is returned by what needs the park bucket before
// Provisioned handed it.
var errNotProvisioned = errors.New("park: the park bucket is not provisioned yet")

// streamSeq is a message's sequence in the partitioned copy (0 when it
// has no metadata).
func streamSeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}
