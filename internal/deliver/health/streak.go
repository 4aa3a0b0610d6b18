package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// Failure streaks in the health bucket. The time without a success
// (Config.DisableAfter, 24 h) is shared, so that a restart or another
// replica taking over the probes does not start it over: a replica whose
// own streak reached DisableMinFailures writes wire.StreakKey with the
// streak's start (KV Create: the first start stands), every replica
// measures DisableAfter from the earlier of its own start and the shared
// one, and the next 2xx on any replica deletes the key, ending every
// streak. The failed attempts stay counted per replica, in memory.
// Writing only after DisableMinFailures keeps a flapping endpoint from
// writing at all; a dead one costs one write and one delete a streak.

// streakRecord is the value of a streak key.
type streakRecord struct {
	Since time.Time `json:"since"`
}

// sharedStreaks are the streak keys as this replica's health watch saw
// them, and the ones it wrote. Safe for concurrent use.
type sharedStreaks struct {
	mu      sync.Mutex
	since   map[string]time.Time // from the bucket
	written map[string]bool      // written by this replica, not seen yet
	// n is len(since)+len(written), read without the lock: a 2xx when no
	// streak exists (the usual case) takes no lock.
	n atomic.Int64
	// wg counts the writes under way (the State's Stop waits for them).
	wg sync.WaitGroup
}

func newSharedStreaks() *sharedStreaks {
	return &sharedStreaks{since: map[string]time.Time{}, written: map[string]bool{}}
}

// count updates n (s.mu held).
func (s *sharedStreaks) count() { s.n.Store(int64(len(s.since) + len(s.written))) }

// any reports whether some streak is known (nil s: none).
func (s *sharedStreaks) any() bool { return s != nil && s.n.Load() > 0 }

// observe applies a watch entry of a streak key. It returns the
// subscription's name and whether the key was deleted (a success
// somewhere: the caller ends its own streak).
func (s *sharedStreaks) observe(e jetstream.KeyValueEntry) (name string, ended bool) {
	name = strings.TrimPrefix(e.Key(), wire.StreakKeyPrefix)
	var rec streakRecord
	put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &rec) == nil && !rec.Since.IsZero()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.written, name)
	if put {
		s.since[name] = rec.Since
	} else {
		delete(s.since, name)
	}
	s.count()
	return name, !put
}

// earliest returns the shared start of name's streak when it is before
// since, else since.
func (s *sharedStreaks) earliest(name string, since time.Time) time.Time {
	if s == nil {
		return since
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.since[name]; ok && t.Before(since) {
		return t
	}
	return since
}

// record writes name's streak, started at since, to kv (nil: the bucket
// is not open; nothing is shared) unless a streak of name is known, in
// the background: a failing delivery never waits for it.
func (s *sharedStreaks) record(kv jetstream.KeyValue, name string, since time.Time) {
	if s == nil || kv == nil {
		return
	}
	s.mu.Lock()
	_, known := s.since[name]
	if known || s.written[name] {
		s.mu.Unlock()
		return
	}
	s.written[name] = true
	s.count()
	s.mu.Unlock()
	data, _ := json.Marshal(streakRecord{Since: since.UTC()})
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), healthWriteTimeout)
		defer cancel()
		_, _ = kv.Create(ctx, wire.StreakKey(name), data) // exists: an earlier start stands
	})
}

// end forgets name's streak and deletes its key from kv when one is
// known, in the background.
func (s *sharedStreaks) end(kv jetstream.KeyValue, name string) {
	if !s.any() || !s.forget(name) || kv == nil {
		return
	}
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), healthWriteTimeout)
		defer cancel()
		_ = kv.Delete(ctx, wire.StreakKey(name))
	})
}

// wait waits for the writes under way (none on a nil s).
func (s *sharedStreaks) wait() {
	if s != nil {
		s.wg.Wait()
	}
}

// forget drops what s knows of name's streak, without I/O, and reports
// whether it knew one.
func (s *sharedStreaks) forget(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, known := s.since[name]
	known = known || s.written[name]
	delete(s.since, name)
	delete(s.written, name)
	s.count()
	return known
}

// Forget ends the failure streak of subscription name, deleted from the
// subscriptions: here, and its key in the health bucket, so one added
// again under the name starts without it (docs/wire.md). Errors: the
// bucket's, but a missing bucket or key; a nil h does nothing.
func (h *State) Forget(ctx context.Context, name string) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	if _, ok := h.streaks[name]; ok {
		delete(h.streaks, name)
		h.failing.Add(-1)
	}
	h.shared.forget(name)
	h.mu.Unlock()
	kv, err := jsapi.ExistingKeyValue(ctx, h.js, wire.DefaultHealthBucket)
	if err == nil && kv != nil {
		err = kv.Purge(ctx, wire.StreakKey(name))
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deliver: subscription %q: forget its failure streak: %w", name, err)
	}
	return nil
}
