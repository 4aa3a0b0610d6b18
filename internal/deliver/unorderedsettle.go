package deliver

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
)

// handle delivers one message and acks, Naks or Terms it: the unordered
// settler of one attempt (see attempt.go). ctx carries no cancellation
// from Run: a delivery that started finishes (bounded by
// Subscription.Timeout), so shutdown loses nothing. rctx is Run's: while
// the subscription is disabled or throttled the message waits in place
// (InProgress), spending no attempt, and goes back at once (Nak) when
// rctx ends first.
func (r *runner) handle(ctx, rctx context.Context, msg jetstream.Msg) {
	r.inFlight.Inc()
	defer r.inFlight.Dec()

	// The attempt number and the attempts record both read the metadata:
	// parse it once.
	msg = parsedOnce(msg)
	attempt := attemptNumber(msg)
	id := eventID(msg)
	if attempt > 1 {
		r.redeliveries.Inc()
	}
	hold := func() func() { return r.keepAlive(id, msg.InProgress) }
	for {
		gen, err := r.gate(rctx, hold)
		if err != nil {
			nak(r.log.With(slog.String("event_id", id)), msg, 0)
			return
		}
		if !r.attemptOnce(ctx, msg, id, attempt, gen) {
			return
		}
	}
}

// attemptOnce makes one attempt of msg and settles it; it reports whether
// the message stays in hand for another attempt (throttled, or the
// subscription disabled), which spends no attempt. gen is gate's.
func (r *runner) attemptOnce(ctx context.Context, msg jetstream.Msg, id string, attempt int, gen uint64) (again bool) {
	ctx, at := r.startAttempt(ctx, msg, id, attempt)
	defer r.endAttempt(at)
	// The logger with this delivery's attributes is built only when
	// something is logged: slog's With formats them at once, and the common
	// path (a 2xx at info level) logs nothing.
	log := func(more ...any) *slog.Logger {
		return r.log.With(append([]any{slog.String("event_id", id), slog.Int("attempt", attempt)}, more...)...)
	}

	body, hdr, err := r.request(msg, id, "")
	if err != nil {
		r.giveUp(ctx, log(), msg, deadletter.Letter{EventID: id, Attempt: attempt, Reason: err.Error()}, OutcomeTerm, ClassNone)
		return false
	}
	resp, refused := r.send(ctx, at, msg.InProgress, gen, id, body, hdr, nil, nil)
	if refused {
		at.decide(OutcomeBreakerOpen, ClassNone, "circuit breaker open: not sent")
		delay := r.br.OpenTimeout()
		r.count(OutcomeBreakerOpen, ClassNone, 0)
		l := log()
		l.Debug("circuit breaker open, not sent", slog.Duration("delay", delay))
		nak(l, msg, delay)
		return false
	}

	s := settlementOf(resp, attempt, r.sub.MaxDeliver, r.sub.BackOff)
	switch s.act {
	case actAck:
		at.decide(OutcomeAck, s.class, "")
		r.count(OutcomeAck, s.class, resp.status)
		if err := msg.Ack(); err != nil {
			log().Warn("ack failed; JetStream will redeliver after AckWait", slog.Int("status", resp.status), slog.Any("error", err))
			return false
		}
		if r.log.Enabled(ctx, slog.LevelDebug) {
			log().Debug("delivered", slog.Int("status", resp.status))
		}
	case actDeadLetter:
		r.giveUp(ctx, log(slog.Int("status", resp.status)), msg, deadletter.Letter{EventID: id, Attempt: attempt, Status: resp.status, Reason: s.reason, At: resp.at}, s.outcome, s.class)
	case actRetry:
		at.decide(OutcomeRetry, s.class, s.reason)
		r.count(OutcomeRetry, s.class, 0)
		l := log(slog.Int("status", resp.status))
		l.Warn("delivery failed, will retry", slog.String("reason", s.reason), slog.Duration("delay", s.delay))
		nak(l, msg, s.delay)
	case actWait, actStale:
		// An order gate's 409 (an unordered webhook carries no lease
		// epoch, so stale-epoch is unexpected here): never dead-lettered,
		// whatever the attempt.
		at.decide(s.outcome, s.class, s.reason)
		r.count(s.outcome, s.class, 0)
		l := log(slog.Int("status", resp.status))
		l.Info("the receiver's order gate refused the event for now; will retry", slog.String("reason", s.reason), slog.Duration("delay", s.delay))
		nak(l, msg, s.delay)
	case actThrottle, actDisable:
		// Sent again in place once the throttle or the enable lets it
		// (gate): no attempt spent, never dead-lettered.
		at.decide(s.outcome, s.class, s.reason)
		r.count(s.outcome, s.class, 0)
		if s.act == actDisable {
			log(slog.Int("status", resp.status)).Warn("endpoint answered 410 Gone: subscription disabled; the event waits, unsent, until `consumer subscriptions enable`")
		} else if r.log.Enabled(ctx, slog.LevelDebug) {
			log(slog.Int("status", resp.status)).Debug("endpoint asks to slow down; retrying in place", slog.Float64("rate", r.throttle.rate()), slog.Duration("retry_after", s.delay))
		}
		return true
	}
	return false
}

// giveUp dead-letters msg and Terms it; if the dead letter cannot be stored
// it Naks msg with the backoff delay instead, also after the last attempt:
// the durable consumer has no server-side MaxDeliver, so the message comes
// back and is tried (and, failing, dead-lettered) again.
func (r *runner) giveUp(ctx context.Context, log *slog.Logger, msg jetstream.Msg, dl deadletter.Letter, outcome, class string) {
	dl.Subscription = r.sub.Name
	dl.Endpoint = r.endpoint
	dl.Msg = msg
	if r.deadLetters != nil {
		if err := r.deadLetters.DeadLetter(ctx, dl); err != nil {
			delay := r.retryDelay(dl.Attempt, -1)
			log.Error("dead letter failed; will retry the delivery", slog.String("reason", dl.Reason), slog.Any("error", err), slog.Duration("delay", delay))
			attemptOf(ctx).decide(OutcomeRetry, class, dl.Reason+" (dead letter failed: "+err.Error()+")")
			r.metrics.deliveries.WithLabelValues(r.sub.Name, OutcomeRetry, class).Inc()
			nak(log, msg, delay)
			return
		}
	}
	r.metrics.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
	attemptOf(ctx).decide(outcome, class, dl.Reason)
	if r.deadLetters != nil {
		r.metrics.deadLetters.WithLabelValues(r.sub.Name).Inc()
	}
	log.Error("delivery failed for good, terminated", slog.String("outcome", outcome), slog.String("reason", dl.Reason))
	if err := msg.TermWithReason(dl.Reason); err != nil {
		log.Warn("term failed; JetStream will redeliver after AckWait", slog.Any("error", err))
	}
}
