package webhook

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// IdempotencyStore remembers the Idempotency-Keys a receiver has taken on, so
// that a redelivered webhook (at-least-once) runs its side effects once.
// Choose the TTL from the sender's retry profile: longer than the whole span
// over which one event can be delivered again (its retries and a dead-letter
// replay window you care about).
type IdempotencyStore interface {
	// Claim atomically records key for ttl. first is true when the key was
	// not recorded (or its record had expired); false when an unexpired
	// record exists, in which case nothing changes. ttl must be positive.
	Claim(ctx context.Context, key string, ttl time.Duration) (first bool, err error)
	// Release forgets key, so a retry of a delivery whose processing failed
	// runs again. Releasing an unknown key is not an error.
	Release(ctx context.Context, key string) error
}

// ErrInvalidKey is wrapped by MemoryStore for an empty Idempotency-Key.
var ErrInvalidKey = errors.New("invalid idempotency key")

// DefaultMaxKeys is the MemoryStore bound when NewMemoryStore gets maxKeys <= 0.
const DefaultMaxKeys = 100_000

// MemoryStore is an in-process IdempotencyStore: at most maxKeys records,
// each expiring after its TTL, the least recently claimed evicted first when
// full. It is safe for concurrent use. Records live in one process only and
// are lost on restart; an evicted record lets a late duplicate through, so
// size maxKeys above (deliveries per second × TTL).
type MemoryStore struct {
	mu      sync.Mutex
	maxKeys int
	now     func() time.Time
	// order holds *memoryEntry, most recently claimed at the front.
	order *list.List
	byKey map[string]*list.Element
}

type memoryEntry struct {
	key     string
	expires time.Time
}

// MemoryStoreOption configures a MemoryStore in NewMemoryStore.
type MemoryStoreOption func(*MemoryStore)

// WithStoreClock sets the clock TTLs are measured against (default
// time.Now). A nil now keeps the default.
func WithStoreClock(now func() time.Time) MemoryStoreOption {
	return func(m *MemoryStore) {
		if now != nil {
			m.now = now
		}
	}
}

// NewMemoryStore returns an empty MemoryStore holding at most maxKeys records
// (DefaultMaxKeys, 100 000, when maxKeys <= 0).
func NewMemoryStore(maxKeys int, opts ...MemoryStoreOption) *MemoryStore {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	m := &MemoryStore{maxKeys: maxKeys, now: time.Now, order: list.New(), byKey: map[string]*list.Element{}}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Claim implements IdempotencyStore. A duplicate claim also counts as use for
// the LRU order. Errors: an empty key (ErrInvalidKey), ttl <= 0, or a done ctx.
func (m *MemoryStore) Claim(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("claim idempotency key: %w", err)
	}
	if key == "" {
		return false, fmt.Errorf("claim idempotency key: %w: key is empty", ErrInvalidKey)
	}
	if ttl <= 0 {
		return false, fmt.Errorf("claim idempotency key %q: ttl %v must be > 0", key, ttl)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if el, ok := m.byKey[key]; ok {
		e := el.Value.(*memoryEntry)
		m.order.MoveToFront(el)
		if now.Before(e.expires) {
			return false, nil
		}
		e.expires = now.Add(ttl)
		return true, nil
	}
	m.byKey[key] = m.order.PushFront(&memoryEntry{key: key, expires: now.Add(ttl)})
	for m.order.Len() > m.maxKeys {
		m.remove(m.order.Back())
	}
	return true, nil
}

// Release implements IdempotencyStore. It fails only for a done ctx.
func (m *MemoryStore) Release(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("release idempotency key %q: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[key]; ok {
		m.remove(el)
	}
	return nil
}

// Len returns the number of records held, expired ones not yet reclaimed
// included.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.order.Len()
}

func (m *MemoryStore) remove(el *list.Element) {
	m.order.Remove(el)
	delete(m.byKey, el.Value.(*memoryEntry).key)
}
