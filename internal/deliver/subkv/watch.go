package subkv

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// isSubscriptionKey reports whether key names a subscription: a
// subscription's name (subscription.ValidName). Keys with a '.' (or
// anything else) are left to other state kept in the bucket (per-endpoint
// health, say) and are not subscriptions to List or Watch.
func isSubscriptionKey(key string) bool { return subscription.ValidName(key) }

// Change is one change of the bucket seen by Watch.
type Change struct {
	// Name is the subscription's name (the key).
	Name string
	// Deleted is true when the subscription was deleted (or purged).
	Deleted bool
	// Entry is the subscription as now stored, unless Deleted or Err.
	Entry Entry
	// Err is why the stored document could not be read (a key this
	// keyring does not hold, a later document version): the watcher
	// keeps what it ran for this subscription.
	Err error
	// Initial is true for the changes that replay the bucket's content
	// when the watch starts; Watch sends a Change with Name "" and Initial
	// true after the last of them (also when the bucket is empty).
	Initial bool
}

// Watch sends every subscription the bucket holds, then a marker Change
// (Name "", Initial true), then every change, to fn, in order, until ctx
// ends or the watch fails (an error to retry: a new Watch replays the
// whole content again).
func (s *Store) Watch(ctx context.Context, fn func(Change)) error {
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch subscriptions bucket %q: %w", s.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch subscriptions bucket %q: the watcher stopped", s.Bucket())
			}
			if e == nil {
				initial = false
				fn(Change{Initial: true})
				continue
			}
			if !isSubscriptionKey(e.Key()) {
				continue // another kind of state kept in the bucket
			}
			c := Change{Name: e.Key(), Initial: initial}
			if e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge {
				c.Deleted = true
			} else {
				c.Entry, c.Err = s.entry(e.Value(), e.Revision())
			}
			fn(c)
		}
	}
}
