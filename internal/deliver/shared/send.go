package shared

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// minRetry is the pause before an attempt goes again when the settlement
// names none (a POST cut or refused at the lease fence).
const minRetry = 100 * time.Millisecond

// sender is one claimed partition's fanout.Sender: every attempt goes
// through the subscription's attempt.Sender (build, sign, breaker, POST,
// classify), its POST bound by the claim's lease fence.
type sender struct {
	senders *senderSet
	claim   *owner.Claim
	epochs  owner.Epochs
	replica string
	log     *slog.Logger
}

// Attempt implements fanout.Sender.
func (s *sender) Attempt(ctx context.Context, d fanout.Delivery) fanout.Settlement {
	snd := s.senders.get(d.Subscription)
	if snd == nil {
		// Not a subscription of this replica: the members index and the
		// senders are made together, so this is a bug; nothing is sent.
		s.log.Error("shared: no sender for subscription", slog.String("subscription", d.Subscription))
		return fanout.Settlement{Act: fanout.Retry, Delay: time.Second}
	}
	c := attempt.Call{ID: eventID(d.Event.Header), Replica: s.replica, Fence: s.fence, AfterFailure: d.Attempt > 1}
	if d.Ordered {
		c.Order = attempt.OrderFieldsOf(d.Event.Header, d.Previous, d.Partition, d.Epoch)
		if c.Order == nil {
			c.Owner = &attempt.Owner{Partition: d.Partition, Epoch: d.Epoch}
		}
	}
	st := snd.Attempt(ctx, eventMsg{ev: d.Event, attempt: d.Attempt}, d.Attempt, c)
	defer snd.End(st.Trace)
	return s.settle(snd, d, st)
}

// fence is the attempts' attempt.PostFence: the claim's lease fence, and
// the fan-out's context ending (the partition released, its fan-out
// closed) cuts the POST as the lease would, with cause ErrLeasePassed:
// an attempt cut by a hand-over counts for neither the endpoint's
// breaker nor its health, and settles nothing (attempt.ActCut).
func (s *sender) fence(ctx context.Context) (context.Context, context.CancelFunc, error) {
	fctx, done, err := s.claim.Fence.Bound(context.WithoutCancel(ctx))
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithCancelCause(fctx)
	stop := context.AfterFunc(ctx, func() { cancel(attempt.ErrLeasePassed) })
	return cctx, func() {
		stop()
		cancel(nil)
		done()
	}, nil
}

// settle turns an attempt's settlement into the fan-out's, counting the
// outcomes the settler counts (attempt.Sender.Attempt counts the rest).
func (s *sender) settle(snd *attempt.Sender, d fanout.Delivery, st attempt.Settlement) fanout.Settlement {
	delay := max(st.Delay, minRetry)
	switch st.Act {
	case attempt.ActAck:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		return fanout.Settlement{Act: fanout.Delivered}
	case attempt.ActDeadLetter:
		// The dead-letter stream is not wired into the shared engine
		// yet: the event is given up on and said so.
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		s.log.Warn("shared: event given up on (dead letters are not stored by the shared engine yet)",
			slog.String("subscription", d.Subscription), slog.String("subject", d.Event.Subject),
			slog.Uint64("seq", d.Event.Seq), slog.String("reason", st.Reason))
		return fanout.Settlement{Act: fanout.DeadLetter}
	case attempt.ActStale:
		// A receiver processed the stream under a later epoch: this
		// claim is stale. Raise the counter above what it names, and
		// give the partition up.
		snd.Count(st.Outcome, st.Class, st.Response.Status)
		s.epochs.AfterStale(context.Background(), s.log, d.Epoch, st.Response.OrderEpoch)
		s.claim.Lose()
		return fanout.Settlement{Act: fanout.Retry, Delay: delay}
	case attempt.ActRetry, attempt.ActWait, attempt.ActThrottle, attempt.ActDisable:
		snd.Count(st.Outcome, st.Class, st.Response.Status)
	}
	// ActBreakerOpen, ActCut, ActNotSent, ActNotReady: nothing settled.
	return fanout.Settlement{Act: fanout.Retry, Delay: delay}
}

// eventID is the event's id: its Nats-Msg-Id, else its ce-id
// (attempt.EventID, for a reader.Event).
func eventID(h nats.Header) string {
	if id := attempt.HeaderValue(h, wire.HeaderMsgID); id != "" {
		return id
	}
	return attempt.HeaderValue(h, wire.HeaderID)
}

// errNotDelivered is what eventMsg's acknowledgements return: an event
// of the shared read is no JetStream delivery, and nothing acks it.
var errNotDelivered = errors.New("shared: an event of the shared read is not acknowledged")

// eventMsg is a reader.Event as an attempt reads a message: its headers,
// body, subject and metadata (the span's and the record's sequence and
// attempt number). The acknowledgements fail: the positions settle it.
type eventMsg struct {
	ev      reader.Event
	attempt int
}

func (m eventMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.ev.Seq},
		NumDelivered: uint64(max(m.attempt, 1)), Timestamp: m.ev.Time}, nil
}
func (m eventMsg) Data() []byte                     { return m.ev.Data }
func (m eventMsg) Headers() nats.Header             { return m.ev.Header }
func (m eventMsg) Subject() string                  { return m.ev.Subject }
func (m eventMsg) Reply() string                    { return "" }
func (m eventMsg) Ack() error                       { return errNotDelivered }
func (m eventMsg) DoubleAck(context.Context) error  { return errNotDelivered }
func (m eventMsg) Nak() error                       { return errNotDelivered }
func (m eventMsg) NakWithDelay(time.Duration) error { return errNotDelivered }
func (m eventMsg) InProgress() error                { return errNotDelivered }
func (m eventMsg) Term() error                      { return errNotDelivered }
func (m eventMsg) TermWithReason(string) error      { return errNotDelivered }

var _ jetstream.Msg = eventMsg{}
