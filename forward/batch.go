package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/wire"
)

// Fast batches (nats-server 2.14+, a stream with allow_batched): the
// messages of one batch are sent back to back without waiting for a PubAck
// each; the server stores them in order and, in "gap: fail" mode, stores
// nothing after a message it refused or never got, and answers the batch's
// last message (the commit) with one PubAck whose count is the number of
// leading messages it handled. That keeps a stream's order in JetStream
// equal to Postgres's, like waiting for every PubAck did, at one round trip
// per batch instead of one per event.
//
// The batch is described by the reply subject of each message:
// <inbox>.<batch id>.<flow>.fail.<batch seq>.<op>.$FI, op 0 starting it, 1
// appending, 2 committing (nats-server stream.go getFastBatch). The server
// answers to that reply subject: flow-control acks ({"type":"ack"...},
// ignored here: a batch is at most FetchLimit events), errors for one
// message ({"type":"err"...}), gaps ({"type":"gap"...}) and, last, the
// PubAck.

// fastBatchFlow is the flow-control interval asked for: the server sends a
// flow ack every this many messages at most (it lowers it when many batches
// run at once). The publisher does not wait for them.
const fastBatchFlow = 500

// API error codes of fast-batch refusals after which the Forwarder publishes
// one event at a time instead (nats-server errors.json).
const (
	errCodeBatchPublishDisabled        = 10205 // the stream does not allow batched publishing
	errCodeBatchPublishTooManyInflight = 10211 // too many batches in flight on the stream or server
)

// errBatchRefused marks a batch the server refused as a batch: nothing was
// stored, publish the events one by one. errBatchDisabled (wrapping it)
// says the stream does not allow batches at all.
var (
	errBatchRefused  = errors.New("fast batch refused")
	errBatchDisabled = fmt.Errorf("%w: the stream does not allow batched publishing", errBatchRefused)
)

// batchAck is the server's answer to a batch message: the final PubAck
// (count set) or an error for one message.
type batchAck struct {
	Type      string              `json:"type"`
	Stream    string              `json:"stream"`
	Sequence  uint64              `json:"seq"`
	Duplicate bool                `json:"duplicate"`
	Batch     string              `json:"batch"`
	Count     int                 `json:"count"`
	Error     *jetstream.APIError `json:"error"`
}

// batchWait is one batch waiting for its PubAck.
type batchWait struct {
	n    int           // messages in the batch
	done chan struct{} // closed once ack or noResponders is set
	ack  batchAck
	// failSeq is the batch sequence (1-based) of the first message the
	// server reported an error for, failErr that error; 0 when none.
	failSeq      int
	failErr      *jetstream.APIError
	noResponders bool
	answered     time.Time // when done was closed
}

// batcher sends fast batches over one connection and routes the answers,
// all on one wildcard subscription, to the batches waiting for them.
type batcher struct {
	nc     *nats.Conn
	prefix string // "<inbox>."
	idBase string // the inbox's unique token: batch ids are idBase+counter
	next   atomic.Uint64

	once   sync.Once
	subErr error

	mu      sync.Mutex
	waiting map[string]*batchWait
}

func newBatcher(nc *nats.Conn) *batcher {
	inbox := nc.NewInbox()
	base := inbox[strings.LastIndexByte(inbox, '.')+1:]
	return &batcher{nc: nc, prefix: inbox + ".", idBase: base, waiting: make(map[string]*batchWait)}
}

// subscribe starts the answers' subscription once.
func (b *batcher) subscribe() error {
	b.once.Do(func() {
		_, b.subErr = b.nc.Subscribe(b.prefix+">", b.onReply)
	})
	return b.subErr
}

var typePrefix = []byte(`{"type":"`)

// onReply routes one answer by the batch id in its subject.
func (b *batcher) onReply(m *nats.Msg) {
	rest, ok := strings.CutPrefix(m.Subject, b.prefix)
	if !ok {
		return
	}
	id, rest, _ := strings.Cut(rest, ".")
	seq := replySeq(rest)
	if bytes.HasPrefix(m.Data, typePrefix) && bytes.HasPrefix(m.Data[len(typePrefix):], []byte(`ack"`)) {
		return // flow control: not waited for
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiting[id]
	if w == nil {
		return // late answers of a batch already settled
	}
	finish := func() {
		delete(b.waiting, id)
		w.answered = time.Now()
		close(w.done)
	}
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			w.noResponders = true
			finish()
		}
		return
	}
	var a batchAck
	if err := decodeAck(m.Data, &a); err != nil {
		return
	}
	switch {
	case a.Type == "err":
		if w.failSeq == 0 && a.Error != nil {
			w.failSeq, w.failErr = int(a.Sequence), a.Error
		}
	case a.Type != "":
		// a gap: only possible when a message was lost on the way; the
		// PubAck's count says where the batch ended.
	case a.Error != nil && seq > 1:
		// A message refused before the batch logic saw it (account
		// limits, say): the server ends the batch at the next message's
		// gap, or never when it was the commit.
		if w.failSeq == 0 {
			w.failSeq, w.failErr = seq, a.Error
		}
		if seq == w.n {
			w.ack = batchAck{Count: seq - 1, Error: a.Error}
			finish()
		}
	default:
		w.ack = a
		finish()
	}
}

// replySeq returns the batch sequence from the rest of a reply subject,
// "<flow>.fail.<seq>.<op>.$FI", or 0.
func replySeq(rest string) int {
	for range 2 { // past <flow> and the gap mode
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return 0
		}
		rest = rest[i+1:]
	}
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.Atoi(rest)
	if err != nil {
		return 0
	}
	return n
}

// batchResult is what became of a batch: the first Done events were stored
// (or were duplicates), Sequence is the JetStream sequence of the last one
// stored (0 when unknown); when Done < len(events), Err is the failure of
// events[Done].
type batchResult struct {
	Done     int
	Sequence uint64
	Err      error
	// Duplicate: a single event (sendOne) JetStream already had within
	// its duplicate window; Sequence is then that message's.
	Duplicate bool
}

// publishBatch sends evs, all of stream and in version order, as one fast
// batch in gap-fail mode, the first expecting lastSeq as the last sequence
// on the stream's subjects, and waits for the PubAck (PublishTimeout). It
// returns errBatchRefused (Done 0) when the server refused the batch as a
// batch: errBatchDisabled when the stream does not allow them, else too
// many batches were in flight. len(evs) must be at least 2.
func (f *Forwarder) publishBatch(ctx context.Context, stream string, evs []event.Event, lastSeq uint64) batchResult {
	sb, res := f.sendBatch(ctx, stream, evs, lastSeq, &nats.Msg{Header: make(nats.Header, 15)})
	if sb == nil {
		return res
	}
	return sb.await(ctx, time.Now().Add(f.cfg.PublishTimeout))
}

// sentBatch is a fast batch (or, single set, one event published on its
// own through the batcher's answers) sent and waiting for its PubAck.
type sentBatch struct {
	f       *Forwarder
	stream  string
	evs     []event.Event
	lastSeq uint64
	id      string
	w       batchWait  // registered in the batcher by address
	bs      *batchSpan // fast batches
	span    trace.Span // single
	single  bool
	sent    time.Time
}

// sendBatch sends evs as publishBatch does, through msg (its header map
// reused: PublishMsg copies it out), without waiting for the PubAck. It
// returns the batch sent, or nil and the result of a batch that could not
// be sent (its outcome may then be unknown).
func (f *Forwarder) sendBatch(ctx context.Context, stream string, evs []event.Event, lastSeq uint64, msg *nats.Msg) (*sentBatch, batchResult) {
	if err := ctx.Err(); err != nil {
		// Past the cycle's deadline (or shut down): a batch sent now would
		// go unanswered and its outcome stay unknown.
		return nil, batchResult{Err: classify(fmt.Errorf("publish events %d..%d of stream %q: not sent: %w", evs[0].ID, evs[len(evs)-1].ID, stream, err))}
	}
	b := f.batcher
	if err := b.subscribe(); err != nil {
		return nil, batchResult{Err: classify(fmt.Errorf("publish events of stream %q: subscribe to batch answers: %w", stream, err))}
	}
	sb := &sentBatch{f: f, stream: stream, evs: evs, lastSeq: lastSeq, id: b.idBase + strconv.FormatUint(b.next.Add(1), 36)}
	sb.w = batchWait{n: len(evs), done: make(chan struct{})}
	b.mu.Lock()
	b.waiting[sb.id] = &sb.w
	b.mu.Unlock()

	// One publish span for the batch (see batchtrace.go), ended with its
	// result.
	sb.bs = f.startBatchSpan(ctx, stream, evs)
	sb.sent = time.Now()
	replyPrefix := b.prefix + sb.id + "." + strconv.Itoa(fastBatchFlow) + ".fail."
	for i, e := range evs {
		fillMessage(msg, e, f.cfg)
		sb.bs.inject(msg.Header, i)
		op := "1"
		switch i {
		case 0:
			op = "0"
			msg.Header[wire.HeaderExpectedLastSubjectSequence] = []string{strconv.FormatUint(lastSeq, 10)}
			msg.Header[wire.HeaderExpectedLastSubjectSequenceSubject] = []string{wire.StreamFilter(f.cfg.Prefix, stream)}
		case len(evs) - 1:
			op = "2"
		}
		if f.cfg.Stream != "" {
			msg.Header[wire.HeaderExpectedStream] = []string{f.cfg.Stream}
		}
		msg.Reply = replyPrefix + strconv.Itoa(i+1) + "." + op + ".$FI"
		if err := b.nc.PublishMsg(msg); err != nil {
			// What was sent may be stored: the outcome is unknown.
			sb.abandon()
			res := batchResult{Err: classify(fmt.Errorf("publish event %d of stream %q to %s (batch message %d of %d): %w", e.ID, stream, msg.Subject, i+1, len(evs), err))}
			sb.bs.end(res, len(evs))
			return nil, res
		}
	}
	return sb, batchResult{}
}

// abandon stops routing answers to the batch.
func (sb *sentBatch) abandon() {
	b := sb.f.batcher
	b.mu.Lock()
	delete(b.waiting, sb.id)
	b.mu.Unlock()
}

// await waits for the batch's PubAck until deadline or ctx's end and
// returns what became of it (see publishBatch), ending its span.
func (sb *sentBatch) await(ctx context.Context, deadline time.Time) (res batchResult) {
	if sb.bs != nil {
		defer func() { sb.bs.end(res, len(sb.evs)) }()
	}
	select {
	case <-sb.w.done:
	default:
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-sb.w.done:
		case <-t.C:
			return sb.timedOut()
		case <-ctx.Done():
			return sb.cut(ctx)
		}
	}
	return sb.result()
}

// took is how long the batch's answer took from its send: until it came
// (not until await read it: the answers of a cycle's streams sent ahead
// are read one after the other), or until now when none came.
func (sb *sentBatch) took() time.Duration {
	select {
	case <-sb.w.done:
		return sb.w.answered.Sub(sb.sent)
	default:
		return time.Since(sb.sent)
	}
}

// timedOut is the result of a batch whose PubAck did not come within
// PublishTimeout.
func (sb *sentBatch) timedOut() batchResult {
	sb.abandon()
	evs := sb.evs
	return batchResult{Err: fmt.Errorf("publish events %d..%d of stream %q: no PubAck for the batch within %s: %w", evs[0].ID, evs[len(evs)-1].ID, sb.stream, sb.f.cfg.PublishTimeout, drain.Unavailable(context.DeadlineExceeded))}
}

// cut is the result of a batch whose PubAck did not come before ctx ended.
func (sb *sentBatch) cut(ctx context.Context) batchResult {
	// The cycle's deadline (or shutdown) came before the PubAck: as
	// much an outage as the timer's expiry, and as unknown an outcome.
	sb.abandon()
	evs := sb.evs
	return batchResult{Err: classify(fmt.Errorf("publish events %d..%d of stream %q: no PubAck for the batch before the context ended (the cycle's deadline or shutdown): %w", evs[0].ID, evs[len(evs)-1].ID, sb.stream, ctx.Err()))}
}

// result reads the answer of a batch whose wait is done.
func (sb *sentBatch) result() batchResult {
	f, b, w, evs, stream := sb.f, sb.f.batcher, &sb.w, sb.evs, sb.stream
	b.mu.Lock() // w's fields were written under it
	defer b.mu.Unlock()
	if w.noResponders {
		return batchResult{Err: classify(fmt.Errorf("publish event %d of stream %q: %w", evs[0].ID, stream, nats.ErrNoResponders))}
	}
	a := w.ack
	if sb.single {
		// A plain PubAck: no count.
		if a.Error != nil {
			return batchResult{Err: f.publishErr(evs[0], stream, sb.lastSeq, true, a.Error)}
		}
		return batchResult{Done: 1, Sequence: a.Sequence, Duplicate: a.Duplicate}
	}
	done := min(max(a.Count, 0), len(evs))
	if w.failSeq > 0 && w.failSeq-1 < done {
		done = w.failSeq - 1
	}
	if done == len(evs) {
		return batchResult{Done: done, Sequence: a.Sequence}
	}
	apiErr := a.Error
	if w.failSeq == done+1 && w.failErr != nil {
		apiErr = w.failErr
	}
	seq := a.Sequence
	if done == 0 {
		seq = 0
	}
	e := evs[done]
	if apiErr == nil {
		return batchResult{Done: done, Sequence: seq, Err: fmt.Errorf("publish event %d of stream %q: JetStream ended the batch after %d of %d events without saying why", e.ID, stream, done, len(evs))}
	}
	if done == 0 {
		switch apiErr.ErrorCode {
		case errCodeBatchPublishDisabled:
			return batchResult{Err: fmt.Errorf("%w: %w", errBatchDisabled, apiErr)}
		case errCodeBatchPublishTooManyInflight:
			return batchResult{Err: fmt.Errorf("%w: %w", errBatchRefused, apiErr)}
		}
	}
	return batchResult{Done: done, Sequence: seq, Err: f.publishErr(e, stream, sb.lastSeq, done == 0, apiErr)}
}
