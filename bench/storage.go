package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/wire"
)

// The storage row: what the bus stores per million events, the events
// stream alone against the events stream plus what ordered delivery adds
// (the partitioned copy). The events are the bridge's messages
// (forward.Message) with CloudEvents-like JSON payloads (storagePayload),
// published to a stream created by forward.Provision; the copy is made
// from ordercopy.StreamConfig, as the consumer makes it, in variants
// (storageVariants), one at a time, each read once it has sourced every
// event. Figures are the stream's directory on disk (blocks, indexes,
// consumer state), which is what S2 compression shrinks, with the block
// being written counted as if compressed like the others (storageSizes.
// sealed); JetStream's state.bytes (the uncompressed accounting MaxBytes
// counts) is printed too. The row runs its own embedded server, so that each stream's
// directory is known.

// storageVariant is one way of keeping the copy.
type storageVariant struct {
	name        string
	compression jetstream.StoreCompression
	interest    bool // interest retention; the partition consumers ack everything before the copy is read
	fullOnly    bool // not in quick runs
}

// storageVariants are the copies measured: as the consumer makes it now,
// as an earlier version made it (uncompressed), and with interest
// retention (not kept: docs/ordering.md, "The copy's retention") once
// delivered. An uncompressed copy takes on disk what JetStream counts in
// state.bytes (the two differed by 0.001 % when measured), so a quick run
// reads it from the compressed copy's state instead of sourcing every
// event once more.
var storageVariants = []storageVariant{
	{name: "limits, S2 (now)", compression: jetstream.S2Compression},
	{name: "limits, uncompressed (before)", fullOnly: true},
	{name: "interest, S2, all delivered (not kept)", compression: jetstream.S2Compression, interest: true, fullOnly: true},
}

// storageEventsFull and storageEventsQuick are how many events the row
// stores. Sourcing runs at about 5,000 events/s on the 2-core test
// machine.
const (
	storageEventsFull  = 200_000
	storageEventsQuick = 50_000
)

func (e *env) storageRow(ctx context.Context) (row, error) {
	start := time.Now()
	n := storageEventsFull
	if e.cfg.Quick {
		n = storageEventsQuick
	}
	dir, err := os.MkdirTemp("", "jsbridge-bench-storage-")
	if err != nil {
		return row{}, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
	if err != nil {
		return row{}, err
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		return row{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return row{}, err
	}

	events, err := storageEvents(ctx, js, n, e.cfg.Streams, jetstream.NoCompression)
	if err != nil {
		return row{}, err
	}
	ev, err := streamSizes(ctx, js, dir, wire.DefaultEventsStream)
	if err != nil {
		return row{}, err
	}
	fmt.Printf("bench: storage: [%s] %d events (%d streams): EVENTS %d bytes on disk, state.bytes %d (%.0f per event)\n",
		time.Since(start).Round(100*time.Millisecond), n, e.cfg.Streams, ev.disk, ev.state, float64(ev.state)/float64(n))
	if err := printMessageSizes(ctx, js, wire.DefaultEventsStream, ""); err != nil {
		return row{}, err
	}
	copies := map[string]storageSizes{}
	for _, v := range storageVariants {
		if v.fullOnly && e.cfg.Quick {
			continue
		}
		cs, err := storageCopy(ctx, js, dir, events, v)
		if err != nil {
			return row{}, fmt.Errorf("copy %s: %w", v.name, err)
		}
		copies[v.name] = cs
		fmt.Printf("bench: storage: [%s] copy %s: %d bytes on disk (%d with its last block compressed too: %s per million events), state.bytes %d, %d messages kept\n",
			time.Since(start).Round(100*time.Millisecond), v.name, cs.disk, cs.sealed(), cs.perMillion(n), cs.state, cs.msgs)
	}
	now, interest := copies[storageVariants[0].name], copies[storageVariants[2].name]
	before, ok := copies[storageVariants[1].name]
	if !ok {
		before = storageSizes{disk: now.state}
	}
	ratio := float64(ev.sealed()+now.sealed()) / float64(ev.sealed())
	ours := fmt.Sprintf("EVENTS %s + copy %s (S2; before: %s", ev.perMillion(n), now.perMillion(n), before.perMillion(n))
	ref := "EVENTS alone " + ev.perMillion(n)
	if !e.cfg.Quick {
		ours += "; interest retention, all delivered: " + interest.perMillion(n)
		// The events stream itself with S2 (what an option for new
		// streams would give; an existing one keeps its configuration).
		if err := js.DeleteStream(ctx, wire.DefaultEventsStream); err != nil {
			return row{}, err
		}
		if _, err := storageEvents(ctx, js, n, e.cfg.Streams, jetstream.S2Compression); err != nil {
			return row{}, err
		}
		evz, err := streamSizes(ctx, js, dir, wire.DefaultEventsStream)
		if err != nil {
			return row{}, err
		}
		fmt.Printf("bench: storage: EVENTS with S2: %d bytes on disk (%d with its last block compressed too: %s per million events)\n", evz.disk, evz.sealed(), evz.perMillion(n))
		ref += " (with S2: " + evz.perMillion(n) + ")"
	}
	fmt.Printf("bench: storage: took %s\n", time.Since(start).Round(100*time.Millisecond))
	return row{
		Name:      "storage per million events: EVENTS + the ordered copy",
		Ours:      ours + ")",
		Reference: ref,
		Ratio:     fmt.Sprintf("%.2f (before: %.2f)", ratio, float64(ev.sealed()+before.sealed())/float64(ev.sealed())),
		Target:    "≤ 1.2",
		Met:       ratio <= 1.2,
	}, nil
}

// storageEvents provisions EVENTS (with compression c, if any) and
// publishes n events of streams streams to it; it returns its config.
func storageEvents(ctx context.Context, js jetstream.JetStream, n, streams int, c jetstream.StoreCompression) (jetstream.StreamConfig, error) {
	if _, err := forward.Provision(ctx, js, forward.StreamConfig{}); err != nil {
		return jetstream.StreamConfig{}, err
	}
	s, err := js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	cfg := s.CachedInfo().Config
	if c != jetstream.NoCompression {
		// JetStream compresses with what a stream was opened with: create
		// it so, as an option for new streams would.
		cfg.Compression = c
		if err := js.DeleteStream(ctx, cfg.Name); err != nil {
			return cfg, err
		}
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			return cfg, fmt.Errorf("create EVENTS with S2: %w", err)
		}
	}
	rng := rand.New(rand.NewPCG(23, 1))
	versions := make([]int64, streams)
	created := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	for i := range n {
		k := rng.IntN(streams)
		ev := event.Event{
			ID: int64(i + 1), Stream: fmt.Sprintf("order-%d", k), Version: versions[k], Created: created.Add(time.Duration(i) * time.Millisecond),
			Meta: event.Meta{Correlation: uuid(rng), Causation: uuid(rng)},
		}
		versions[k]++
		ev.Name, ev.Data = storagePayload(rng, ev.Stream, ev.Version, ev.Created)
		msg := forward.Message(ev, forward.Config{})
		if _, err := js.PublishMsgAsync(msg); errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// The server is busy (sealing a block): let the pending ones land.
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return cfg, ctx.Err()
			}
			_, err = js.PublishMsgAsync(msg)
			if err != nil {
				return cfg, err
			}
		} else if err != nil {
			return cfg, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return cfg, ctx.Err()
	}
	return cfg, nil
}

// storageCopy creates the copy of the events stream (ecfg) in variant v,
// waits until it has sourced every event (and, for interest retention,
// its partition consumers acked them), reads its size and deletes it.
func storageCopy(ctx context.Context, js jetstream.JetStream, dir string, ecfg jetstream.StreamConfig, v storageVariant) (storageSizes, error) {
	cfg := ordercopy.StreamConfig(ecfg, orderedPartitions, 0)
	cfg.Compression = v.compression
	sources := cfg.Sources
	if v.interest {
		// Interest first: a message sourced while no consumer wants it is
		// not kept.
		cfg.Retention, cfg.Sources = jetstream.InterestPolicy, nil
	}
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		return storageSizes{}, err
	}
	defer js.DeleteStream(context.Background(), cfg.Name) //nolint:errcheck // best effort: the next variant needs no room
	var acked func() (bool, error)
	if v.interest {
		var stop func()
		if acked, stop, err = ackAll(ctx, js, cfg.Name); err != nil {
			return storageSizes{}, err
		}
		defer stop()
		cfg.Sources = sources
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return storageSizes{}, err
		}
	}
	n := storageCount(ctx, js)
	cpu := ownCPU()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		info, err := s.Info(ctx)
		if err != nil {
			return storageSizes{}, err
		}
		done := info.State.LastSeq >= n
		if done && acked != nil {
			if done, err = acked(); err != nil {
				return storageSizes{}, err
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			return storageSizes{}, fmt.Errorf("sourced %d of %d events after 10 minutes", info.State.LastSeq, n)
		}
		select {
		case <-ctx.Done():
			return storageSizes{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	// This process hosts the server: its CPU while the copy sourced (and,
	// for interest, its consumers acked) is the server's, with the polling
	// and the ack loop.
	fmt.Printf("bench: storage:   %s sourced %d events with %s of CPU (%.1f µs per event)\n",
		cfg.Name, n, (ownCPU() - cpu).Round(time.Millisecond), float64((ownCPU()-cpu).Microseconds())/float64(n))
	if err := printMessageSizes(ctx, js, cfg.Name, "  "); err != nil && !v.interest {
		return storageSizes{}, err
	}
	return streamSizes(ctx, js, dir, cfg.Name)
}

// storageCount is the events stream's message count.
func storageCount(ctx context.Context, js jetstream.JetStream) uint64 {
	s, err := js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return 0
	}
	return s.CachedInfo().State.Msgs
}

// ackAll creates one durable pull consumer per partition on the copy, as
// an ordered subscription has them (explicit acks), and acks every
// message each receives, one by one; acked reports when none has anything
// pending.
func ackAll(ctx context.Context, js jetstream.JetStream, copy string) (acked func() (bool, error), stop func(), err error) {
	var cons []jetstream.Consumer
	var ccs []jetstream.ConsumeContext
	stop = func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}
	for p := range orderedPartitions {
		filter, err := wire.OrderedFilter(wire.DefaultEventsPrefix, p, wire.All(wire.DefaultEventsPrefix))
		if err != nil {
			return nil, stop, err
		}
		c, err := js.CreateConsumer(ctx, copy, jetstream.ConsumerConfig{
			Durable: wire.PartitionDurable("bench", p), FilterSubject: filter,
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10_000,
		})
		if err != nil {
			return nil, stop, err
		}
		cc, err := c.Consume(func(m jetstream.Msg) { _ = m.Ack() }, jetstream.PullMaxMessages(1000))
		if err != nil {
			return nil, stop, err
		}
		cons, ccs = append(cons, c), append(ccs, cc)
	}
	acked = func() (bool, error) {
		for _, c := range cons {
			info, err := c.Info(ctx)
			if err != nil {
				return false, err
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				return false, nil
			}
		}
		return true, nil
	}
	return acked, stop, nil
}
