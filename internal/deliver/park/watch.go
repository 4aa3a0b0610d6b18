package park

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/wire"
)

// Reread reads the subscription's park entries from the park bucket
// itself (not the watch, which may be re-subscribing and not have sent an
// entry written meanwhile) and parks every stream found that is not
// parked here yet. A new owner calls it before its fence passes, so a park
// that landed while the watch was away holds the stream's later events.
// Entries gone from the bucket are left to the watch (it unparks them).
func (pk *Parking) Reread(ctx context.Context) error {
	kv := pk.kv()
	if kv == nil {
		return errNotProvisioned
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := kv.ListKeysFiltered(ctx, wire.ParkedFilter(pk.sub))
	if err != nil {
		return fmt.Errorf("list parked streams of subscription %q: %w", pk.sub, err)
	}
	defer func() { _ = keys.Stop() }()
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // unparked meanwhile
		}
		if err != nil {
			return fmt.Errorf("read park entry %q: %w", k, err)
		}
		var ps deadletter.ParkedStream
		if err := json.Unmarshal(e.Value(), &ps); err != nil {
			pk.log.Warn("unreadable park entry; ignored", slog.String("key", k), slog.Any("error", err))
			continue
		}
		pk.mu.Lock()
		if cur := pk.parked[k]; cur == nil {
			pk.log.Info("a stream parked while the watch was away; holding it", slog.String("stream", ps.Stream))
			pk.parked[k] = &parkedStream{entry: ps}
		}
		pk.mu.Unlock()
	}
	return ctx.Err()
}

// Run follows the park bucket's entries of the subscription and keeps its
// held events alive (keepAlive) until ctx ends, closing ready once the
// existing entries are loaded (partitions start only then, so a parked
// stream is never delivered). It needs the park bucket (Provisioned).
func (pk *Parking) Run(ctx context.Context, ready chan struct{}) {
	var wg sync.WaitGroup
	wg.Go(func() { pk.keepAlive(ctx) })
	pk.watch(ctx, ready)
	wg.Wait()
}

// watch follows the park bucket's entries of the subscription until ctx
// ends, closing ready once the existing ones are loaded.
func (pk *Parking) watch(ctx context.Context, ready chan struct{}) {
	kv := pk.kv()
	if kv == nil {
		pk.log.Error("parked streams not watched: the park bucket was not provisioned")
		<-ctx.Done()
		return
	}
	readied := false
	for ctx.Err() == nil {
		w, err := kv.Watch(ctx, wire.ParkedFilter(pk.sub))
		if err != nil {
			pk.log.Warn("watching parked streams failed; retrying", slog.Any("error", err))
			pk.failed(ctx, err)
			select {
			case <-ctx.Done():
			case <-pk.clock.After(time.Second):
			}
			continue
		}
		// A (re)started watch sends every entry, then nil: a stream parked
		// here whose entry is not among them was unparked meanwhile.
		initial := map[string]bool{}
		// The watch's updates end only when it stops, and not even then
		// when it was stopped as nats.go was still setting it up (its
		// channel is closed by a handler set after the subscription):
		// the loop also ends with ctx, or Run would wait for it forever
		// at shutdown.
		for {
			var e jetstream.KeyValueEntry
			var open bool
			select {
			case e, open = <-w.Updates():
			case <-ctx.Done():
			}
			if !open {
				break
			}
			if e == nil {
				if initial != nil {
					pk.mu.Lock()
					var gone []string
					for bk := range pk.parked {
						if !initial[bk] {
							gone = append(gone, bk)
						}
					}
					pk.mu.Unlock()
					for _, bk := range gone {
						pk.unpark(bk)
					}
					initial = nil
				}
				if !readied {
					close(ready)
					readied = true
				}
				continue
			}
			if initial != nil {
				initial[e.Key()] = true
			}
			switch e.Operation() {
			case jetstream.KeyValuePut:
				var ps deadletter.ParkedStream
				if err := json.Unmarshal(e.Value(), &ps); err != nil {
					pk.log.Warn("unreadable park entry; ignored", slog.String("key", e.Key()), slog.Any("error", err))
					continue
				}
				pk.mu.Lock()
				if cur := pk.parked[e.Key()]; cur == nil {
					pk.parked[e.Key()] = &parkedStream{entry: ps}
				} else {
					cur.entry.HeadEventID, cur.releasing = ps.HeadEventID, false
				}
				pk.mu.Unlock()
			case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
				pk.unpark(e.Key())
			}
		}
		_ = w.Stop()
	}
}
