package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/wire"
)

// breakerStore keeps the shared circuit breaker states in the health
// bucket, one key per endpoint (wire.BreakerKey), JSON values, the key's
// revision for compare-and-swap. The replicas watch the keys (State.follow)
// and hand each change to their breaker.Set.
type breakerStore struct {
	h *State
}

// BreakerStore returns the store of the shared breaker states in the
// health bucket, for breaker.Set.Share: until Load or Start opened the
// bucket, its calls fail and the breakers go by their local state.
func (h *State) BreakerStore() breaker.Store {
	return breakerStore{h: h}
}

// errHealthNotOpen is returned while the health bucket is not open yet:
// the breakers go by their local state meanwhile.
var errHealthNotOpen = errors.New("endpoint health bucket not open yet")

// Load implements breaker.Store.
func (s breakerStore) Load(ctx context.Context, endpoint string) (breaker.SharedState, uint64, error) {
	kv := s.h.bucket()
	if kv == nil {
		return breaker.SharedState{}, 0, errHealthNotOpen
	}
	e, err := kv.Get(ctx, wire.BreakerKey(endpoint))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return breaker.SharedState{Endpoint: endpoint}, 0, nil
	}
	if err != nil {
		return breaker.SharedState{}, 0, err
	}
	st, err := decodeBreakerState(e.Value())
	if err != nil {
		return breaker.SharedState{}, 0, err
	}
	return st, e.Revision(), nil
}

// Swap implements breaker.Store.
func (s breakerStore) Swap(ctx context.Context, st breaker.SharedState, rev uint64) (uint64, error) {
	kv := s.h.bucket()
	if kv == nil {
		return 0, errHealthNotOpen
	}
	data, err := json.Marshal(st)
	if err != nil {
		return 0, err
	}
	key := wire.BreakerKey(st.Endpoint)
	var n uint64
	if rev == 0 {
		n, err = kv.Create(ctx, key, data)
	} else {
		n, err = kv.Update(ctx, key, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("%w: %w", breaker.ErrConflict, err)
	}
	return n, err
}

// decodeBreakerState reads a breaker key's value.
func decodeBreakerState(v []byte) (breaker.SharedState, error) {
	var st breaker.SharedState
	if err := json.Unmarshal(v, &st); err != nil {
		return st, fmt.Errorf("shared breaker state: %w", err)
	}
	return st, nil
}
