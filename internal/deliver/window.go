package deliver

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// Replay by time: what the events stream holds in a window of time is
// POSTed once more to one subscription's endpoint, as a normal delivery
// would send it (body, signature with the current secrets, Idempotency-Key
// = event id), one event at a time in the stream's order, outside the
// circuit breaker. It reads through an ephemeral ordered consumer that
// starts at Since (OptStartTime) and never touches the subscription's
// durable consumers: their positions, pending and acked messages stay as
// they are. A POST that is not answered 2xx stops the replay at once with
// the position reached (WindowResult.Failed): nothing after it is sent,
// and the same replay started again with Since = Failed.Time resumes at
// that event.
//
// An ordered subscription's replay names each event's predecessor in the
// version chain (Jsbridge-Previous-Version; no partition, no epoch: it is
// no partition's owner): for a stream's first event in the window, the
// stream's last event before the window that the subscription's filters
// select, at or after its start, stepped over the versions dead-lettered
// and not delivered since (windowChain); for the next ones, the one
// before it in the window, which this replay delivered.

// ErrInvalidWindow is wrapped by ReplayWindow when the window is
// misconfigured; the message names the field and the value.
var ErrInvalidWindow = errors.New("invalid replay window")

// Window says what ReplayWindow re-delivers.
type Window struct {
	// Since is the window's start: messages JetStream stored at or after
	// it (the time the bridge published the event, not the event's own
	// created time). Required.
	Since time.Time
	// Until is the window's end, exclusive. Zero: up to the events
	// stream's last message when the replay begins (events published
	// later are left to the subscription's own delivery).
	Until time.Time
	// Stream, when not "", narrows the window to one source stream (the
	// event-store stream, e.g. "order-42").
	Stream string
	// Match, when not nil, narrows the window to the source streams whose
	// name it matches. At most one of Stream and Match.
	Match *regexp.Regexp
	// DryRun counts what would be sent, sending nothing.
	DryRun bool
	// Progress, when not nil, is called after each event in the window
	// was sent (or counted, in a dry run), on ReplayWindow's goroutine.
	Progress func(WindowResult)
}

// WindowPosition is one event of the events stream.
type WindowPosition struct {
	// EventID is the event id (Nats-Msg-Id).
	EventID string `json:"event_id"`
	// Seq is its sequence in the events stream.
	Seq uint64 `json:"seq"`
	// Time is when JetStream stored it.
	Time time.Time `json:"time"`
	// Stream is its source stream.
	Stream string `json:"stream"`
}

// WindowFailure is the event a replay stopped at.
type WindowFailure struct {
	WindowPosition
	// Status is the HTTP status, 0 without a response.
	Status int `json:"status"`
	// Reason says why it failed, e.g. "HTTP 503 Service Unavailable".
	Reason string `json:"reason"`
}

// WindowResult is how far ReplayWindow got.
type WindowResult struct {
	// Subscription is the subscription replayed to.
	Subscription string `json:"subscription"`
	// Matched counts the events of the window read so far that pass
	// Stream or Match (all of them in a finished dry run).
	Matched int `json:"matched"`
	// Delivered counts those the endpoint answered 2xx (0 in a dry run).
	Delivered int `json:"delivered"`
	// Last is the last event delivered (counted, in a dry run); zero
	// before the first.
	Last WindowPosition `json:"last"`
	// Failed is the event the replay stopped at: its POST was not
	// answered 2xx, or could not be built. Nil when none failed.
	Failed *WindowFailure `json:"failed,omitempty"`
}

// ReplayWindow re-delivers what c's events stream holds in window w to
// the endpoint of c's subscription named sub, with the same body,
// signature (the current secrets) and Idempotency-Key as a normal
// delivery, in the events stream's order (so each source stream in
// version order), one event at a time; see the comment above Window for
// what it leaves alone and how a failure stops it. It returns how far it
// got. Errors: ErrUnknownSubscription (wrapped) for a sub c does not
// have, ErrInvalidWindow for a bad window, JetStream's errors (wrapped)
// reading the stream, and ctx's error when it ends first (with the result
// so far). A failed POST is not an error: see WindowResult.Failed.
func ReplayWindow(ctx context.Context, c *Consumer, sub string, w Window) (WindowResult, error) {
	res := WindowResult{Subscription: sub}
	var r *runner
	for _, cand := range c.runners {
		if cand.sub.Name == sub {
			r = cand
		}
	}
	if r == nil {
		return res, fmt.Errorf("deliver: replay: %w: %q", ErrUnknownSubscription, sub)
	}
	if err := w.Validate(); err != nil {
		return res, err
	}
	events, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return res, fmt.Errorf("deliver: replay: JetStream stream %q: %w", c.cfg.Stream, err)
	}
	prefix := ordercopy.EventsPrefix(events.CachedInfo().Config)
	last := events.CachedInfo().State.LastSeq
	filters := WindowFilters(r.sub.FilterSubjects, prefix, w.Stream)
	if len(filters) == 0 || last == 0 {
		return res, nil // nothing the subscription selects is in that stream
	}
	since := w.Since
	oc, err := c.js.OrderedConsumer(ctx, c.cfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		InactiveThreshold: time.Minute, // should the delete below not get through
	})
	if err != nil {
		return res, fmt.Errorf("deliver: replay: ordered consumer on JetStream stream %q: %w", c.cfg.Stream, err)
	}
	defer func() {
		// The ordered consumer made again after a gap has a new name: the
		// last one is deleted.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.js.DeleteConsumer(dctx, c.cfg.Stream, oc.CachedInfo().Name)
	}()
	info, err := oc.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("deliver: replay: ordered consumer on JetStream stream %q: %w", c.cfg.Stream, err)
	}
	if info.NumPending == 0 {
		return res, nil
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(windowBatch))
	if err != nil {
		return res, fmt.Errorf("deliver: replay: read JetStream stream %q: %w", c.cfg.Stream, err)
	}
	defer it.Stop()
	run := &WindowRun{Window: w, Sender: r.snd, Prefix: prefix, Last: last, res: res}
	if r.sub.Ordered() {
		run.Before = newWindowChain(ctx, c, r.sub, prefix).before
	}
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return run.Result(), ctx.Err()
			}
			return run.Result(), fmt.Errorf("deliver: replay: read JetStream stream %q: %w", c.cfg.Stream, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return run.Result(), fmt.Errorf("deliver: replay: message metadata: %w", err)
		}
		ev := WindowEvent{Seq: md.Sequence.Stream, Time: md.Timestamp, Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
		if done, err := run.Send(ctx, ev); done || err != nil {
			return run.Result(), err
		}
		if md.NumPending == 0 {
			return run.Result(), nil
		}
	}
}

// windowBatch is how many messages a replay's ordered consumer pulls
// ahead.
const windowBatch = 64

// windowChain is the version chain of a replay by time of an ordered
// subscription (see the comment above Window): the version of each
// stream it delivered, and where it looks up a stream's predecessor
// before the window (the partitioned copy).
type windowChain struct {
	js          jetstream.JetStream
	events      string // the events stream's name
	prefix      string // its subject prefix
	partitions  int
	sub         subscription.Subscription
	src         chainSource // filters set per stream
	windowStart uint64      // the copy sequence of the window's first event (0: not found yet)
	// noCopy: the subscription never ran ordered (no partitioned copy):
	// it delivered nothing before the window.
	noCopy bool
}

func newWindowChain(ctx context.Context, c *Consumer, sub subscription.Subscription, prefix string) *windowChain {
	copyName := wire.OrderedStream(c.cfg.Stream)
	wc := &windowChain{
		js: c.js, events: c.cfg.Stream, prefix: prefix, partitions: c.cfg.Partitions, sub: sub,
		src: chainSource{js: c.js, copyName: copyName, eventsPrefix: prefix, sub: sub.Name},
	}
	// The subscription's start on the copy, as its partition consumers
	// have it (all start alike); none yet: the copy's first.
	if cons, err := c.js.Consumer(ctx, copyName, wire.PartitionDurable(sub.Name, 0)); err == nil {
		wc.src.from = chainStart(cons.CachedInfo().Config)
	}
	if kv, err := deadletter.ParkBucket(ctx, c.js); err == nil {
		wc.src.parks = kv
	}
	return wc
}

// before returns the predecessor of version v of stream (events stream
// key key), at events stream sequence seq, among the events before the
// window (the copy sequence of seq when the window starts there).
func (wc *windowChain) before(ctx context.Context, key, stream string, v int64, seq uint64) (int64, error) {
	if v == 0 {
		return noPrevious, nil
	}
	pos := WindowPosition{Stream: stream, Seq: seq}
	if wc.windowStart == 0 && !wc.noCopy {
		// Every event of the stream at or after it is in the window (the
		// replay's filters are the subscription's): its predecessor before
		// the window comes before this copy sequence.
		s, err := wc.copySeq(ctx, pos.Seq)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			wc.noCopy = true
		case err != nil:
			return 0, err
		}
		wc.windowStart = s
	}
	if wc.noCopy {
		return noPrevious, nil
	}
	p := wire.StreamPartition(pos.Stream, wc.partitions)
	src := wc.src
	src.filters = nil
	for _, f := range wc.sub.FilterSubjects {
		of, err := wire.OrderedFilter(wc.prefix, p, f)
		if err != nil {
			return 0, err
		}
		src.filters = append(src.filters, of)
	}
	copyKey := wire.OrderedPrefix(wc.prefix) + "." + strconv.Itoa(p) + strings.TrimPrefix(key, wc.prefix)
	return src.previous(ctx, copyKey, wc.windowStart)
}

// copyBehindWait is how long a replay by time waits for the partitioned
// copy to source the window's start (a copy just provisioned) before it
// gives up.
const copyBehindWait = 30 * time.Second

// copySeq is copySeqFrom of the events stream's sequence seq, waiting up
// to copyBehindWait while the copy is behind it.
func (wc *windowChain) copySeq(ctx context.Context, seq uint64) (uint64, error) {
	var pause backoff.Backoff
	deadline := time.Now().Add(copyBehindWait)
	for {
		s, err := copySeqFrom(ctx, wc.js, wc.events, wc.src.copyName, wc.sub.Name, seq)
		if !errors.Is(err, errCopyBehind) || time.Now().After(deadline) {
			return s, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(pause.Next()):
		}
	}
}
