package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/payload"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Validate checks w before anything is read: an error wrapping
// ErrInvalidWindow naming the field and the value.
func (w Window) Validate() error {
	switch {
	case w.Since.IsZero():
		return fmt.Errorf("deliver: %w: Since is required", ErrInvalidWindow)
	case !w.Until.IsZero() && !w.Until.After(w.Since):
		return fmt.Errorf("deliver: %w: Until %s is not after Since %s", ErrInvalidWindow, w.Until.Format(time.RFC3339Nano), w.Since.Format(time.RFC3339Nano))
	case w.Stream != "" && w.Match != nil:
		return fmt.Errorf("deliver: %w: Stream %q and Match %q: give one", ErrInvalidWindow, w.Stream, w.Match)
	}
	return nil
}

// WindowEvent is one event of the events stream as a replay by time
// reads it.
type WindowEvent struct {
	// Seq is its events stream sequence; Time when JetStream stored it.
	Seq  uint64
	Time time.Time
	// Subject, Header and Data are the message's.
	Subject string
	Header  nats.Header
	Data    []byte
}

// WindowRun is one replay by time (see the comment above Window): the
// caller reads the window's events in the events stream's order, from
// the first stored at or after Window.Since (the consumer reads them
// with direct gets), and hands each to Send, which matches, POSTs and
// counts it.
type WindowRun struct {
	// Window is the window replayed (validated by the caller).
	Window Window
	// Sender POSTs the events (attempt.Sender.Direct).
	Sender *attempt.Sender
	// Prefix is the events stream's subject prefix.
	Prefix string
	// Last is the events stream's last sequence when the replay began:
	// later events are the subscription's own delivery's.
	Last uint64
	// Before, for an ordered subscription (nil: none), returns the
	// predecessor of version v of source stream stream (events stream
	// key key) at sequence seq, among the events before the window: what
	// a stream's first event in the window names.
	Before func(ctx context.Context, key, stream string, v int64, seq uint64) (int64, error)

	res  WindowResult
	last map[string]int64 // the version of each stream this replay delivered
}

// Result returns how far the replay got.
func (wr *WindowRun) Result() WindowResult { return wr.res }

// Send handles ev, the next event of the window: past the window's end
// (Until, Last) it sends nothing and reports done; otherwise, when it
// passes Stream or Match, it POSTs it once (counted only in a dry run),
// and reports done when the endpoint did not accept it (Result().Failed)
// or ev is the window's last. Errors: the predecessor's look-up.
func (wr *WindowRun) Send(ctx context.Context, ev WindowEvent) (done bool, err error) {
	w := wr.Window
	if ev.Seq > wr.Last || (!w.Until.IsZero() && !ev.Time.Before(w.Until)) {
		return true, nil
	}
	pos := WindowPosition{EventID: payload.EventID(ev.Header), Seq: ev.Seq, Time: ev.Time}
	pos.Stream, _, _ = wire.ParseSubject(wr.Prefix, ev.Subject)
	if w.Match == nil || w.Match.MatchString(pos.Stream) {
		wr.res.Matched++
		if !w.DryRun {
			order, err := wr.order(ctx, ev, pos)
			if err != nil {
				return true, fmt.Errorf("deliver: replay: event %s: %w", pos.EventID, err)
			}
			if f := wr.sendOnce(ctx, ev, pos, order); f != nil {
				wr.Sender.Logger().Warn("replay stopped: the endpoint did not accept an event", slog.String("replay_since", w.Since.Format(time.RFC3339Nano)),
					slog.String("event_id", pos.EventID), slog.Uint64("seq", pos.Seq), slog.Int("status", f.Status), slog.String("reason", f.Reason))
				wr.res.Failed = f
				return true, nil
			}
			wr.res.Delivered++
			if order != nil {
				wr.last[wire.StreamKey(ev.Subject)] = order.Version
			}
		}
		wr.res.Last = pos
		if w.Progress != nil {
			w.Progress(wr.res)
		}
	}
	return ev.Seq == wr.Last, nil
}

// order returns the ordering fields ev's POST sends: none without
// Before or a stream version; else its predecessor, the version this
// replay delivered of its stream last, or for the stream's first event
// in the window the one Before finds.
func (wr *WindowRun) order(ctx context.Context, ev WindowEvent, pos WindowPosition) (*webhook.OrderFields, error) {
	v, err := strconv.ParseInt(payload.HeaderValue(ev.Header, wire.HeaderStreamVersion), 10, 64)
	if wr.Before == nil || err != nil {
		return nil, nil
	}
	key := wire.StreamKey(ev.Subject)
	prev, ok := wr.last[key]
	if !ok {
		if prev, err = wr.Before(ctx, key, pos.Stream, v, pos.Seq); err != nil {
			return nil, err
		}
	}
	if wr.last == nil {
		wr.last = map[string]int64{}
	}
	return attempt.OrderFieldsOf(ev.Header, prev, -1, 0), nil
}

// sendOnce POSTs ev (at pos) once, as a delivery would, with the
// ordering fields order (nil: none), outside the circuit breaker, and
// returns nil when the endpoint answered 2xx.
func (wr *WindowRun) sendOnce(ctx context.Context, ev WindowEvent, pos WindowPosition, order *webhook.OrderFields) *WindowFailure {
	resp, err := wr.Sender.Direct(ctx, pos.EventID, ev.Header, ev.Data, order)
	if err != nil {
		return &WindowFailure{WindowPosition: pos, Reason: err.Error()}
	}
	if resp.Verdict() != attempt.VerdictAck {
		return &WindowFailure{WindowPosition: pos, Status: resp.Status, Reason: resp.Reason()}
	}
	return nil
}

// WindowFilters are the subject filters of a replay of a subscription
// with filters subs: subs themselves, or, for one source stream, each
// narrowed to that stream's subjects (those matching none dropped). An
// empty result: the subscription selects nothing of the stream.
func WindowFilters(subs []string, prefix, stream string) []string {
	if stream == "" {
		return subs
	}
	one := wire.StreamFilter(prefix, stream)
	var out []string
	for _, f := range subs {
		if in, ok := wire.IntersectFilters(f, one); ok {
			out = append(out, in)
		}
	}
	return out
}
