// Package unpark is the operator's requests on the parked streams of
// the shared engine (`consumer dlq replay` and `skip`,
// docs/design/next-engine.md section 3): a Request written under Key in
// the positions bucket (Write), and the replica's one watch of them
// (Watch, Requests), which the fan-out of the stream's partition applies
// and deletes. It knows nothing of partitions or records: the fan-out
// (internal/deliver/fanout) does the applying.
package unpark

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/nats-io/nats.go/jetstream"
)

// Request is an operator's request on a parked stream of an ordered
// subscription (`consumer dlq replay` or `skip`, docs/design/next-engine.md
// section 3): the command POSTed the parked head itself (replay) or not
// (skip), then writes this under Key in the positions bucket; the
// owner of the stream's partition applies it (the head counts as
// settled, and the stream's later events are read again from the head's
// successor, then it rejoins the shared read) and deletes it. Only the
// owner writes the partition's record.
type Request struct {
	// Head is the events stream sequence of the parked head (the aside's
	// From, as `consumer dlq list` shows it). A request naming another
	// head (the stream parked again since, or a stale request) is
	// deleted unapplied. Required.
	Head uint64 `json:"head"`
	// Previous is the version the stream's next event names as its
	// predecessor (the version chain): the head's version after a replay
	// delivered it, the head's own predecessor after a skip (from the
	// dead letter's headers), -1 for none (the version chain's
	// deadletter.NoPrevious).
	Previous int64 `json:"previous"`
	// Op says which command wrote it ("replay", "skip"), for the logs.
	Op string `json:"op,omitempty"`
}

// keyPrefix starts every Key.
const keyPrefix = "op."

// Key is the positions bucket key of an operator's request on
// subscription sub's stream (a wire.StreamKey): "op.<sub>.<hex of the
// stream key>" (the design's op.<sub>.<stream>; an escaped stream token
// may hold '%', which a key may not, so the key is spelled in hex as the
// park bucket's aside keys are).
func Key(sub, stream string) string {
	return keyPrefix + sub + "." + hex.EncodeToString([]byte(stream))
}

// parseKey is Key's inverse.
func parseKey(key string) (sub, stream string, ok bool) {
	rest, found := strings.CutPrefix(key, keyPrefix)
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

// ErrInvalid is wrapped by Write for a request it refuses;
// the message names the field and the value.
var ErrInvalid = errors.New("invalid operator's request")

// Write writes request r for subscription sub's parked stream
// (a wire.StreamKey, as the aside names it) to the positions bucket kv,
// replacing one written before for the same stream. Errors wrap
// ErrInvalid (an empty sub or stream, Head 0, Previous below
// -1, none), or are the bucket's.
func Write(ctx context.Context, kv jetstream.KeyValue, sub, stream string, r Request) error {
	switch {
	case sub == "" || strings.ContainsAny(sub, ".*> \t\r\n"):
		return fmt.Errorf("%w: subscription %q: want [A-Za-z0-9_-]+", ErrInvalid, sub)
	case stream == "":
		return fmt.Errorf("%w: stream is empty", ErrInvalid)
	case r.Head == 0:
		return fmt.Errorf("%w: %s %s: Head is 0", ErrInvalid, sub, stream)
	case r.Previous < -1:
		return fmt.Errorf("%w: %s %s: Previous %d is below -1 (none)", ErrInvalid, sub, stream, r.Previous)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, Key(sub, stream), b); err != nil {
		return fmt.Errorf("unpark: write the request %s: %w", Key(sub, stream), err)
	}
	return nil
}

// Pending is a Request read from the bucket, with its key and
// revision: what Requests.Delete deletes.
type Pending struct {
	Request
	// Key is its key (Key), Rev the revision read.
	Key string
	Rev uint64
}

// Requests is the replica's view of the operator's requests in the
// positions bucket: one watch of op.> for every partition the replica
// owns (not one per partition: the key names no partition, and a watch
// is a consumer on the server), kept in memory; each Partition given it
// (fanout.Config.Requests) applies those of its parked streams in
// CatchUp and deletes them. Make one with New; a lifecycle.Part;
// safe for concurrent use.
type Requests struct {
	lifecycle.Base

	kv      jetstream.KeyValue
	changed func()
	w       jetstream.KeyWatcher // the watch open returned to run
	mu      sync.Mutex
	pending map[[2]string]Pending // by (subscription, stream)
}

// New returns the Requests of the positions bucket kv, not watched
// yet (Start). changed, when set, is called (from the watch's
// goroutine) after each new request: the replica's dispatch loop wakes
// up to run CatchUp.
func New(kv jetstream.KeyValue, changed func()) *Requests {
	return &Requests{kv: kv, changed: changed, pending: map[[2]string]Pending{}}
}

// Start watches the requests, returns once the ones already written are
// read (bounded by ctx), and follows the new ones in the background
// until Stop (lifecycle.Part). Errors: the watch's, or ctx's.
func (rq *Requests) Start(ctx context.Context) error {
	return rq.Base.Start(ctx, rq.open, rq.run)
}

// open starts the watch and applies the requests already written.
func (rq *Requests) open(ctx context.Context) error {
	w, err := rq.kv.Watch(context.WithoutCancel(ctx), keyPrefix+">")
	if err != nil {
		return fmt.Errorf("unpark: watch the requests of bucket %s: %w", rq.kv.Bucket(), err)
	}
	for {
		select {
		case e, open := <-w.Updates():
			switch {
			case !open:
				return fmt.Errorf("unpark: the watch of bucket %s ended", rq.kv.Bucket())
			case e == nil: // the requests already written are read
				rq.w = w
				return nil
			}
			rq.apply(e)
		case <-ctx.Done():
			_ = w.Stop()
			return ctx.Err()
		}
	}
}

// run applies the new requests until ctx ends or the watch does.
func (rq *Requests) run(ctx context.Context) error {
	w := rq.w
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, open := <-w.Updates():
			if !open {
				return nil
			}
			if e != nil {
				rq.apply(e)
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// apply applies one entry of the watch.
func (rq *Requests) apply(e jetstream.KeyValueEntry) {
	sub, stream, ok := parseKey(e.Key())
	if !ok {
		return
	}
	k := [2]string{sub, stream}
	var u Request
	put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &u) == nil && u.Head > 0
	rq.mu.Lock()
	if put {
		rq.pending[k] = Pending{Request: u, Key: e.Key(), Rev: e.Revision()}
	} else if r, ok := rq.pending[k]; ok && r.Rev <= e.Revision() {
		delete(rq.pending, k)
	}
	rq.mu.Unlock()
	if put && rq.changed != nil {
		rq.changed()
	}
}

// Get returns the pending request for subscription sub's stream (a
// wire.StreamKey).
func (rq *Requests) Get(sub, stream string) (Pending, bool) {
	rq.mu.Lock()
	defer rq.mu.Unlock()
	r, ok := rq.pending[[2]string{sub, stream}]
	return r, ok
}

// Delete deletes r from the bucket unless it was written again since.
// Errors are the bucket's (a revision moved included).
func (rq *Requests) Delete(ctx context.Context, r Pending) error {
	if err := rq.kv.Delete(ctx, r.Key, jetstream.LastRevision(r.Rev)); err != nil {
		return fmt.Errorf("unpark: delete the request %s: %w", r.Key, err)
	}
	sub, stream, _ := parseKey(r.Key)
	rq.mu.Lock()
	if p, ok := rq.pending[[2]string{sub, stream}]; ok && p.Rev == r.Rev {
		delete(rq.pending, [2]string{sub, stream})
	}
	rq.mu.Unlock()
	return nil
}
