// Sending ahead: a cycle's streams whose position in JetStream this
// Forwarder knows are all sent before any answer is waited for, from one
// goroutine, and their answers are then waited for together.

package forward

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/wire"
)

// At the rates people run a drain cycle carries a few events over as
// many streams, one event each. Published as publishStream does, every
// stream took a goroutine, a timer, nats.go's async publish (a future,
// its channels and a PubAck decoded by reflection) and a wait of its own;
// at 1,000 events/s that was most of the bridge's CPU per event. A stream
// whose position is known (this Forwarder published it up to the batch's
// first event, and the batch does not reconcile) and whose events can all
// be batched needs no look-up and no wait between its events: a run of two
// or more goes as a fast batch, a single event as one message expecting
// the stream's last sequence, answered on the fast batches' subscription
// (a plain publish with a reply subject: JetStream answers it with a
// PubAck). Every such stream is sent first, then the answers are waited
// for, with one timer. Order per stream and the fence are as in
// publishStream: one batch per stream, the first message carrying the
// expectation. Streams that need a look-up, a re-publish or one event at
// a time go through publishStream meanwhile (a goroutine each), and
// batches JetStream refused as batches after the answers.

// ahead is one stream sent ahead: its batch's index and what was sent.
type ahead struct {
	i    int // index of the batch in Handle's batches
	sent *sentBatch
	pos  position
}

// sendAhead sends b when its stream's position is known and every event
// can go without waiting (see above); batchOK says whether fast batches
// are allowed as of the last look. It returns false, having sent
// nothing, for a batch publishStream must handle.
func (f *Forwarder) sendAhead(ctx context.Context, b drain.Batch, batchOK bool, msg *nats.Msg) (ahead, bool) {
	evs := b.Events
	if len(evs) == 0 || (len(evs) > 1 && !batchOK) {
		return ahead{}, false
	}
	for _, e := range evs {
		if e.Stream != b.Stream || !f.batchable(e) {
			return ahead{}, false
		}
	}
	pos, known := f.position(b.Stream, evs[0].Version, b.Reconcile)
	if !known {
		return ahead{}, false
	}
	var sb *sentBatch
	if len(evs) == 1 {
		sb = f.sendOne(ctx, b.Stream, evs, pos.seq, msg)
	} else if sb, _ = f.sendBatch(ctx, b.Stream, evs, pos.seq, msg); sb == nil {
		// Not sent, or the send failed part way (the outcome unknown):
		// publishStream looks the stream up and tells.
		f.forget(b.Stream)
	}
	return ahead{sent: sb, pos: pos}, sb != nil
}

// sendOne sends evs[0] alone (evs has one event, of stream), expecting
// lastSeq as the last sequence on its stream's subjects, with a reply
// subject on the batcher's subscription; nil when it could not be sent
// (the position is then forgotten).
func (f *Forwarder) sendOne(ctx context.Context, stream string, evs []event.Event, lastSeq uint64, msg *nats.Msg) *sentBatch {
	b := f.batcher
	if ctx.Err() != nil || b.subscribe() != nil {
		return nil
	}
	// The reply subject "<inbox>.<batch id>" in one allocation; the id is
	// its tail.
	var buf [128]byte
	r := append(append(buf[:0], b.prefix...), b.idBase...)
	reply := string(strconv.AppendUint(r, b.next.Add(1), 36))
	sb := &sentBatch{f: f, stream: stream, evs: evs[:1:1], lastSeq: lastSeq, single: true, id: reply[len(b.prefix):]}
	sb.w = batchWait{n: 1, done: make(chan struct{})}
	b.mu.Lock()
	b.waiting[sb.id] = &sb.w
	b.mu.Unlock()
	fillMessage(msg, evs[0], f.cfg)
	sb.span = f.startSpan(ctx, &sb.evs[0], msg)
	expect := []string{strconv.FormatUint(lastSeq, 10), wire.StreamFilter(f.cfg.Prefix, stream)}
	msg.Header[wire.HeaderExpectedLastSubjectSequence] = expect[0:1:1]
	msg.Header[wire.HeaderExpectedLastSubjectSequenceSubject] = expect[1:2:2]
	if f.cfg.Stream != "" {
		msg.Header[wire.HeaderExpectedStream] = []string{f.cfg.Stream}
	}
	msg.Reply = reply
	sb.sent = time.Now()
	if err := b.nc.PublishMsg(msg); err != nil {
		// It may have gone out all the same: publishStream looks the
		// stream up.
		sb.abandon()
		endSpan(sb.span, Outcome{Status: Failed, Err: err})
		f.forget(stream)
		return nil
	}
	return sb
}

// settleAhead waits for a's answer until deadline (or ctx's end), reports
// each event to the Observer and the log as publishStream does, and
// returns the batch's result; retry is set when JetStream refused a fast
// batch as a batch: nothing was stored and publishStream must send it.
func (f *Forwarder) settleAhead(ctx context.Context, a ahead, deadline time.Time) (r drain.Result, retry bool) {
	sb := a.sent
	var res batchResult
	if sb.single {
		res = sb.await(ctx, deadline)
		o := Outcome{Status: Stored, Sequence: res.Sequence}
		switch {
		case res.Err != nil:
			o = f.failed(sb.evs[0], res.Err)
		case res.Duplicate:
			o.Status = Duplicate
			f.log.Debug("duplicate dropped by JetStream", "stream", sb.stream, "event_id", sb.evs[0].ID, "sequence", res.Sequence)
		default:
			f.log.Debug("event stored", "stream", sb.stream, "event_id", sb.evs[0].ID, "sequence", res.Sequence)
		}
		endSpan(sb.span, o)
		f.cfg.Observer.Published(o, sb.took())
		if o.Status == Failed {
			f.forget(sb.stream)
			return drain.Result{Err: o.Err}, false
		}
		if o.Status == Stored {
			a.pos.seq = res.Sequence
		}
		// Duplicate: JetStream checked the expectation first, so the last
		// message is still the one expected.
	} else {
		res = sb.await(ctx, deadline)
		if errors.Is(res.Err, errBatchRefused) {
			f.log.Debug("JetStream refused a fast batch; publishing one event at a time", "stream", sb.stream, "error", res.Err)
			if errors.Is(res.Err, errBatchDisabled) {
				f.noBatching()
			}
			return drain.Result{}, true
		}
		took := sb.took()
		for k := range res.Done {
			o := Outcome{Status: Stored}
			if k == res.Done-1 {
				o.Sequence = res.Sequence
			}
			f.cfg.Observer.Published(o, took)
		}
		if res.Err != nil {
			o := f.failed(sb.evs[res.Done], res.Err)
			f.cfg.Observer.Published(o, took)
			f.forget(sb.stream)
			// Those sent behind it were not stored (gap: fail).
			return drain.Result{Done: res.Done, Err: o.Err}, false
		}
		f.log.Debug("events stored", "stream", sb.stream, "event_id", sb.evs[len(sb.evs)-1].ID, "events", len(sb.evs), "sequence", res.Sequence)
		a.pos.seq = res.Sequence
	}
	if a.pos.seq == 0 {
		// Nothing was stored (a duplicate of a stream never stored):
		// look the stream up next time.
		f.forget(sb.stream)
		return drain.Result{Done: len(sb.evs)}, false
	}
	a.pos.next = sb.evs[len(sb.evs)-1].Version + 1
	f.remember(sb.stream, a.pos)
	return drain.Result{Done: len(sb.evs)}, false
}

// batchOKCached reports whether fast batches are allowed as of the last
// look, without looking (false when the look is due: publishStream makes
// it).
func (f *Forwarder) batchOKCached() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.batchCheckedAt.IsZero() && time.Since(f.batchCheckedAt) < batchRecheck && f.batchOK
}

// aheadDeadline is when the answers of streams sent ahead are given up:
// PublishTimeout after the last was sent.
func (f *Forwarder) aheadDeadline() time.Time {
	return time.Now().Add(f.cfg.PublishTimeout)
}
