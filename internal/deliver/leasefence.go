package deliver

import (
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// The sender's fence: owner.Fence, and more. Past its lease deadline (on
// the injected clock, and the wall clock: see owner.Fence) a partition
// starts no POST, sends no InProgress, acks and Naks nothing and pulls
// nothing: its messages go back to JetStream by AckWait (or the next
// owner's reset). Acks and InProgress are also never sent while the NATS
// connection is down: nats.go would buffer them and flush them after the
// reconnect, maybe long after the lease ended (an ack not sent leaves the
// message pending: it is redelivered and the receiver deduplicates it).

// errLeasePassed is why a POST, an ack, a Nak or an InProgress was not
// sent (or a POST was cut): the lease deadline passed, or the lease was
// found taken (owner.ErrLeasePassed, which attempt.ErrLeasePassed
// is).
var errLeasePassed = owner.ErrLeasePassed

// errNotConnected is why an ack or InProgress was not sent.
var errNotConnected = attempt.ErrNotConnected

// leaseFence is a partition's lease fence (owner.Fence: attempts only
// before the deadline, POSTs cut at it) with what only this engine needs
// beside it: acks, Naks, InProgress and pulls only before the deadline,
// and acks and InProgress only while the NATS connection is up.
type leaseFence struct {
	*owner.Fence
	clock clockwork.Clock // the Fence's
	// connStatus is the NATS connection's status (nil: always connected).
	connStatus func() nats.Status
}

// connected reports whether the NATS connection is up right now.
func (lf *leaseFence) connected() bool {
	return lf.connStatus == nil || lf.connStatus() == nats.CONNECTED
}

// mayAck reports whether an ack, Nak or InProgress may be sent now: the
// lease is held and the connection is up; else the reason.
func (lf *leaseFence) mayAck() error {
	if !lf.Held() {
		return errLeasePassed
	}
	if !lf.connected() {
		return errNotConnected
	}
	return nil
}

// inProgress sends m's InProgress when mayAck allows it.
func (lf *leaseFence) inProgress(m jetstream.Msg) error {
	if err := lf.mayAck(); err != nil {
		return err
	}
	return m.InProgress()
}

// nak returns m to JetStream at once when mayAck allows it; else m goes
// back by AckWait.
func (lf *leaseFence) nak(log *slog.Logger, m jetstream.Msg) {
	if err := lf.mayAck(); err != nil {
		log.Debug("not Nak'd; it goes back by AckWait", slog.String("event_id", attempt.EventID(m)), slog.Any("reason", err))
		return
	}
	pull.Nak(log, m, 0)
}

// waitAck waits until an ack may be sent (mayAck) and reports true, or
// false once the partition was released (or its lease lost) with its lease
// deadline passed: nothing is acked after the deadline, and a renewal that
// comes late lets the ack go out then (the stream's next event waits for
// it, so it is not overtaken).
func (lf *leaseFence) waitAck() bool {
	for lf.mayAck() != nil {
		if lf.Context().Err() != nil && !lf.Held() {
			return false
		}
		released := lf.Context().Done()
		if lf.Context().Err() != nil {
			released = nil // released already: acks go on while the lease holds
		}
		select {
		case <-released:
		case <-lf.clock.After(20 * time.Millisecond):
		}
	}
	return true
}
