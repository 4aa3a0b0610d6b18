package deliver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/wire"
)

// One attempt, one path: both settlers, runner.handle (unordered: ack, Nak
// with a delay, dead letter) and partition.deliver (ordered: ack, retry in
// place, dead letter and park), build the request with request, send it
// with send and read what the response means for the message from settlementOf.
// What each does with the message afterwards is its own.

// act is what a settler does with the message after an attempt.
type act int

const (
	actAck        act = iota // 2xx: ack
	actRetry                 // retryable and attempts left: try again after delay
	actDeadLetter            // permanent, or retryable on the last attempt: dead-letter
)

// settlement is what one attempt's response means for its message, by the
// webhook contract (response.verdict) with MaxDeliver and the backoff
// applied: the act, the outcome and status_class labels, the reason ("" when
// acked) and, for actRetry, the delay before the next attempt.
type settlement struct {
	act     act
	outcome string
	class   string
	reason  string
	delay   time.Duration
}

// settlementOf decides what resp, the answer to attempt (1-based) of a
// subscription with maxDeliver attempts (-1 or 0: no limit) and backOff,
// means for its message. A pure function of its arguments.
func settlementOf(resp response, attempt, maxDeliver int, backOff []time.Duration) settlement {
	class := resp.class()
	switch resp.verdict() {
	case verdictAck:
		return settlement{act: actAck, outcome: OutcomeAck, class: class}
	case verdictPermanent:
		return settlement{act: actDeadLetter, outcome: OutcomeTerm, class: class, reason: resp.reason()}
	}
	if maxDeliver > 0 && attempt >= maxDeliver {
		return settlement{act: actDeadLetter, outcome: OutcomeExhausted, class: class,
			reason: fmt.Sprintf("%s (attempt %d of MaxDeliver %d)", resp.reason(), attempt, maxDeliver)}
	}
	return settlement{act: actRetry, outcome: OutcomeRetry, class: class, reason: resp.reason(), delay: retryDelay(backOff, attempt, resp.retryAfter)}
}

// retryDelay is the delay before the attempt after attempt: Retry-After when
// the endpoint sent one (capped at MaxRetryAfter), else backOff[attempt-1],
// the last entry repeating.
func retryDelay(backOff []time.Duration, attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter >= 0 {
		return min(retryAfter, MaxRetryAfter)
	}
	i := min(max(attempt-1, 0), len(backOff)-1)
	return backOff[i]
}

// errNoEventID is the reason a message without an event id is
// dead-lettered.
var errNoEventID = errors.New("message has no Nats-Msg-Id or ce-id")

// attemptNumber is msg's attempt, 1-based: JetStream's delivery count.
func attemptNumber(msg jetstream.Msg) int {
	if md, err := msg.Metadata(); err == nil {
		return int(md.NumDelivered)
	}
	return 1
}

// request builds the webhook of msg (event id id): its headers (the
// subscription's, Jsbridge-Replica when replica is not "", the body's) and
// body. An error means msg cannot become a webhook (no event id, a
// malformed attribute or body): the settlers dead-letter it, OutcomeTerm.
func (r *runner) request(msg jetstream.Msg, id, replica string) ([]byte, http.Header, error) {
	if id == "" {
		return nil, nil, errNoEventID
	}
	hdr := r.requestHeader()
	if replica != "" {
		hdr.Set(wire.HeaderReplica, replica)
	}
	body, err := buildBody(r.sub.Body, id, msg.Headers(), msg.Data(), hdr)
	if err != nil {
		return nil, nil, err
	}
	return body, hdr, nil
}

// send POSTs the request through the endpoint's circuit breaker and
// records what happened on at (the attempt's span and record). refused is
// true when the breaker let nothing through (open, or a half-open probe
// already running); resp is then the zero response. inProgress, when not
// nil, is called every AckWait/2 while the POST runs.
func (r *runner) send(ctx context.Context, at *attemptState, inProgress func() error, id string, body []byte, hdr http.Header) (resp response, refused bool) {
	at.sending()
	err := r.br.Execute(func() error {
		resp = r.post(ctx, inProgress, id, body, hdr)
		at.answered(resp)
		return resp.breakerErr()
	})
	return resp, errors.Is(err, breaker.ErrOpen)
}

// count counts one attempt's outcome in
// jsbridge_consumer_deliveries_total; status is the HTTP status of an ack.
func (r *runner) count(outcome, class string, status int) {
	if outcome == OutcomeAck && status/100 == 2 {
		r.acked2xx().Inc()
		return
	}
	r.metrics.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
}
