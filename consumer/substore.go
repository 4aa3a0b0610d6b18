package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subkv"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// Subscriptions managed at runtime: a JetStream key-value bucket holds one
// document per subscription (docs/subscriptions-kv.md, docs/wire.md);
// `consumer subscriptions ...` and a SubscriptionStore write it, and a
// Consumer given Config.SubscriptionStore watches it and applies every
// change while it runs.

// DefaultSubscriptionsBucket is the key-value bucket of the subscriptions
// managed at runtime.
const DefaultSubscriptionsBucket = wire.DefaultSubscriptionsBucket

// Errors of the SubscriptionStore, for errors.Is.
var (
	// ErrConflict: the subscription changed (or was created, or deleted)
	// since the revision the write was based on; the message names the
	// subscription and the revision. Read it again and redo the change.
	ErrConflict = subkv.ErrConflict
	// ErrSubscriptionNotFound: the bucket holds no subscription of that
	// name.
	ErrSubscriptionNotFound = subkv.ErrNotFound
	// ErrInvalidSecretsKey: ParseSecretsKeyring could not read a key.
	ErrInvalidSecretsKey = subkv.ErrInvalidKey
	// ErrUnknownSecretsKey: a subscription was sealed with a key id the
	// keyring does not hold (give this replica that key, after its
	// current one).
	ErrUnknownSecretsKey = subkv.ErrUnknownKey
	// ErrNoSecretsKey: a write needs a keyring to seal the secrets with.
	ErrNoSecretsKey = subkv.ErrNoKey
)

// SecretsKeyring holds the keys that seal and open the subscriptions'
// URLs, signing secrets and header values in the bucket (AES-256-GCM):
// the first key seals, every key opens, so a key is rotated by putting
// the new one first and keeping the old one after it until every
// subscription was written again (docs/subscriptions-kv.md).
type SecretsKeyring struct{ k *subkv.Keyring }

// ParseSecretsKeyring reads keys written one per line (or separated by
// commas) as "<id>:<base64 of 32 bytes>" (GenerateSecretsKey writes one);
// blank lines and "#" comments are skipped. An error wraps
// ErrInvalidSecretsKey and names the entry by position and id, never the
// key.
func ParseSecretsKeyring(text string) (*SecretsKeyring, error) {
	k, err := subkv.ParseKeyring(text)
	if err != nil {
		return nil, err
	}
	return &SecretsKeyring{k: k}, nil
}

// GenerateSecretsKey returns a new keyring line "<id>:<base64 of 32
// random bytes>"; id is [A-Za-z0-9_-]{1,64}.
func GenerateSecretsKey(id string) (string, error) { return subkv.GenerateKey(id) }

// Current returns the id of the key that seals.
func (k *SecretsKeyring) Current() string { return k.k.Current() }

func (k *SecretsKeyring) keyring() *subkv.Keyring {
	if k == nil {
		return nil
	}
	return k.k
}

// SubscriptionStoreConfig configures OpenSubscriptionStore.
type SubscriptionStoreConfig struct {
	// Bucket is the key-value bucket. Default DefaultSubscriptionsBucket.
	Bucket string
	// Replicas is the bucket's replica count when it is created (1 on a
	// standalone server, 3 on a cluster). Default 1.
	Replicas int
	// Keys seal and open the secrets. Default nil: reads are redacted
	// (StoredSubscription.Redacted) and only SetPaused and Delete write.
	Keys *SecretsKeyring
}

// SubscriptionStore reads and writes the subscriptions bucket. Every write
// is validated as Subscription.Validate validates (the bucket never holds
// an invalid subscription) and is compare-and-set on the key's revision.
// Its methods are safe for concurrent use.
type SubscriptionStore struct{ s *subkv.Store }

// StoredSubscription is a subscription as read from the bucket.
type StoredSubscription struct {
	Subscription
	// Paused subscriptions are not delivered; they keep their
	// position.
	Paused bool
	// Revision is the key's revision, for Update, Delete and SetPaused.
	Revision uint64
	// KeyID names the key that sealed the secrets.
	KeyID string
	// Created and Updated are when the subscription was added and last
	// written (the writer's clock).
	Created, Updated time.Time
	// Redacted is true when the store has no keyring: URL is the endpoint
	// without userinfo and query, Secrets is empty, Headers' values are "".
	Redacted bool
}

// OpenSubscriptionStore returns the store of cfg's bucket on js, creating
// the bucket when missing.
func OpenSubscriptionStore(ctx context.Context, js jetstream.JetStream, cfg SubscriptionStoreConfig) (*SubscriptionStore, error) {
	s, err := subkv.Open(ctx, js, subkv.Config{Bucket: cfg.Bucket, Replicas: cfg.Replicas, Keys: cfg.Keys.keyring()})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	return &SubscriptionStore{s: s}, nil
}

// Bucket returns the bucket's name.
func (s *SubscriptionStore) Bucket() string { return s.s.Bucket() }

// WithKeys returns a store on the same bucket with keys k (nil: redacted).
func (s *SubscriptionStore) WithKeys(k *SecretsKeyring) *SubscriptionStore {
	return &SubscriptionStore{s: s.s.WithKeys(k.keyring())}
}

// Create adds sub, paused or not, and returns its revision. It fails with
// an error wrapping ErrInvalidConfig (naming the field and the value) for
// an invalid sub, ErrConflict when one of that name exists, ErrNoSecretsKey
// without a keyring.
func (s *SubscriptionStore) Create(ctx context.Context, sub Subscription, paused bool) (uint64, error) {
	if err := sub.Validate(); err != nil {
		return 0, err
	}
	return s.s.Create(ctx, sub.engine(), paused)
}

// Update replaces the subscription sub.Name read at revision rev with
// sub, paused or not, and returns the new revision: ErrConflict when it
// changed since rev (another operator's write won), ErrSubscriptionNotFound
// when it does not exist, ErrInvalidConfig for an invalid sub.
func (s *SubscriptionStore) Update(ctx context.Context, sub Subscription, paused bool, rev uint64) (uint64, error) {
	if err := sub.Validate(); err != nil {
		return 0, err
	}
	return s.s.Update(ctx, sub.engine(), paused, rev)
}

// SetPaused pauses or resumes the subscription name read at revision rev
// (0: whatever its revision); no keyring is needed.
func (s *SubscriptionStore) SetPaused(ctx context.Context, name string, paused bool, rev uint64) (uint64, error) {
	return s.s.SetPaused(ctx, name, paused, rev)
}

// Delete deletes the subscription name read at revision rev (0: whatever
// its revision). The running replicas stop it and delete its
// position.
func (s *SubscriptionStore) Delete(ctx context.Context, name string, rev uint64) error {
	return s.s.Delete(ctx, name, rev)
}

// Get reads the subscription name.
func (s *SubscriptionStore) Get(ctx context.Context, name string) (StoredSubscription, error) {
	e, err := s.s.Get(ctx, name)
	if err != nil {
		return StoredSubscription{}, err
	}
	return stored(e), nil
}

// List reads every subscription, sorted by name.
func (s *SubscriptionStore) List(ctx context.Context) ([]StoredSubscription, error) {
	es, err := s.s.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]StoredSubscription, len(es))
	for i, e := range es {
		out[i] = stored(e)
	}
	return out, nil
}

func stored(e subkv.Entry) StoredSubscription {
	return StoredSubscription{
		Subscription: subscriptionFromEngine(e.Subscription), Paused: e.Paused, Revision: e.Revision, KeyID: e.Document.Sealed.KeyID,
		Created: e.Document.Created, Updated: e.Document.Updated, Redacted: e.Redacted,
	}
}

// subscriptionFromEngine converts the engine's subscription into s's.
func subscriptionFromEngine(s subscription.Subscription) Subscription {
	return Subscription{
		Name: s.Name, FilterSubjects: s.FilterSubjects, URL: s.URL, Scheme: s.Scheme, Secrets: s.Secrets,
		Body: BodyMode(s.Body), Headers: s.Headers, Timeout: s.Timeout, AckWait: s.AckWait,
		MaxDeliver: s.MaxDeliver, BackOff: s.BackOff, MaxInFlight: s.MaxInFlight, MaxAckPending: s.MaxAckPending,
		RateLimit:    s.RateLimit,
		AllowPrivate: s.AllowPrivate, AllowHTTP: s.AllowHTTP,
		TLS:      TLSFiles{ClientCertFile: s.TLS.ClientCertFile, ClientKeyFile: s.TLS.ClientKeyFile, CAFile: s.TLS.CAFile},
		Ordering: Ordering(s.Ordering), OnDeadLetter: DeadLetterPolicy(s.OnDeadLetter),
		Start: s.Start,
	}
}
