package park

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// markerSweepEvery is how often a replica removes old delete markers of
// its ordered subscriptions' keys from the park bucket.
const markerSweepEvery = time.Hour

// markerSweepFirst is when a replica sweeps first after it starts: soon,
// so that replicas restarted more often than markerSweepEvery (a crash
// loop, frequent deploys) still sweep, but not during start-up.
const markerSweepFirst = time.Minute

// markerMinAge is how old a delete marker must be to be removed: a park
// watcher re-subscribing within it still sees the delete.
const markerMinAge = 30 * time.Minute

// Sweep removes the delete markers an ordered subscription leaves
// in the park bucket. Every failed POST of an ordered event writes its
// attempts count (wire.AttemptsKey) and the count is deleted when the
// event settles; an unparked stream's key is deleted too. The bucket
// keeps no TTL (a parked stream stays parked until an operator acts), so
// each delete leaves a marker message for ever: at 1,000 events/s with
// 5 % failing, 4.3 million a day, every one of them replayed to each park
// watcher at start. nats.go's PurgeDeletes does not serve: it purges a
// key's subject whole, so a value put after the marker was read (a new
// failure count, a stream parked again) would go with it.
//
// Every field is required.
type Sweep struct {
	JS            jetstream.JetStream
	Bucket        jetstream.KeyValue // the park bucket
	Subscriptions []string           // the subscriptions whose keys are swept
	Clock         clockwork.Clock
	Logger        *slog.Logger
}

// Run sweeps markerSweepFirst after it starts, then every
// markerSweepEvery, until ctx ends.
func (s Sweep) Run(ctx context.Context) {
	for wait := markerSweepFirst; ; wait = markerSweepEvery {
		select {
		case <-ctx.Done():
			return
		case <-s.Clock.After(wait):
		}
		n, err := s.sweep(ctx, s.Clock.Now().Add(-markerMinAge))
		switch {
		case err != nil && ctx.Err() == nil:
			s.Logger.Warn("removing old delete markers from the park bucket failed; retrying at the next sweep", slog.Any("error", err), slog.Int("removed", n))
		case n > 0:
			s.Logger.Debug("removed old delete markers from the park bucket", slog.Int("removed", n))
		}
	}
}

// sweep removes the delete and purge markers of s.Subscriptions' keys written
// before cutoff and returns how many it removed.
func (s Sweep) sweep(ctx context.Context, cutoff time.Time) (int, error) {
	old, err := s.markers(ctx, cutoff)
	if err != nil {
		return 0, err
	}
	return s.remove(ctx, old)
}

// marker is a delete or purge marker of the park bucket: its key and
// revision.
type marker struct {
	key string
	rev uint64
}

// markers returns the markers of s.Subscriptions' keys written before cutoff (a
// key whose latest entry is a value has none).
func (s Sweep) markers(ctx context.Context, cutoff time.Time) ([]marker, error) {
	filters := make([]string, 0, 4*len(s.Subscriptions))
	for _, sub := range s.Subscriptions {
		filters = append(filters, wire.ParkedFilter(sub), wire.AttemptsKeyPrefix+sub+".>", wire.SkippedKeyPrefix+sub+".>", wire.AsideKeyPrefix+sub+".>")
	}
	w, err := s.Bucket.WatchFiltered(ctx, filters, jetstream.MetaOnly())
	if err != nil {
		return nil, fmt.Errorf("park: watch the park bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var old []marker
	for e := range w.Updates() {
		if e == nil { // every current value seen
			break
		}
		if op := e.Operation(); (op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge) && e.Created().Before(cutoff) {
			old = append(old, marker{e.Key(), e.Revision()})
		}
	}
	return old, ctx.Err()
}

// remove removes each marker with a purge of its key's subject bounded by
// the marker's own sequence, so a value written after the marker was
// read (a new failure count, the stream parked again) stays. It returns
// how many it removed.
func (s Sweep) remove(ctx context.Context, old []marker) (int, error) {
	if len(old) == 0 {
		return 0, nil
	}
	stream, err := s.JS.Stream(ctx, "KV_"+s.Bucket.Bucket())
	if err != nil {
		return 0, fmt.Errorf("park: the park bucket's stream: %w", err)
	}
	prefix := "$KV." + s.Bucket.Bucket() + "."
	for i, m := range old {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(prefix+m.key), jetstream.WithPurgeSequence(m.rev+1)); err != nil {
			return i, fmt.Errorf("park: remove the delete marker of key %q: %w", m.key, err)
		}
	}
	return len(old), nil
}
