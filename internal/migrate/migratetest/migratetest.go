// Package migratetest builds, through the JetStream API alone, the layout
// the durables engine left on a server (the engine itself is gone), for
// the tests of `consumer migrate`: the events stream without AllowDirect,
// its partitioned copy sourcing it (the server writes the copy's
// Nats-Stream-Source headers), the unordered subscriptions' durables and
// the ordered ones' partition consumers with their ack floors and pending
// sets, and the park bucket's records (delivered records, aside records,
// park entries with their dead letters, skipped versions, failed-attempt
// counts, the lease epoch counter), plus the old keys of the lease
// bucket. The names and records are package legacy's: the old
// layout's contract, spelled once.
//
// Layout's methods build pieces as a test states them; Deliver and
// DeliverOrdered play what the old engine did with each event (accepted,
// in flight, failing, refused, set aside) and leave the server as it
// left it, returning the events the endpoint accepted.
package migratetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// Config says where to build the old layout.
type Config struct {
	// Events is the events stream, which must exist (the bridge made
	// it). Default wire.DefaultEventsStream. Its subject prefix is read
	// from its one "<prefix>.>" subject.
	Events string
	// Partitions is the copy's partition count. Required (1 or more).
	Partitions int
	// Epoch is the lease epoch counter the park bucket holds (the last
	// epoch a partition claim got); 0: none.
	Epoch uint64
	// DLQ is the dead-letter stream Refused events go to. Default
	// wire.DefaultDLQStream, made when missing.
	DLQ string
}

// Layout is the old layout on one server.
type Layout struct {
	// JS is the server's JetStream.
	JS jetstream.JetStream
	// Events is the events stream, Prefix its subject prefix.
	Events jetstream.Stream
	Prefix string
	// Partitions is the copy's partition count, Copy the copy, CopyAt
	// its creation time (the delivered records name it).
	Partitions int
	Copy       jetstream.Stream
	CopyAt     time.Time
	// Park is the park bucket (legacy.ParkBucket), Epoch the lease
	// epoch counter written in it.
	Park  jetstream.KeyValue
	Epoch uint64
	// DLQ is the dead-letter stream.
	DLQ *deadletter.DLQ
}

// New builds the old layout's frame on js: AllowDirect turned off on the
// events stream (no deployment of the old engine had it on), the copy
// sourcing it (legacy.CopySource, file storage), the park bucket with
// the lease epoch counter, and the dead-letter stream. Errors: a
// Partitions below 1, the events stream missing, and the server's.
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*Layout, error) {
	if cfg.Partitions < 1 {
		return nil, fmt.Errorf("migratetest: Partitions %d: want 1 or more", cfg.Partitions)
	}
	if cfg.Events == "" {
		cfg.Events = wire.DefaultEventsStream
	}
	ev, err := js.Stream(ctx, cfg.Events)
	if err != nil {
		return nil, fmt.Errorf("migratetest: events stream %q: %w", cfg.Events, err)
	}
	ecfg := ev.CachedInfo().Config
	if ecfg.AllowDirect {
		ecfg.AllowDirect = false
		if ev, err = js.UpdateStream(ctx, ecfg); err != nil {
			return nil, fmt.Errorf("migratetest: turn AllowDirect off for %q: %w", cfg.Events, err)
		}
	}
	l := &Layout{JS: js, Events: ev, Prefix: legacy.EventsPrefix(ecfg), Partitions: cfg.Partitions, Epoch: cfg.Epoch}
	if l.Copy, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        legacy.CopyStream(cfg.Events),
		Description: "jsbridge: the events of " + cfg.Events + " with a partition token, for ordered webhook delivery",
		Storage:     jetstream.FileStorage, Replicas: ecfg.Replicas, AllowDirect: true,
		Sources: []*jetstream.StreamSource{legacy.CopySource(cfg.Events, l.Prefix, cfg.Partitions)},
	}); err != nil {
		return nil, fmt.Errorf("migratetest: create the copy: %w", err)
	}
	l.CopyAt = l.Copy.CachedInfo().Created
	if l.Park, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: legacy.ParkBucket, Storage: jetstream.FileStorage, Replicas: ecfg.Replicas}); err != nil {
		return nil, fmt.Errorf("migratetest: create the park bucket: %w", err)
	}
	if cfg.Epoch > 0 {
		if _, err := l.Park.PutString(ctx, wire.EpochKey, strconv.FormatUint(cfg.Epoch, 10)); err != nil {
			return nil, fmt.Errorf("migratetest: write the lease epoch counter: %w", err)
		}
	}
	l.DLQ = deadletter.New(js, deadletter.Config{Stream: cfg.DLQ})
	if err := l.DLQ.Provision(ctx); err != nil {
		return nil, fmt.Errorf("migratetest: %w", err)
	}
	return l, nil
}

// WaitCopied waits until the copy sourced the events stream up to its
// last sequence, polling every 10 ms, or ctx ends.
func (l *Layout) WaitCopied(ctx context.Context) error {
	for {
		ev, err := l.Events.Info(ctx)
		if err != nil {
			return fmt.Errorf("migratetest: %w", err)
		}
		cp, err := l.Copy.Info(ctx)
		if err != nil {
			return fmt.Errorf("migratetest: %w", err)
		}
		if cp.State.LastSeq > 0 {
			m, err := l.Copy.GetMsg(ctx, cp.State.LastSeq)
			if err == nil && wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo)) >= ev.State.LastSeq {
				return nil
			}
		} else if ev.State.Msgs == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migratetest: the copy sources the events stream up to %d: %w", ev.State.LastSeq, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Durable is a consumer's settings as the old engine made it.
type Durable struct {
	// Endpoint is the subscription's URL (in the unordered durable's
	// description).
	Endpoint string
	// AckWait is the consumer's AckWait. Default 30 s.
	AckWait time.Duration
	// NakDelay, when set, is the delay Failing events are Nak'd with
	// (the subscription's backoff step); else they wait for AckWait.
	NakDelay time.Duration
}

func (d Durable) ackWait() time.Duration {
	if d.AckWait <= 0 {
		return 30 * time.Second
	}
	return d.AckWait
}

// unorderedDurable makes unordered subscription name's durable on the
// events stream, as the old engine did: its description
// legacy.DurableDescription + the endpoint, explicit acks, every event.
func (l *Layout) unorderedDurable(ctx context.Context, name string, d Durable) (jetstream.Consumer, error) {
	c, err := l.JS.CreateConsumer(ctx, l.Events.CachedInfo().Config.Name, jetstream.ConsumerConfig{
		Durable: name, Description: legacy.DurableDescription + d.Endpoint,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: d.ackWait(), MaxDeliver: -1, MaxAckPending: -1,
	})
	if err != nil {
		return nil, fmt.Errorf("migratetest: the durable of %q: %w", name, err)
	}
	return c, nil
}

// PartitionConsumers makes ordered subscription name's partition
// consumers on the copy, as the old engine did (every event of the
// partition, explicit acks), by partition. The old engine's pinned
// priority group is left out: its pin lasted only while a replica ran.
func (l *Layout) PartitionConsumers(ctx context.Context, name string, d Durable) ([]jetstream.Consumer, error) {
	out := make([]jetstream.Consumer, l.Partitions)
	for p := range l.Partitions {
		var err error
		out[p], err = l.JS.CreateConsumer(ctx, l.Copy.CachedInfo().Config.Name, jetstream.ConsumerConfig{
			Durable:       legacy.PartitionDurable(name, p),
			Description:   fmt.Sprintf("jsbridge ordered webhook subscription %s, partition %d, to %s", name, p, d.Endpoint),
			FilterSubject: legacy.PartitionFilter(l.Prefix, p), DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: d.ackWait(), MaxDeliver: -1, MaxAckPending: -1,
		})
		if err != nil {
			return nil, fmt.Errorf("migratetest: partition consumer %d of %q: %w", p, name, err)
		}
	}
	return out, nil
}

// PutAttempts writes the failed-attempt count of event id of ordered
// subscription sub.
func (l *Layout) PutAttempts(ctx context.Context, sub, id string, n int) error {
	if _, err := l.Park.PutString(ctx, legacy.AttemptsKey(sub, id), strconv.Itoa(n)); err != nil {
		return fmt.Errorf("migratetest: %w", err)
	}
	return nil
}

// Leases writes the old engine's keys in the lease bucket (made with ttl
// when missing, as the old engine made it): a lease of each partition of
// ordered subscription sub, and replica's heartbeat, written now (so a
// cleanup finds an old replica running until ttl passed).
func (l *Layout) Leases(ctx context.Context, ttl time.Duration, sub, replica string) error {
	kv, err := l.JS.CreateOrUpdateKeyValue(ctx, owner.LeaseBucketConfig(wire.DefaultLeaseBucket, ttl, l.Events.CachedInfo().Config.Replicas))
	if err != nil {
		return fmt.Errorf("migratetest: the lease bucket: %w", err)
	}
	keys := []string{legacy.MemberKey(sub, replica)}
	for p := range l.Partitions {
		keys = append(keys, legacy.LeaseKey(sub, p))
	}
	for _, k := range keys {
		if _, err := kv.PutString(ctx, k, replica); err != nil {
			return fmt.Errorf("migratetest: %w", err)
		}
	}
	return nil
}

func (l *Layout) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := l.Park.Put(ctx, key, b); err != nil {
		return fmt.Errorf("migratetest: write %q of the park bucket: %w", key, err)
	}
	return nil
}

// eventMsg reads the events stream's message at seq as a consumer gets
// it (a dead letter is written from one), through an ordered consumer.
func (l *Layout) eventMsg(ctx context.Context, seq uint64) (jetstream.Msg, error) {
	oc, err := l.JS.OrderedConsumer(ctx, l.Events.CachedInfo().Config.Name, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq,
	})
	if err != nil {
		return nil, fmt.Errorf("migratetest: read the events stream at %d: %w", seq, err)
	}
	m, err := oc.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		return nil, fmt.Errorf("migratetest: read the events stream at %d: %w", seq, err)
	}
	if md, err := m.Metadata(); err != nil || md.Sequence.Stream != seq {
		return nil, errors.New("migratetest: the events stream's message at " + strconv.FormatUint(seq, 10) + " is gone")
	}
	return m, nil
}
