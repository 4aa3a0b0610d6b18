package webhook

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// ClaimState is what Claim found for an Idempotency-Key.
type ClaimState int

const (
	// ClaimWon: the key was absent (never seen, released, or its record had
	// expired). It is now in progress under the caller's lease: run the
	// side effects, then Complete or Release.
	ClaimWon ClaimState = iota + 1
	// ClaimInProgress: another attempt holds an unexpired lease on the key
	// and has neither completed nor released it. Nothing changed. The
	// caller must not run the side effects and must not report success
	// either: if the other attempt fails, this delivery is still needed
	// (Handler answers 503 with Retry-After).
	ClaimInProgress
	// ClaimDone: an attempt completed the key within its TTL. Nothing
	// changed; the delivery is a duplicate.
	ClaimDone
)

// String returns "won", "in-progress" or "done".
func (s ClaimState) String() string {
	switch s {
	case ClaimWon:
		return "won"
	case ClaimInProgress:
		return "in-progress"
	case ClaimDone:
		return "done"
	}
	return "ClaimState(" + strconv.Itoa(int(s)) + ")"
}

// Claim is the result of IdempotencyStore.Claim.
type Claim struct {
	// Key is the Idempotency-Key claimed.
	Key string
	// State says whether the caller won the key, or found it in progress or
	// done.
	State ClaimState
	// Token identifies the caller's lease when State is ClaimWon; Release
	// only removes the record holding this token (fencing: an attempt whose
	// lease expired and was taken over cannot release the new holder's).
	// Opaque; "" for the other states.
	Token string
	// Remaining is how long the record found or created still counts, by
	// the store's clock at the claim: the rest of the lease (ClaimWon,
	// ClaimInProgress) or of the TTL (ClaimDone).
	Remaining time.Duration
}

// IdempotencyStore records, per Idempotency-Key, whether a delivery is absent,
// in progress under a lease, or done, so that a redelivered webhook
// (at-least-once) runs its side effects once, even when a retry arrives while
// the first attempt still runs. Every operation is atomic per key; the memory
// and Postgres stores (package webhook/pgstore) behave identically.
//
// The life of a key: Claim (absent → in progress for the lease) then either
// Complete (→ done for the TTL; choose it with MinSafeTTL) or Release
// (→ absent, so the sender's retry runs the side effects again). A lease that
// expires (the receiver crashed) makes the key absent again.
type IdempotencyStore interface {
	// Claim takes key for lease when it is absent or its record expired
	// (State ClaimWon, with a fresh Token), and otherwise reports what holds
	// it (ClaimInProgress or ClaimDone) without changing anything. Errors:
	// an empty key (ErrInvalidKey), lease <= 0, a done ctx, a store failure.
	Claim(ctx context.Context, key string, lease time.Duration) (Claim, error)
	// Complete marks c.Key done for ttl, whatever holds it now: the side
	// effects ran, so the record must say so even if the lease had expired
	// meanwhile. ttl must be positive.
	Complete(ctx context.Context, c Claim, ttl time.Duration) error
	// Release makes c.Key absent if it is still in progress under c.Token,
	// so the sender's retry runs again. It changes nothing when the key is
	// done, absent, or held by another lease; that is not an error.
	Release(ctx context.Context, c Claim) error
}

// ErrInvalidKey is wrapped by the stores for an empty Idempotency-Key.
var ErrInvalidKey = errors.New("invalid idempotency key")

// DefaultMaxKeys is the MemoryStore bound when NewMemoryStore gets maxKeys <= 0.
const DefaultMaxKeys = 100_000

// MemoryStore is an in-process IdempotencyStore: at most maxKeys records
// (in progress and done together), each expiring at the end of its lease or
// TTL, the least recently used evicted first when full. It is safe for
// concurrent use. Records live in one process only and are lost on restart;
// an evicted record lets a late duplicate through, so size maxKeys above
// (deliveries per second × TTL). Use a Postgres store (webhook/pgstore) for
// several receiver replicas or records that survive a restart.
//
// It keeps its own container/list LRU rather than an LRU library: the records
// need per-entry expiry and an atomic check-and-claim under one lock, and
// this package stays standard library only.
type MemoryStore struct {
	mu      sync.Mutex
	maxKeys int
	now     func() time.Time
	tokens  uint64
	// order holds *memoryEntry, most recently used at the front.
	order *list.List
	byKey map[string]*list.Element
}

type memoryEntry struct {
	key     string
	done    bool
	token   string
	expires time.Time
}

// MemoryStoreOption configures a MemoryStore in NewMemoryStore.
type MemoryStoreOption func(*MemoryStore)

// WithStoreClock sets the clock leases and TTLs are measured against
// (default time.Now). A nil now keeps the default.
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

// Claim implements IdempotencyStore. Finding a key also counts as use for
// the LRU order.
func (m *MemoryStore) Claim(ctx context.Context, key string, lease time.Duration) (Claim, error) {
	if err := checkKey(ctx, "claim", key); err != nil {
		return Claim{}, err
	}
	if lease <= 0 {
		return Claim{}, fmt.Errorf("claim idempotency key %q: lease %v must be > 0", key, lease)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if el, ok := m.byKey[key]; ok {
		e := el.Value.(*memoryEntry)
		m.order.MoveToFront(el)
		if now.Before(e.expires) {
			if e.done {
				return Claim{Key: key, State: ClaimDone, Remaining: e.expires.Sub(now)}, nil
			}
			return Claim{Key: key, State: ClaimInProgress, Remaining: e.expires.Sub(now)}, nil
		}
		*e = m.newLease(key, now.Add(lease))
		return Claim{Key: key, State: ClaimWon, Token: e.token, Remaining: lease}, nil
	}
	e := m.newLease(key, now.Add(lease))
	m.put(&e)
	return Claim{Key: key, State: ClaimWon, Token: e.token, Remaining: lease}, nil
}

// Complete implements IdempotencyStore.
func (m *MemoryStore) Complete(ctx context.Context, c Claim, ttl time.Duration) error {
	if err := checkKey(ctx, "complete", c.Key); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("complete idempotency key %q: ttl %v must be > 0", c.Key, ttl)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := memoryEntry{key: c.Key, done: true, expires: m.now().Add(ttl)}
	if el, ok := m.byKey[c.Key]; ok {
		*el.Value.(*memoryEntry) = e
		m.order.MoveToFront(el)
		return nil
	}
	m.put(&e)
	return nil
}

// Release implements IdempotencyStore.
func (m *MemoryStore) Release(ctx context.Context, c Claim) error {
	if err := checkKey(ctx, "release", c.Key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[c.Key]; ok {
		if e := el.Value.(*memoryEntry); !e.done && e.token == c.Token {
			m.order.Remove(el)
			delete(m.byKey, c.Key)
		}
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

// newLease returns an in-progress entry with a fresh token. m.mu is held.
func (m *MemoryStore) newLease(key string, expires time.Time) memoryEntry {
	m.tokens++
	return memoryEntry{key: key, token: strconv.FormatUint(m.tokens, 10), expires: expires}
}

// put adds e as the most recently used record, evicting the least recently
// used beyond the bound. m.mu is held.
func (m *MemoryStore) put(e *memoryEntry) {
	m.byKey[e.key] = m.order.PushFront(e)
	for m.order.Len() > m.maxKeys {
		back := m.order.Back()
		m.order.Remove(back)
		delete(m.byKey, back.Value.(*memoryEntry).key)
	}
}

// checkKey validates the arguments every store operation shares.
func checkKey(ctx context.Context, op, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s idempotency key %q: %w", op, key, err)
	}
	if key == "" {
		return fmt.Errorf("%s idempotency key: %w: key is empty", op, ErrInvalidKey)
	}
	return nil
}
