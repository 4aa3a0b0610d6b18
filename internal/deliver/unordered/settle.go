package unordered

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// handle delivers one message and acks, Naks or Terms it: the unordered
// settler of one attempt (see package attempt). ctx carries no cancellation
// from Run: a delivery that started finishes (bounded by
// Subscription.Timeout), so shutdown loses nothing. rctx is Run's: while
// the subscription is disabled or throttled the message waits in place
// (InProgress), spending no attempt, and goes back at once (Nak) when
// rctx ends first.
func (r *Runner) handle(ctx, rctx context.Context, msg jetstream.Msg) {
	r.inFlight.Inc()
	defer r.inFlight.Dec()

	// The attempt number and the attempts record both read the metadata:
	// parse it once.
	msg = pull.ParsedOnce(msg)
	n := attempt.Number(msg)
	id := attempt.EventID(msg)
	if n > 1 {
		r.redeliveries.Inc()
	}
	hold := func() func() { return r.snd.KeepAlive(id, msg.InProgress) }
	for again := false; ; again = true {
		gen, err := r.snd.Gate(rctx, hold)
		if err != nil {
			pull.Nak(r.log.With(slog.String("event_id", id)), msg, 0)
			return
		}
		if !r.attemptOnce(ctx, msg, id, n, gen, again) {
			return
		}
	}
}

// attemptOnce makes one attempt of msg and settles it; it reports whether
// the message stays in hand for another attempt (throttled, or the
// subscription disabled), which spends no attempt. gen is gate's;
// afterFailure says an attempt before it in hand failed so
// (attempt.Call.AfterFailure).
func (r *Runner) attemptOnce(ctx context.Context, msg jetstream.Msg, id string, n int, gen uint64, afterFailure bool) (again bool) {
	s := r.snd.Attempt(ctx, msg, n, attempt.Call{ID: id, Gen: gen, InProgress: msg.InProgress, AfterFailure: afterFailure})
	defer r.snd.End(s.Trace)
	resp := s.Response
	// The logger with this delivery's attributes is built only when
	// something is logged: slog's With formats them at once, and the common
	// path (a 2xx at info level) logs nothing.
	log := func(more ...any) *slog.Logger {
		return r.log.With(append([]any{slog.String("event_id", id), slog.Int("attempt", n)}, more...)...)
	}
	switch s.Act {
	case attempt.ActBreakerOpen: // no fence here
		l := log()
		l.Debug("circuit breaker open, not sent", slog.Duration("delay", s.Delay))
		pull.Nak(l, msg, s.Delay)
	case attempt.ActAck:
		r.snd.Count(attempt.OutcomeAck, s.Class, resp.Status)
		if err := msg.Ack(); err != nil {
			log().Warn("ack failed; JetStream will redeliver after AckWait", slog.Int("status", resp.Status), slog.Any("error", err))
			return false
		}
		if r.log.Enabled(ctx, slog.LevelDebug) {
			log().Debug("delivered", slog.Int("status", resp.Status))
		}
	case attempt.ActDeadLetter:
		l := log()
		if resp.Status != 0 || resp.Err != nil {
			l = log(slog.Int("status", resp.Status))
		}
		r.giveUp(ctx, s.Trace, l, msg, deadletter.Letter{EventID: id, Attempt: n, Status: resp.Status, Reason: s.Reason, At: resp.At}, s.Outcome, s.Class)
	case attempt.ActRetry:
		r.snd.Count(attempt.OutcomeRetry, s.Class, 0)
		l := log(slog.Int("status", resp.Status))
		l.Warn("delivery failed, will retry", slog.String("reason", s.Reason), slog.Duration("delay", s.Delay))
		pull.Nak(l, msg, s.Delay)
	case attempt.ActWait, attempt.ActStale:
		// An order gate's 409 (an unordered webhook carries no lease
		// epoch, so stale-epoch is unexpected here): never dead-lettered,
		// whatever the attempt.
		r.snd.Count(s.Outcome, s.Class, 0)
		l := log(slog.Int("status", resp.Status))
		l.Info("the receiver's order gate refused the event for now; will retry", slog.String("reason", s.Reason), slog.Duration("delay", s.Delay))
		pull.Nak(l, msg, s.Delay)
	case attempt.ActThrottle, attempt.ActDisable:
		// Sent again in place once the throttle or the enable lets it
		// (gate): no attempt spent, never dead-lettered.
		r.snd.Count(s.Outcome, s.Class, 0)
		if s.Act == attempt.ActDisable {
			log(slog.Int("status", resp.Status)).Warn("endpoint answered 410 Gone: subscription disabled; the event waits, unsent, until `consumer subscriptions enable`")
		} else if r.log.Enabled(ctx, slog.LevelDebug) {
			log(slog.Int("status", resp.Status)).Debug("endpoint asks to slow down; retrying in place", slog.Float64("rate", r.snd.Rate()), slog.Duration("retry_after", s.Delay))
		}
		return true
	}
	return false
}

// giveUp dead-letters msg and Terms it, deciding tr (the attempt) with
// what happened; if the dead letter cannot be stored
// it Naks msg with the backoff delay instead, also after the last attempt:
// the durable consumer has no server-side MaxDeliver, so the message comes
// back and is tried (and, failing, dead-lettered) again.
func (r *Runner) giveUp(ctx context.Context, tr *attempt.Trace, log *slog.Logger, msg jetstream.Msg, dl deadletter.Letter, outcome, class string) {
	dl.Subscription = r.sub.Name
	dl.Endpoint = r.endpoint
	dl.Msg = msg
	if r.deadLetters != nil {
		if err := r.deadLetters.DeadLetter(ctx, dl); err != nil {
			delay := r.snd.RetryDelay(dl.Attempt, -1)
			log.Error("dead letter failed; will retry the delivery", slog.String("reason", dl.Reason), slog.Any("error", err), slog.Duration("delay", delay))
			tr.Decide(attempt.OutcomeRetry, class, dl.Reason+" (dead letter failed: "+err.Error()+")")
			r.deliveries.WithLabelValues(r.sub.Name, attempt.OutcomeRetry, class).Inc()
			pull.Nak(log, msg, delay)
			return
		}
	}
	r.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
	tr.Decide(outcome, class, dl.Reason)
	if r.deadLetters != nil {
		r.deadLettered.Inc()
	}
	log.Error("delivery failed for good, terminated", slog.String("outcome", outcome), slog.String("reason", dl.Reason))
	if err := msg.TermWithReason(dl.Reason); err != nil {
		log.Warn("term failed; JetStream will redeliver after AckWait", slog.Any("error", err))
	}
}
