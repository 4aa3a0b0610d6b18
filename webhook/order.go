package webhook

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// OrderKey names one source stream as an order gate tracks it. Stream ids
// are unique within one event source, so the key is the stream id scoped by
// the CloudEvents source, and by a namespace the receiver chooses
// (WithGateNamespace) for each ordered subscription it serves: two
// subscriptions delivering the same stream to one receiver each have their
// own lease epochs and must not share a record.
type OrderKey struct {
	// Namespace is the gate's namespace; "" by default.
	Namespace string
	// Source is the event's CloudEvents source (ce-source, or "source" in
	// the JSON envelope).
	Source string
	// Stream is the stream id (ce-subject, or "subject" in the envelope).
	Stream string
}

// String names the key for errors: `stream "order-42" of source "/shop"`,
// followed by ` in namespace "sub-a"` when there is one.
func (k OrderKey) String() string {
	s := fmt.Sprintf("stream %q of source %q", k.Stream, k.Source)
	if k.Namespace != "" {
		s += fmt.Sprintf(" in namespace %q", k.Namespace)
	}
	return s
}

// OrderPosition is how far an order gate has processed one stream.
type OrderPosition struct {
	// Version is the last version processed (answered 2xx by the gated
	// handler); -1 when none was.
	Version int64
	// Epoch is the sender's lease epoch (Jsbridge-Lease-Epoch) of the last
	// version processed: the highest epoch processed for the stream, since
	// the gate refuses lower ones. 0 when none was.
	Epoch uint64
	// Partition is the partition (Jsbridge-Partition) the last version
	// processed came from, for operators; -1 when none was. The gate does
	// not compare it: lease epochs are bucket-wide KV revisions, comparable
	// across partitions.
	Partition int
}

// Unprocessed is the OrderPosition of a stream the gate has processed
// nothing of.
var Unprocessed = OrderPosition{Version: -1, Partition: -1}

// OrderStore keeps, per stream, the position an order gate has processed it
// to, and serializes the requests of one stream: the gate processes a
// version only while it holds the stream's record, and records the new
// position before the sender sees the answer. The memory store and the
// Postgres store (package webhook/pgstore) behave identically (both run the
// suite in webhook/ordertest).
type OrderStore interface {
	// Lock tries to take key's record without waiting. It returns the
	// record's position (Unprocessed for a stream never recorded) and, when
	// the caller got the record, the held lock; the lock is nil when another
	// caller holds the record, and the position is then the last one
	// recorded. The holder ends the lock with Advance or Release. Errors: a
	// done ctx, a store failure.
	Lock(ctx context.Context, key OrderKey) (OrderPosition, OrderLock, error)
	// Position returns key's recorded position without locking it
	// (Unprocessed for a stream never recorded).
	Position(ctx context.Context, key OrderKey) (OrderPosition, error)
}

// OrderLock is a held stream record (OrderStore.Lock). Exactly one of
// Advance or Release ends it; Release after Advance, and a second Release,
// do nothing.
type OrderLock interface {
	// Advance records pos as the stream's position and releases the lock.
	// pos.Version must be above the position found at Lock. On an error
	// nothing was recorded and the lock is released.
	Advance(ctx context.Context, pos OrderPosition) error
	// Release gives the record up unchanged.
	Release(ctx context.Context) error
}

// ContextOrderLock is an OrderLock holding state the rest of the request
// shares, such as the database transaction of webhook/pgstore's
// OrderStore: the gate runs its handler with the request context WithLock
// returns, so an idempotency store, and the receiver's own handler, can
// find that state there and make their writes part of it (see
// pgstore.Tx). A lock that holds nothing to share need not implement it.
type ContextOrderLock interface {
	OrderLock
	// WithLock returns ctx carrying the lock's shared state.
	WithLock(ctx context.Context) context.Context
}

// ErrOrderAdvance is wrapped by OrderLock.Advance for a position that does
// not move the stream forward, and for a lock already ended.
var ErrOrderAdvance = errors.New("invalid order advance")

// MemoryOrderStore is an in-process OrderStore: one record (about 100 bytes)
// per stream, never evicted, safe for concurrent use. Its records live in
// one process and are lost on restart; a gate that starts every stream at
// version 0 (the default) then refuses every stream's next version as a gap,
// for ever. Use it with WithGateFirstSeen, or in tests; use the Postgres
// store (webhook/pgstore) for a receiver with several replicas or whose
// side effects outlive the process.
type MemoryOrderStore struct {
	mu      sync.Mutex
	records map[OrderKey]*memoryOrderRecord
}

type memoryOrderRecord struct {
	pos    OrderPosition
	locked bool
}

// NewMemoryOrderStore returns an empty MemoryOrderStore.
func NewMemoryOrderStore() *MemoryOrderStore {
	return &MemoryOrderStore{records: map[OrderKey]*memoryOrderRecord{}}
}

// Lock implements OrderStore.
func (m *MemoryOrderStore) Lock(ctx context.Context, key OrderKey) (OrderPosition, OrderLock, error) {
	if err := ctx.Err(); err != nil {
		return OrderPosition{}, nil, fmt.Errorf("lock %s: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok {
		rec = &memoryOrderRecord{pos: Unprocessed}
		m.records[key] = rec
	}
	if rec.locked {
		return rec.pos, nil, nil
	}
	rec.locked = true
	return rec.pos, &memoryOrderLock{m: m, key: key, rec: rec, from: rec.pos}, nil
}

// Position implements OrderStore.
func (m *MemoryOrderStore) Position(ctx context.Context, key OrderKey) (OrderPosition, error) {
	if err := ctx.Err(); err != nil {
		return OrderPosition{}, fmt.Errorf("read %s: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec, ok := m.records[key]; ok {
		return rec.pos, nil
	}
	return Unprocessed, nil
}

// Len returns the number of streams held, those locked but never advanced
// included.
func (m *MemoryOrderStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.records)
}

type memoryOrderLock struct {
	m     *MemoryOrderStore
	key   OrderKey
	rec   *memoryOrderRecord
	from  OrderPosition
	ended bool // guarded by m.mu
}

func (l *memoryOrderLock) Advance(ctx context.Context, pos OrderPosition) error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.ended {
		return fmt.Errorf("advance %s: %w: the lock has ended", l.key, ErrOrderAdvance)
	}
	l.ended = true
	l.rec.locked = false
	if err := CheckOrderAdvance(l.key, l.from, pos); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("advance %s: %w", l.key, err)
	}
	l.rec.pos = pos
	return nil
}

func (l *memoryOrderLock) Release(context.Context) error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if !l.ended {
		l.ended = true
		l.rec.locked = false
	}
	return nil
}

// CheckOrderAdvance returns an error wrapping ErrOrderAdvance unless moving
// key from the position from to to is a step forward: a higher version, an
// epoch not lower. Stores call it in Advance.
func CheckOrderAdvance(key OrderKey, from, to OrderPosition) error {
	switch {
	case to.Version <= from.Version:
		return fmt.Errorf("advance %s: %w: version %d is not above %d", key, ErrOrderAdvance, to.Version, from.Version)
	case to.Epoch < from.Epoch:
		return fmt.Errorf("advance %s: %w: epoch %d is below %d", key, ErrOrderAdvance, to.Epoch, from.Epoch)
	}
	return nil
}

// SkipVersion records version of key as processed without processing it,
// for an operator whose sender comes before the version chain: that sender
// dead-lettered the version and it was skipped (consumer dlq skip, or
// on_dead_letter skip), so the gate, holding the sender to last+1, would
// refuse every later version of the stream as a gap for ever. A sender of
// the chain needs none of this: the stream's next event names the skipped
// version's own predecessor. version must
// be the stream's next expected one (0 for a stream never processed); the
// epoch and partition stay as they are. Errors: a stream being processed
// right now, or a version that is not the next (both wrap
// ErrOrderAdvance), a store failure.
func SkipVersion(ctx context.Context, store OrderStore, key OrderKey, version int64) error {
	pos, lock, err := store.Lock(ctx, key)
	if err != nil {
		return fmt.Errorf("skip version %d: %w", version, err)
	}
	if lock == nil {
		return fmt.Errorf("skip version %d of %s: %w: a request of the stream is being processed; try again", version, key, ErrOrderAdvance)
	}
	if version != pos.Version+1 {
		_ = lock.Release(ctx)
		return fmt.Errorf("skip version %d of %s: %w: the next expected version is %d", version, key, ErrOrderAdvance, pos.Version+1)
	}
	return lock.Advance(ctx, OrderPosition{Version: version, Epoch: pos.Epoch, Partition: pos.Partition})
}
