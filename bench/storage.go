package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// The storage row: what the bus stores per million events, the events
// stream alone against the events stream plus what the consumer keeps
// beside it: the positions bucket (one record per partition, cursor
// keys) and the attempts stream (failed attempts, `consumer run`'s
// default --attempts-record failures). The events are the bridge's
// messages (forward.Message) with CloudEvents-like JSON payloads
// (storagePayload), published to a stream created by forward.Provision;
// then a consumer in this process (package consumer, as `consumer run`
// assembles it) delivers them to one ordered and one unordered
// subscription of a local endpoint answering 204, until every
// partition's record settled its last event, and stops. Figures are each
// stream's directory on disk (blocks, indexes, consumer state), which is
// what S2 compression shrinks, with the block being written counted as
// if compressed like the others (storageSizes.sealed); JetStream's
// state.bytes (the uncompressed accounting MaxBytes counts) is printed
// too. The row runs its own embedded server, so that each stream's
// directory is known.

// storageEventsFull and storageEventsQuick are how many events the row
// stores.
const (
	storageEventsFull  = 200_000
	storageEventsQuick = 50_000
)

// storageKept are the streams the consumer keeps beside EVENTS, as the
// row names them.
var storageKept = []struct{ name, stream string }{
	{"positions", "KV_" + position.DefaultBucket},
	{"attempts", wire.DefaultAttemptsStream},
}

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

	last, err := storageEvents(ctx, js, n, e.cfg.Streams, jetstream.NoCompression)
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
	if err := storageDeliver(ctx, js, last); err != nil {
		return row{}, err
	}
	fmt.Printf("bench: storage: [%s] delivered to both subscriptions, every partition settled\n", time.Since(start).Round(100*time.Millisecond))
	total := ev.sealed()
	ours := "EVENTS " + ev.perMillion(n)
	for _, k := range storageKept {
		ks, err := streamSizes(ctx, js, dir, k.stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return row{}, fmt.Errorf("%s: %w", k.stream, err)
		}
		fmt.Printf("bench: storage: %s (%s): %d bytes on disk (%d sealed: %s per million events), state.bytes %d, %d messages kept\n",
			k.name, k.stream, ks.disk, ks.sealed(), ks.perMillion(n), ks.state, ks.msgs)
		total += ks.sealed()
		ours += fmt.Sprintf(" + %s %s", k.name, ks.perMillion(n))
	}
	ratio := float64(total) / float64(ev.sealed())
	ref := "EVENTS alone " + ev.perMillion(n)
	if !e.cfg.Quick {
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
		Name:      "storage per million events: EVENTS + what the consumer keeps (positions bucket, attempts stream), one ordered and one unordered subscription",
		Ours:      ours,
		Reference: ref,
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≤ 1.1 (issue 33)",
		Met:       ratio <= 1.1,
	}, nil
}

// storageDeliver runs a consumer in this process on js, one ordered and
// one unordered subscription of every event to a local endpoint
// answering 204, with the attempts record as `consumer run` keeps it,
// until every partition's record settled its last event (last: the
// events stream sequence of each partition's last event), then stops it.
func storageDeliver(ctx context.Context, js jetstream.JetStream, last map[int]uint64) error {
	sk, err := newPathSink()
	if err != nil {
		return err
	}
	defer sk.srv.Close()
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("bench-storage-row-secret-24b"))
	sub := func(name string, o consumer.Ordering) consumer.Subscription {
		return consumer.Subscription{Name: name, FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: sk.url + "/" + name,
			Secrets: []string{secret}, AllowPrivate: true, Ordering: o, Start: consumer.Start{Policy: consumer.StartAll}}
	}
	c, err := consumer.New(js, consumer.Config{
		Subscriptions: []consumer.Subscription{sub("ordered", consumer.OrderingStream), sub("unordered", consumer.OrderingNone)},
		Attempts:      &consumer.AttemptsConfig{},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = c.Stop(context.Background()) }()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		parts, err := consumer.ReadSharedPositions(ctx, js)
		if err != nil {
			return err
		}
		settled := 0
		for _, p := range parts {
			if want, ok := last[p.Partition]; ok && p.Record.Floor >= want && len(p.Record.Retries) == 0 {
				settled++
			}
		}
		if settled == len(last) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d partitions settled after 10 minutes (%d and %d requests received)",
				settled, len(last), sk.requests("ordered"), sk.requests("unordered"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// storageEvents provisions EVENTS (with compression c, if any) and
// publishes n events of streams streams to it; it returns the sequence
// of each partition's last event (consumer.DefaultPartitions; event i is
// sequence i).
func storageEvents(ctx context.Context, js jetstream.JetStream, n, streams int, c jetstream.StoreCompression) (map[int]uint64, error) {
	if _, err := forward.Provision(ctx, js, forward.StreamConfig{}); err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return nil, err
	}
	last := map[int]uint64{}
	cfg := s.CachedInfo().Config
	if c != jetstream.NoCompression {
		// JetStream compresses with what a stream was opened with: create
		// it so, as an option for new streams would.
		cfg.Compression = c
		if err := js.DeleteStream(ctx, cfg.Name); err != nil {
			return nil, err
		}
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("create EVENTS with S2: %w", err)
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
		last[wire.StreamPartition(ev.Stream, consumer.DefaultPartitions)] = uint64(i + 1)
		ev.Name, ev.Data = storagePayload(rng, ev.Stream, ev.Version, ev.Created)
		msg := forward.Message(ev, forward.Config{})
		if _, err := js.PublishMsgAsync(msg); errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// The server is busy (sealing a block): let the pending ones land.
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			_, err = js.PublishMsgAsync(msg)
			if err != nil {
				return nil, err
			}
		} else if err != nil {
			return nil, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return last, nil
}
