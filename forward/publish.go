// Publishing one event: the message carries the expected last sequence on
// its stream's subjects (the fence against a bridge that lost its lease),
// and its failure is classified as non-retryable, a conflict, or the bus
// being unavailable.

package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/wire"
)

// publish sends one event expecting lastSeq as the last sequence on the
// stream's subjects, classifies the result and tells the Observer.
func (f *Forwarder) publish(ctx context.Context, e event.Event, stream string, lastSeq uint64) Outcome {
	start := time.Now()
	var span trace.Span
	o := f.publishOnce(ctx, e, stream, lastSeq, &span)
	if span != nil {
		endSpan(span, o)
	}
	f.cfg.Observer.Published(o, time.Since(start))
	return o
}

// publishOnce refuses an event the store could not read or whose data is
// not JSON (non-retryable), else publishes it expecting lastSeq and waits
// for its PubAck: Stored, Duplicate (dropped by the duplicate window) or
// Failed with the classified error (see publishErr).
// The publish span, started once the message is built, is left in *span.
func (f *Forwarder) publishOnce(ctx context.Context, e event.Event, stream string, lastSeq uint64, span *trace.Span) Outcome {
	if e.Err != nil {
		// The store could not read it (event.Event.Err): the drain never
		// hands it over, but Publish takes any event.
		return f.failed(e, drain.NonRetryable(fmt.Errorf("event %d of stream %q cannot be read: %w", e.ID, e.Stream, e.Err)))
	}
	if !e.DataJSON && !json.Valid(e.Data) {
		return f.failed(e, drain.NonRetryable(fmt.Errorf("%w: event %d of stream %q (%d bytes)", errInvalidData, e.ID, e.Stream, len(e.Data))))
	}
	msg := Message(e, f.cfg)
	*span = f.startSpan(ctx, &e, msg)
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequenceForSubject(lastSeq, wire.StreamFilter(f.cfg.Prefix, stream))}
	if f.cfg.Stream != "" {
		opts = append(opts, jetstream.WithExpectStream(f.cfg.Stream))
	}
	ack, err := f.publishAndWait(ctx, msg, opts)
	if err != nil {
		return f.failed(e, f.publishErr(e, stream, lastSeq, true, err))
	}
	if ack.Duplicate {
		f.log.Debug("duplicate dropped by JetStream", "stream", e.Stream, "event_id", e.ID, "sequence", ack.Sequence)
		return Outcome{Status: Duplicate, Sequence: ack.Sequence}
	}
	f.log.Debug("event stored", "stream", e.Stream, "event_id", e.ID, "sequence", ack.Sequence)
	return Outcome{Status: Stored, Sequence: ack.Sequence}
}

// publishErr classifies the refusal err of e: too large (non-retryable), a
// conflict with the expected last sequence (only the first message of a
// batch carries it; expected tells whether e did), or a failure of the bus.
func (f *Forwarder) publishErr(e event.Event, stream string, lastSeq uint64, expected bool, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case tooLarge(err):
		return drain.NonRetryable(fmt.Errorf("%w: event %d of stream %q (%d bytes of data): %w", ErrTooLarge, e.ID, e.Stream, len(e.Data), err))
	case expected && errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("%w: event %d of stream %q: expected the stream's last message at sequence %d: %w", ErrConflict, e.ID, e.Stream, lastSeq, err)
	}
	return classify(fmt.Errorf("publish event %d of stream %q to %s: %w", e.ID, stream, wire.Subject(f.cfg.Prefix, stream, e.Name), err))
}

// publishAndWait publishes msg asynchronously and waits for its PubAck, at
// most PublishTimeout. Async publishes from many streams share nats.go's
// write buffer and flusher, so the server gets them in batches instead of one
// flushed request each: the same ordering guarantee per stream (we still wait
// before the next event) at a fraction of the cost per message.
func (f *Forwarder) publishAndWait(ctx context.Context, msg *nats.Msg, opts []jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if err := ctx.Err(); err != nil {
		// Past the cycle's deadline (or shut down): a publish sent now
		// would go unanswered and its outcome stay unknown.
		return nil, fmt.Errorf("not sent: %w", err)
	}
	fut, err := f.js.PublishMsgAsync(msg, opts...)
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(f.cfg.PublishTimeout)
	defer t.Stop()
	select {
	case ack := <-fut.Ok():
		return ack, nil
	case err := <-fut.Err():
		return nil, err
	case <-t.C:
		return nil, fmt.Errorf("no PubAck within %s: %w", f.cfg.PublishTimeout, context.DeadlineExceeded)
	case <-ctx.Done():
		return nil, fmt.Errorf("no PubAck before the context ended (the cycle's deadline or shutdown): %w", ctx.Err())
	}
}

// classify wraps err as a drain.UnavailableError when it is a failure of
// the bus rather than of the event: JetStream did not answer in time (a
// publish or lookup timed out, or was cut short by the context: the
// cycle's deadline, or shutdown), no server or stream answering, a closed
// or reconnecting connection, JetStream refusing the message for lack of
// storage (IsStorageFull: also the account limit's code 400), a JetStream
// API error with code 503 (JetStream unavailable), or a fast batch the
// server no longer knows (apiErrBatchUnknown). Anything else is returned
// as it is.
func classify(err error) error {
	switch ErrorClass(err) {
	case ClassTimeout, ClassCanceled, ClassNoResponders, ClassConnection, ClassStorage:
		return drain.Unavailable(err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.Code == 503 || apiErr.ErrorCode == apiErrBatchUnknown) {
		return drain.Unavailable(err)
	}
	return err
}

// apiErrBatchUnknown is JetStream's answer to a message of a fast batch
// whose batch it does not know (10208, "batch publish ID unknown"): the
// server dropped the batch's state when no message of it came within its
// batch timeout (10 s by default), which a server paused or starved of
// CPU meets when it reads the rest of the batch at last. Nothing from that
// message on was stored; the stream's next attempt looks its position up.
// It is the server's doing, not the event's: an outage, counting no retry.
const apiErrBatchUnknown jetstream.ErrorCode = 10208

// failed logs and returns a Failed outcome.
func (f *Forwarder) failed(e event.Event, err error) Outcome {
	retryable := !drain.IsNonRetryable(err)
	if IsStorageFull(err) {
		// Every stream meets it at once: the bridge says it once per
		// outage (see bridge.Bridge.Ready), not once per stream.
		f.log.Debug("publish refused for lack of storage", "stream", e.Stream, "event_id", e.ID, "error", err)
		return Outcome{Status: Failed, Err: err, Retryable: retryable}
	}
	f.log.Warn("publish failed", "stream", e.Stream, "event_id", e.ID, "error", err, "retryable", retryable)
	return Outcome{Status: Failed, Err: err, Retryable: retryable}
}

// notAttempted is the outcome of e, skipped because prev failed.
func notAttempted(e, prev event.Event) Outcome {
	return Outcome{
		Status:    Failed,
		Err:       fmt.Errorf("%w: event %d of stream %q after failed event %d", errNotAttempted, e.ID, e.Stream, prev.ID),
		Retryable: true,
	}
}

// tooLarge reports whether err says the message exceeds the server's max
// payload (client-side check) or the stream's maximum message size.
func tooLarge(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}
