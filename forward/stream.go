// One stream's run of events: reconcile when the position is not known,
// then publish as fast batches where JetStream allows them, else one event
// at a time, stopping at the first failure so the stream's order holds.

package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
)

// batchRecheck is how often the Forwarder looks again whether the
// JetStream stream allows fast batches (an operator may turn it on).
const batchRecheck = time.Minute

// publishStream publishes evs, all of stream and in version order, each
// only after the previous one is stored; it reconciles first when the
// position is not known (see Handle). With batch set, runs of events that
// cannot be duplicates (the stream continues where this Forwarder or
// JetStream left it) go out as fast batches when the JetStream stream
// allows them (see batch.go), else one at a time, each expecting the last
// message the previous one left (see Forwarder). It returns one Outcome per
// event.
//
// watermark is the version of the stream's last event known forwarded (-1:
// none, or not known): when reconciliation finds JetStream's last message
// of the stream below it, JetStream lost forwarded events and nothing is
// published (errLostInJetStream). When it finds no message of the stream
// at all, the JetStream stream's limits removed them (aged out) or they
// are gone otherwise; noteGone says which, and the events are published
// after the watermark: nothing of the stream is left for them to be out
// of order with.
func (f *Forwarder) publishStream(ctx context.Context, stream string, evs []event.Event, watermark int64, reconcile, batch bool) []Outcome {
	out := make([]Outcome, len(evs))
	pos, known := f.position(stream, evs[0].Version, reconcile)
	start := 0
	// fresh: no event from start on can be in JetStream already, so a
	// batch's count of handled messages is a count of stored ones.
	fresh := known
	if !known {
		began := time.Now()
		last, err := f.lastStored(ctx, stream)
		if err != nil {
			out[0] = f.failed(evs[0], err)
			f.cfg.Observer.Published(out[0], time.Since(began))
			for i := 1; i < len(evs); i++ {
				out[i] = notAttempted(evs[i], evs[0])
			}
			return out
		}
		pos.seq = last.seq
		if last.found && last.version >= 0 && last.version < watermark {
			err := drain.NonRetryable(fmt.Errorf("%w: stream %q: JetStream's last message of it is version %d (sequence %d), but versions up to %d were forwarded; restore them with `bridge verify --repair --stream %s`, then `bridge unblock %s`",
				errLostInJetStream, stream, last.version, last.seq, watermark, stream, stream))
			out[0] = f.failed(evs[0], err)
			f.cfg.Observer.Published(out[0], time.Since(began))
			for i := 1; i < len(evs); i++ {
				out[i] = notAttempted(evs[i], evs[0])
			}
			return out
		}
		if !last.found && watermark >= 0 && evs[0].Version > watermark {
			// Aged out by the stream's limits, or lost: said, not blocked.
			f.noteGone(ctx, stream, watermark)
		}
		if last.found && (reconcile || evs[0].Version > 0) {
			for start < len(evs) && evs[start].Version <= last.version {
				out[start] = Outcome{Status: AlreadyStored, Sequence: last.seq}
				start++
			}
			if start > 0 {
				f.log.Info("reconciled with JetStream: events already stored are not published again",
					"stream", stream, "event_id", evs[start-1].ID, "version", evs[start-1].Version, "events", start, "sequence", last.seq)
			}
		}
		fresh = !last.found || (last.version >= 0 && start < len(evs) && evs[start].Version > last.version)
	}
	if batch && fresh && len(evs)-start >= 2 {
		began := time.Now()
		ok, err := f.batching(ctx)
		if err != nil {
			// JetStream did not answer the lookup: the publish would fare
			// no better. Nothing was sent; what this Forwarder knows of
			// the stream still holds.
			out[start] = f.failed(evs[start], fmt.Errorf("publish event %d of stream %q: %w", evs[start].ID, stream, err))
			f.cfg.Observer.Published(out[start], time.Since(began))
			for i := start + 1; i < len(evs); i++ {
				out[i] = notAttempted(evs[i], evs[start])
			}
			return out
		}
		batch = ok
	} else {
		batch = false
	}
	for i := start; i < len(evs); {
		if batch {
			j := i
			for j < len(evs) && f.batchable(evs[j]) {
				j++
			}
			if j-i >= 2 {
				began := time.Now()
				r := f.publishBatch(ctx, stream, evs[i:j], pos.seq)
				if errors.Is(r.Err, errBatchRefused) {
					// Too many batches in flight: this one goes one at a
					// time. Not allowed at all: so do all, until the next
					// look at the stream's configuration.
					f.log.Debug("JetStream refused a fast batch; publishing one event at a time", "stream", stream, "error", r.Err)
					if errors.Is(r.Err, errBatchDisabled) {
						f.noBatching()
					}
					batch = false
					continue
				}
				took := time.Since(began)
				for k := range r.Done {
					out[i+k] = Outcome{Status: Stored}
					if k == r.Done-1 {
						out[i+k].Sequence = r.Sequence
					}
					f.cfg.Observer.Published(out[i+k], took)
				}
				if r.Err != nil {
					k := i + r.Done
					out[k] = f.failed(evs[k], r.Err)
					f.cfg.Observer.Published(out[k], took)
					f.forget(stream)
					for m := k + 1; m < len(evs); m++ {
						out[m] = notAttempted(evs[m], evs[k])
					}
					return out
				}
				f.log.Debug("events stored", "stream", stream, "event_id", evs[j-1].ID, "events", j-i, "sequence", r.Sequence)
				// 0 when all were duplicates after all: then the last
				// message on the stream's subjects is not known.
				pos.seq = r.Sequence
				i = j
				continue
			}
		}
		out[i] = f.publish(ctx, evs[i], stream, pos.seq)
		switch out[i].Status {
		case Stored:
			pos.seq = out[i].Sequence
		case Failed:
			// The outcome may be unknown (a timeout): look it up next time.
			f.forget(stream)
			for j := i + 1; j < len(evs); j++ {
				out[j] = notAttempted(evs[j], evs[i])
			}
			return out
		}
		// Duplicate: JetStream checked the expectation first, so the last
		// message is still pos.seq.
		i++
	}
	if pos.seq == 0 && start < len(evs) {
		// Nothing was stored (all duplicates): look the stream up next time.
		f.forget(stream)
		return out
	}
	pos.next = evs[len(evs)-1].Version + 1
	f.remember(stream, pos)
	return out
}

// batchable reports whether e can go in a fast batch: its data is JSON and
// its message well under the server's max payload (event.Event.DataJSON
// vouches for the JSON without a look). Others are published
// alone, which reports their failure exactly.
func (f *Forwarder) batchable(e event.Event) bool {
	const headroom = 4 << 10 // the headers, generously
	return e.Err == nil && int64(len(e.Data))+headroom <= f.js.Conn().MaxPayload() && (e.DataJSON || json.Valid(e.Data))
}

// batching reports whether the JetStream stream allows fast batches
// (allow_batched, nats-server 2.14+), looking it up at most once per
// batchRecheck. When JetStream does not answer the lookup (an outage, or
// the cycle's deadline cut it short) it returns a drain.UnavailableError
// and looks again next time; any other failure of the lookup (no
// permission for stream info, say) counts as "no fast batches" until the
// next look.
func (f *Forwarder) batching(ctx context.Context) (bool, error) {
	f.mu.Lock()
	ok, at := f.batchOK, f.batchCheckedAt
	f.mu.Unlock()
	if !at.IsZero() && time.Since(at) < batchRecheck {
		return ok, nil
	}
	ok = false
	lctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	s, err := f.jsStream(lctx, f.cfg.Prefix+".>")
	if err == nil {
		var info *jetstream.StreamInfo
		if info, err = s.Info(lctx); err == nil {
			ok = info.Config.AllowBatchPublish
		}
	}
	if err != nil {
		if err = classify(fmt.Errorf("look up whether JetStream stream allows fast batches: %w", err)); drain.IsUnavailable(err) {
			return false, err
		}
	}
	f.mu.Lock()
	f.batchOK, f.batchCheckedAt = ok, time.Now()
	f.mu.Unlock()
	return ok, nil
}

// noBatching stops fast batches until the next look (batchRecheck).
func (f *Forwarder) noBatching() {
	f.mu.Lock()
	f.batchOK, f.batchCheckedAt = false, time.Now()
	f.mu.Unlock()
}
