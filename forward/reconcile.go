// What a Forwarder knows of each stream's position in JetStream, and
// reconciliation: looking up the last message JetStream holds for a stream
// when that position is not known (a takeover, a retry, a restart).

package forward

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// maxPositions bounds Forwarder.positions: about 100 bytes each.
const maxPositions = 100_000

// position is where a stream stands in JetStream as this Forwarder last
// saw it.
type position struct {
	seq  uint64 // JetStream sequence of the last message on the stream's subjects; 0: none
	next int64  // version of the event expected next
}

// stored is what reconciliation found for a stream in JetStream.
type stored struct {
	found   bool
	seq     uint64 // sequence of the stream's last message
	version int64  // its ce-streamversion; -1 when absent or unreadable
}

// position returns what this Forwarder knows of stream when it is usable:
// not reconciling, and the stream left off just before version.
func (f *Forwarder) position(stream string, version int64, reconcile bool) (position, bool) {
	if reconcile {
		return position{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.positions[stream]
	if !ok || p.next != version {
		return position{}, false
	}
	return p, true
}

// remember records p as stream's position, making room by dropping an
// arbitrary stream when maxPositions are known (it is looked up again when
// next needed).
func (f *Forwarder) remember(stream string, p position) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.positions[stream]; !ok && len(f.positions) >= maxPositions {
		for k := range f.positions { // an arbitrary one
			delete(f.positions, k)
			break
		}
	}
	f.positions[stream] = p
}

// forget drops stream's position: its next batch reconciles first. Called
// whenever an outcome may be unknown (a failed publish, a batch of
// duplicates only).
func (f *Forwarder) forget(stream string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.positions, stream)
}

// lastStored looks up the last message JetStream holds on stream's
// subjects.
func (f *Forwarder) lastStored(ctx context.Context, stream string) (stored, error) {
	filter := wire.StreamFilter(f.cfg.Prefix, stream)
	lctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	s, err := f.jsStream(lctx, filter)
	if err != nil {
		return stored{}, classify(fmt.Errorf("reconcile stream %q: find the JetStream stream of %s: %w", stream, filter, err))
	}
	// From the leader, never a direct get: with AllowDirect on (the
	// consumer's cursors read EVENTS by direct gets) nats.go's
	// GetLastMsgForSubject asks any replica, and a follower lacking the
	// newest messages would answer an older last message: an event below
	// the watermark, taken for a loss (errLostInJetStream).
	m, found, err := jsapi.LeaderGet(lctx, f.js, s.CachedInfo().Config.Name, jsapi.GetRequest{LastFor: filter})
	switch {
	case err == nil && !found:
		return stored{version: -1}, nil
	case err != nil:
		f.mu.Lock()
		f.stream = nil // it may have been deleted and created again
		f.mu.Unlock()
		return stored{}, classify(fmt.Errorf("reconcile stream %q: last message on %s: %w", stream, filter, err))
	}
	v, perr := strconv.ParseInt(m.Header.Get(wire.HeaderStreamVersion), 10, 64)
	if perr != nil {
		f.log.Warn("last message of the stream in JetStream has no readable "+wire.HeaderStreamVersion+"; nothing is skipped",
			"stream", stream, "sequence", m.Seq, "subject", m.Subject)
		v = -1
	}
	return stored{found: true, seq: m.Seq, version: v}, nil
}

// jsStream returns the JetStream stream handle for lookups: Config.Stream,
// or the stream holding subject.
func (f *Forwarder) jsStream(ctx context.Context, subject string) (jetstream.Stream, error) {
	f.mu.Lock()
	s := f.stream
	f.mu.Unlock()
	if s != nil {
		return s, nil
	}
	name := f.cfg.Stream
	if name == "" {
		var err error
		if name, err = f.js.StreamNameBySubject(ctx, subject); err != nil {
			return nil, err
		}
	}
	s, err := f.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.stream = s
	f.mu.Unlock()
	return s, nil
}
