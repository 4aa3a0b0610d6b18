package fanout

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Unpark is an operator's request on a parked stream of an ordered
// subscription (`consumer dlq replay` or `skip`, docs/design/next-engine.md
// section 3): the command POSTed the parked head itself (replay) or not
// (skip), then writes this under OpKey in the positions bucket; the
// owner of the stream's partition applies it (the head counts as
// settled, and the stream's later events are read again from the head's
// successor, then it rejoins the shared read) and deletes it. Only the
// owner writes the partition's record.
type Unpark struct {
	// Head is the events stream sequence of the parked head (the aside's
	// From, as `consumer dlq list` shows it). A request naming another
	// head (the stream parked again since, or a stale request) is
	// deleted unapplied. Required.
	Head uint64 `json:"head"`
	// Previous is the version the stream's next event names as its
	// predecessor (the version chain): the head's version after a replay
	// delivered it, the head's own predecessor after a skip (from the
	// dead letter's headers), NoPrevious for none.
	Previous int64 `json:"previous"`
	// Op says which command wrote it ("replay", "skip"), for the logs.
	Op string `json:"op,omitempty"`
}

// opKeyPrefix starts every OpKey.
const opKeyPrefix = "op."

// OpKey is the positions bucket key of an operator's request on
// subscription sub's stream (a wire.StreamKey): "op.<sub>.<hex of the
// stream key>" (the design's op.<sub>.<stream>; an escaped stream token
// may hold '%', which a key may not, so the key is spelled in hex as the
// park bucket's aside keys are).
func OpKey(sub, stream string) string {
	return opKeyPrefix + sub + "." + hex.EncodeToString([]byte(stream))
}

// parseOpKey is OpKey's inverse.
func parseOpKey(key string) (sub, stream string, ok bool) {
	rest, found := strings.CutPrefix(key, opKeyPrefix)
	if !found {
		return "", "", false
	}
	sub, h, found := strings.Cut(rest, ".")
	b, err := hex.DecodeString(h)
	if !found || sub == "" || err != nil || len(b) == 0 {
		return "", "", false
	}
	return sub, string(b), true
}

// ErrInvalidRequest is wrapped by RequestUnpark for a request it refuses;
// the message names the field and the value.
var ErrInvalidRequest = errors.New("invalid operator's request")

// RequestUnpark writes request r for subscription sub's parked stream
// (a wire.StreamKey, as the aside names it) to the positions bucket kv,
// replacing one written before for the same stream. Errors wrap
// ErrInvalidRequest (an empty sub or stream, Head 0, Previous below
// NoPrevious), or are the bucket's.
func RequestUnpark(ctx context.Context, kv jetstream.KeyValue, sub, stream string, r Unpark) error {
	switch {
	case sub == "" || strings.ContainsAny(sub, ".*> \t\r\n"):
		return fmt.Errorf("%w: subscription %q: want [A-Za-z0-9_-]+", ErrInvalidRequest, sub)
	case stream == "":
		return fmt.Errorf("%w: stream is empty", ErrInvalidRequest)
	case r.Head == 0:
		return fmt.Errorf("%w: %s %s: Head is 0", ErrInvalidRequest, sub, stream)
	case r.Previous < NoPrevious:
		return fmt.Errorf("%w: %s %s: Previous %d is below %d (none)", ErrInvalidRequest, sub, stream, r.Previous, NoPrevious)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, OpKey(sub, stream), b); err != nil {
		return fmt.Errorf("fanout: write the request %s: %w", OpKey(sub, stream), err)
	}
	return nil
}

// request is a pending Unpark with its key and revision.
type request struct {
	Unpark
	key string
	rev uint64
}

// Requests is the replica's view of the operator's requests in the
// positions bucket: one watch of op.> for every partition the replica
// owns (not one per partition: the key names no partition, and a watch
// is a consumer on the server), kept in memory; each Partition given it
// (Config.Requests) applies those of its parked streams in CatchUp and
// deletes them. Make one with WatchRequests; safe for concurrent use.
type Requests struct {
	kv      jetstream.KeyValue
	w       jetstream.KeyWatcher
	changed func()
	mu      sync.Mutex
	pending map[[2]string]request // by (subscription, stream)
	done    chan struct{}
}

// WatchRequests watches the operator's requests of the positions bucket
// kv, and returns once the ones already written are read. changed, when
// set, is called (from the watch's goroutine) after each new request:
// the replica's dispatch loop wakes up to run CatchUp. Stop ends it.
func WatchRequests(ctx context.Context, kv jetstream.KeyValue, changed func()) (*Requests, error) {
	w, err := kv.Watch(context.WithoutCancel(ctx), opKeyPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("fanout: watch the requests of bucket %s: %w", kv.Bucket(), err)
	}
	rq := &Requests{kv: kv, w: w, changed: changed, pending: map[[2]string]request{}, done: make(chan struct{})}
	ready := make(chan struct{})
	go rq.run(ready)
	select {
	case <-ready:
		return rq, nil
	case <-ctx.Done():
		rq.Stop()
		return nil, ctx.Err()
	}
}

func (rq *Requests) run(ready chan struct{}) {
	defer close(rq.done)
	for e := range rq.w.Updates() {
		if e == nil {
			close(ready)
			continue
		}
		sub, stream, ok := parseOpKey(e.Key())
		if !ok {
			continue
		}
		k := [2]string{sub, stream}
		var u Unpark
		put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &u) == nil && u.Head > 0
		rq.mu.Lock()
		if put {
			rq.pending[k] = request{Unpark: u, key: e.Key(), rev: e.Revision()}
		} else if r, ok := rq.pending[k]; ok && r.rev <= e.Revision() {
			delete(rq.pending, k)
		}
		rq.mu.Unlock()
		if put && rq.changed != nil {
			rq.changed()
		}
	}
}

// Stop ends the watch.
func (rq *Requests) Stop() {
	_ = rq.w.Stop()
	<-rq.done
}

// get returns the pending request for sub's stream.
func (rq *Requests) get(sub, stream string) (request, bool) {
	rq.mu.Lock()
	defer rq.mu.Unlock()
	r, ok := rq.pending[[2]string{sub, stream}]
	return r, ok
}

// delete deletes r from the bucket unless it was written again since.
func (rq *Requests) delete(ctx context.Context, r request) error {
	if err := rq.kv.Delete(ctx, r.key, jetstream.LastRevision(r.rev)); err != nil {
		return fmt.Errorf("fanout: delete the request %s: %w", r.key, err)
	}
	sub, stream, _ := parseOpKey(r.key)
	rq.mu.Lock()
	if p, ok := rq.pending[[2]string{sub, stream}]; ok && p.rev == r.rev {
		delete(rq.pending, [2]string{sub, stream})
	}
	rq.mu.Unlock()
	return nil
}
