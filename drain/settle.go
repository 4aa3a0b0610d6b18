package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jsbridge/jsbridge/event"
)

// Settling a stream is two steps: decide, a pure function of the cycle's
// outcome that says what to do (the table in settle_test.go is its
// specification), and settle, which does it against the store and reports
// it to the logger, the Observer and the cycle's Stats.

// action is what settling does with a claimed stream.
type action int

const (
	// actAck advances the watermark to the progress point and resets the
	// retry count (Store.Ack).
	actAck action = iota + 1
	// actBlock advances the watermark to the progress point and blocks the
	// stream with the reason (Store.Block).
	actBlock
	// actRelease gives the lease back; nothing else moves (Store.Release).
	actRelease
	// actPostpone advances the watermark to the progress point and tries
	// again after the delay without counting a retry: the bus was
	// unavailable (Store.Postpone).
	actPostpone
	// actRetry advances the watermark to the progress point, counts a retry
	// and tries again after the delay (Store.Retry).
	actRetry
)

// String returns the action's name, for test failures.
func (a action) String() string {
	switch a {
	case actAck:
		return "ack"
	case actBlock:
		return "block"
	case actRelease:
		return "release"
	case actPostpone:
		return "postpone"
	case actRetry:
		return "retry"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// decision is what settling one stream does, decided by decide.
type decision struct {
	act action
	// done is how many leading events of the batch were handled (the
	// handler's Result.Done, 0 when out of range); they count as forwarded
	// once the store call succeeds.
	done int
	// version and id are the progress point: the last handled event, or the
	// claim's watermark (and id 0) when none was.
	version, id int64
	// failed is the event the stream stopped at (Events[done]); nil when the
	// whole batch was handled or the batch is empty.
	failed *event.Event
	// delay is how long until the next attempt (actRetry, actPostpone).
	delay time.Duration
	// reason is the error recorded on the stream (actBlock, actRetry,
	// actPostpone: which event and why), or why a stream was released.
	reason string
}

// settlePolicy is what decide needs of the drain's configuration and state.
type settlePolicy struct {
	maxRetries    int
	backoff       func(retry int) time.Duration
	outageBackoff func(outages int) time.Duration
	// outages is the number of cycles in a row before this one that met an
	// outage (outageBackoff's argument).
	outages int
}

func (d *Drain) settlePolicy() settlePolicy {
	return settlePolicy{
		maxRetries:    d.cfg.MaxRetries,
		backoff:       d.cfg.Backoff,
		outageBackoff: d.cfg.OutageBackoff,
		outages:       d.outages,
	}
}

// decide says how to settle the stream of claim c, whose batch b the handler
// answered with r (see Cycle for the rules). bad, when not nil, is the
// unreadable event just after b's last one (see unreadableResult);
// shuttingDown is whether the run's context is done. The rules, first match
// wins:
//
//   - r.Err nil: ack to the last event.
//   - a NonRetryableError: block at the progress point, at once.
//   - shutting down: ack what was done, or release when nothing was.
//   - an UnavailableError: postpone after p.outageBackoff(p.outages).
//   - c.Retry+1 > p.maxRetries: block, the reason saying after how many
//     attempts.
//   - otherwise: retry after p.backoff(c.Retry).
//
// A Done out of range, or short of the batch without an error, is an error
// of the handler's, settled as any other error with nothing done.
func decide(c event.Claim, b Batch, r Result, bad *event.Event, shuttingDown bool, p settlePolicy) decision {
	evs := b.Events
	if bad != nil {
		evs, r = unreadableResult(b, r, bad)
	}
	done := r.Done
	if done < 0 || done > len(evs) {
		r.Err = fmt.Errorf("handler reported Done %d of %d events (error: %v)", done, len(evs), r.Err)
		done = 0
	}
	if r.Err == nil && done != len(evs) {
		r.Err = fmt.Errorf("handler reported no error but Done %d of %d events", done, len(evs))
	}
	dec := decision{done: done, version: c.Watermark}
	if done > 0 {
		dec.version, dec.id = evs[done-1].Version, evs[done-1].ID
	}
	if done < len(evs) {
		dec.failed = &evs[done]
	}

	switch {
	case r.Err == nil:
		dec.act = actAck
	case IsNonRetryable(r.Err):
		dec.act, dec.reason = actBlock, failureReason(dec.failed, r.Err)
	case shuttingDown:
		// Shutdown cut the handler short: not a failure of the stream.
		if done > 0 {
			dec.act = actAck
		} else {
			dec.act, dec.reason = actRelease, r.Err.Error()
		}
	case IsUnavailable(r.Err):
		// Not the stream's fault: no retry counted, no block, however long
		// the outage. The delay grows with the drain's own count of outage
		// cycles in a row instead.
		dec.act, dec.delay = actPostpone, p.outageBackoff(p.outages)
		dec.reason = failureReason(dec.failed, r.Err)
	case c.Retry+1 > p.maxRetries:
		dec.act = actBlock
		dec.reason = fmt.Sprintf("%s (after %d attempts)", failureReason(dec.failed, r.Err), c.Retry+1)
	default:
		dec.act, dec.delay = actRetry, p.backoff(c.Retry)
		dec.reason = failureReason(dec.failed, r.Err)
	}
	return dec
}

// settle records one stream's outcome in the store, as decide says. runCtx
// tells whether the drain is shutting down; sctx bounds the store calls; bad
// is the unreadable event after the batch, if any.
func (d *Drain) settle(runCtx, sctx context.Context, c event.Claim, b Batch, r Result, bad *event.Event, st *Stats) error {
	dec := decide(c, b, r, bad, runCtx.Err() != nil, d.settlePolicy())
	began := d.cfg.Clock.Now()
	err := d.apply(sctx, c, dec)
	return d.settled(c, dec, err, d.cfg.Clock.Since(began), st)
}

// apply does what dec says with c's stream against the store and returns
// the store's error.
func (d *Drain) apply(sctx context.Context, c event.Claim, dec decision) error {
	switch dec.act {
	case actAck:
		return d.store.Ack(sctx, d.cfg.Owner, c.Stream, dec.version, dec.id)
	case actBlock:
		return d.store.Block(sctx, d.cfg.Owner, c.Stream, dec.version, dec.id, dec.reason)
	case actRelease:
		return d.store.Release(sctx, d.cfg.Owner, []string{c.Stream})
	case actPostpone:
		return d.store.Postpone(sctx, d.cfg.Owner, c.Stream, dec.version, dec.id, dec.delay, dec.reason)
	case actRetry:
		return d.store.Retry(sctx, d.cfg.Owner, c.Stream, dec.version, dec.id, dec.delay, dec.reason)
	}
	return fmt.Errorf("settle: unknown %s", dec.act)
}

// settled reports c's stream settled as dec said, err being the store's
// answer and took how long the store call took, to the logger, the
// Observer and st. It returns the error Cycle returns for the stream: nil
// when settled or fenced off by a lost lease.
func (d *Drain) settled(c event.Claim, dec decision, err error, took time.Duration, st *Stats) error {
	// The stream key in each call rather than a d.log.With per stream: a
	// text handler formats With's attributes at once, logged or not.
	log := streamLogger{d.log, c.Stream}
	how := ""
	if err == nil {
		switch dec.act {
		case actAck:
			how = SettledAcked
			st.Acked++
			log.Debug("stream acked", "event_id", dec.id, "version", dec.version, "events", dec.done)
		case actBlock:
			how = SettledBlocked
			st.Blocked++
			log.Error("stream blocked", "event_id", failedID(dec.failed), "attempt", c.Retry+1, "error", dec.reason)
		case actRelease:
			how = SettledReleased
			st.Released++
			log.Debug("stream released", "reason", dec.reason)
		case actPostpone:
			how = SettledRetried
			st.Retried++
			st.Unavailable++
			log.Warn("stream retried", "event_id", failedID(dec.failed), "retry", c.Retry, "outage_cycle", d.outages+1, "delay", dec.delay, "error", dec.reason, "unavailable", true)
		case actRetry:
			how = SettledRetried
			st.Retried++
			log.Warn("stream retried", "event_id", failedID(dec.failed), "attempt", c.Retry+1, "delay", dec.delay, "error", dec.reason)
		}
	}
	fwd := dec.done
	switch {
	case err == nil:
	case errors.Is(err, event.ErrLeaseLost):
		how, fwd = SettledLeaseLost, 0
	default:
		how, fwd = SettledError, 0
	}
	d.cfg.Observer.Settled(c.Stream, how, fwd, took)

	switch {
	case err == nil:
		st.Forwarded += dec.done
		d.unhold(c.Stream)
		return nil
	case errors.Is(err, event.ErrLeaseLost):
		st.LeaseLost++
		d.unhold(c.Stream)
		log.Warn("stream lease lost before settling; it will be claimed again", "event_id", failedID(dec.failed), "error", err)
		return nil
	default:
		// The settle may not have been applied, and the lease is still
		// ours: the next cycle ends it (takeBack) rather than wait it out.
		d.unhold(c.Stream)
		d.loseTrack()
		return fmt.Errorf("drain: settle stream %q: %w", c.Stream, err)
	}
}

// unreadableResult turns the handler's result r for a batch that ended just
// before the unreadable event bad into the stream's result: when the
// handler did the whole batch, the stream fails at bad (non-retryable).
// It returns the events the result is about (the batch and bad).
func unreadableResult(b Batch, r Result, bad *event.Event) ([]event.Event, Result) {
	if bad == nil || r.Err != nil || r.Done != len(b.Events) {
		return b.Events, r
	}
	evs := append(b.Events[:len(b.Events):len(b.Events)], *bad)
	return evs, Result{Done: len(b.Events), Err: NonRetryable(bad.Err)}
}

// failureReason is the error recorded on the stream: which event and why.
func failureReason(failed *event.Event, err error) string {
	if failed == nil {
		return err.Error()
	}
	return fmt.Sprintf("event %d (version %d, %s): %v", failed.ID, failed.Version, failed.Name, err)
}

func failedID(failed *event.Event) int64 {
	if failed == nil {
		return 0
	}
	return failed.ID
}

// streamLogger logs with the key stream set, formatting nothing for a
// level that is off.
type streamLogger struct {
	log    *slog.Logger
	stream string
}

func (l streamLogger) Debug(msg string, args ...any) { l.at(slog.LevelDebug, msg, args) }
func (l streamLogger) Warn(msg string, args ...any)  { l.at(slog.LevelWarn, msg, args) }
func (l streamLogger) Error(msg string, args ...any) { l.at(slog.LevelError, msg, args) }

func (l streamLogger) at(level slog.Level, msg string, args []any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, msg, append([]any{"stream", l.stream}, args...)...)
}
