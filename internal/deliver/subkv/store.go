// Package subkv keeps the subscriptions managed at runtime in a JetStream
// key-value bucket: one key per subscription (its name), a versioned JSON
// document as value (document.go), the URL, secrets and header values
// sealed (seal.go). Writes are compare-and-set on the key's revision, so
// two operators editing at once never overwrite each other: one wins, the
// other gets ErrConflict. Every write is validated by the engine's
// Subscription.Validate first: the bucket never holds an invalid
// subscription. The consumer package is its front door.
package subkv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrConflict is wrapped by Create when the subscription exists already and
// by Update, Delete and SetPaused when it changed (or was deleted) since
// the revision given: re-read it and apply the change again.
var ErrConflict = errors.New("subscription changed concurrently")

// ErrNotFound is wrapped by Get, Update, Delete and SetPaused when the
// bucket has no subscription of that name.
var ErrNotFound = errors.New("subscription not found")

// Config configures a Store.
type Config struct {
	// Bucket is the key-value bucket. Default wire.DefaultSubscriptionsBucket.
	Bucket string
	// Replicas is the bucket's replica count when it is created. Default 1.
	Replicas int
	// Keys seal and open the secrets. Nil: reads are redacted (no URL
	// beyond Endpoint, no secrets, no header values) and writes fail with
	// ErrNoKey.
	Keys *Keyring
	// Archetype is the engine's; its clock's time is written in created
	// and updated. Default base.Default (the real clock).
	*base.Archetype
}

// Store reads and writes the subscriptions bucket.
type Store struct {
	kv   jetstream.KeyValue
	keys *Keyring
	now  func() time.Time // the archetype's clock's Now
}

// Entry is one subscription as read from the bucket.
type Entry struct {
	Subscription subscription.Subscription
	Paused       bool
	// Revision is the key's revision: give it back to Update, Delete or
	// SetPaused.
	Revision uint64
	// Document is the stored document (no secret in it in clear).
	Document Document
	// Redacted is true when the store has no keys: Subscription has no
	// secrets, header values or full URL.
	Redacted bool
}

// Open returns the store of cfg's bucket, creating the bucket when missing.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	cfg.Bucket = cmp.Or(cfg.Bucket, wire.DefaultSubscriptionsBucket)
	cfg.Archetype = base.Default(cfg.Archetype)
	kv, err := jsapi.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: cfg.Bucket, Description: "jsbridge webhook subscriptions managed at runtime (consumer subscriptions)",
		Storage: jetstream.FileStorage, Replicas: max(cfg.Replicas, 1), History: 8,
	})
	if err != nil {
		return nil, fmt.Errorf("subscriptions bucket %q: %w", cfg.Bucket, err)
	}
	return &Store{kv: kv, keys: cfg.Keys, now: cfg.Clock.Now}, nil
}

// Bucket returns the bucket's name.
func (s *Store) Bucket() string { return s.kv.Bucket() }

// Create stores sub (validated first) as a new subscription, paused or
// not; ErrConflict when one of that name exists.
func (s *Store) Create(ctx context.Context, sub subscription.Subscription, paused bool) (uint64, error) {
	if err := sub.Validate(); err != nil {
		return 0, err
	}
	if s.keys == nil {
		return 0, fmt.Errorf("create subscription %q: %w", sub.Name, ErrNoKey)
	}
	now := s.now()
	d, err := encode(sub, paused, s.keys, now, now)
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	rev, err := s.kv.Create(ctx, sub.Name, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("create subscription %q: %w: it exists already (update it, or delete it first)", sub.Name, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("create subscription %q in bucket %q: %w", sub.Name, s.Bucket(), err)
	}
	return rev, nil
}

// Update replaces the subscription sub.Name, read at revision rev, with
// sub (validated first), paused or not; ErrConflict when it changed since
// rev, ErrNotFound when it does not exist.
func (s *Store) Update(ctx context.Context, sub subscription.Subscription, paused bool, rev uint64) (uint64, error) {
	if err := sub.Validate(); err != nil {
		return 0, err
	}
	if s.keys == nil {
		return 0, fmt.Errorf("update subscription %q: %w", sub.Name, ErrNoKey)
	}
	old, _, err := s.raw(ctx, sub.Name)
	if err != nil {
		return 0, err
	}
	d, err := encode(sub, paused, s.keys, old.Created, s.now())
	if err != nil {
		return 0, err
	}
	return s.put(ctx, d, rev)
}

// SetPaused sets the paused flag of the subscription name, read at
// revision rev (0: the current one, read here); the sealed part is kept
// as it is, so no key is needed.
func (s *Store) SetPaused(ctx context.Context, name string, paused bool, rev uint64) (uint64, error) {
	d, cur, err := s.raw(ctx, name)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		rev = cur
	}
	d.Paused, d.Updated = paused, s.now().UTC()
	return s.put(ctx, d, rev)
}

// put writes d at revision rev (compare-and-set).
func (s *Store) put(ctx context.Context, d Document, rev uint64) (uint64, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	n, err := s.kv.Update(ctx, d.Name, b, rev)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("update subscription %q at revision %d: %w: it was changed or deleted since; read it again", d.Name, rev, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("update subscription %q in bucket %q: %w", d.Name, s.Bucket(), err)
	}
	return n, nil
}

// read reads the key of subscription name; ErrNotFound (wrapped) when
// there is none.
func (s *Store) read(ctx context.Context, name string) (jetstream.KeyValueEntry, error) {
	e, err := s.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("subscription %q: %w in bucket %q", name, ErrNotFound, s.Bucket())
	}
	if err != nil {
		return nil, fmt.Errorf("read subscription %q: %w", name, err)
	}
	return e, nil
}

// raw reads the document of name and its revision.
func (s *Store) raw(ctx context.Context, name string) (Document, uint64, error) {
	e, err := s.read(ctx, name)
	if err != nil {
		return Document{}, 0, err
	}
	var d Document
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return Document{}, 0, fmt.Errorf("subscription %q: document: %w", name, err)
	}
	return d, e.Revision(), nil
}

// Get reads the subscription name (redacted without keys).
func (s *Store) Get(ctx context.Context, name string) (Entry, error) {
	e, err := s.read(ctx, name)
	if err != nil {
		return Entry{}, err
	}
	return s.entry(e.Value(), e.Revision())
}

// entry decodes a stored value.
func (s *Store) entry(value []byte, rev uint64) (Entry, error) {
	var d Document
	if err := json.Unmarshal(value, &d); err != nil {
		return Entry{}, fmt.Errorf("subscriptions bucket: revision %d: document: %w", rev, err)
	}
	sub, err := d.decode(s.keys)
	if err != nil {
		return Entry{}, err
	}
	return Entry{Subscription: sub, Paused: d.Paused, Revision: rev, Document: d, Redacted: s.keys == nil}, nil
}

// List reads every subscription, sorted by name. A document that cannot
// be read fails the whole list, naming it.
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	keys, err := jsapi.Keys(ctx, s.kv)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: %w", err)
	}
	out := make([]Entry, 0, len(keys))
	for _, n := range keys {
		if !isSubscriptionKey(n) {
			continue
		}
		e, err := s.Get(ctx, n)
		if errors.Is(err, ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Delete deletes the subscription name, read at revision rev (0: whatever
// its revision); ErrConflict when it changed since rev, ErrNotFound when
// it does not exist.
func (s *Store) Delete(ctx context.Context, name string, rev uint64) error {
	if _, err := s.read(ctx, name); err != nil {
		return err
	}
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := s.kv.Delete(ctx, name, opts...)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("delete subscription %q at revision %d: %w: it was changed since; read it again", name, rev, ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("delete subscription %q in bucket %q: %w", name, s.Bucket(), err)
	}
	return nil
}

// WithKeys returns a store on the same bucket with keys k (nil: redacted
// reads, no writes but SetPaused and Delete).
func (s *Store) WithKeys(k *Keyring) *Store {
	c := *s
	c.keys = k
	return &c
}
