package deliver

import (
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The sender's fence. Past its lease deadline (on the injected clock) a
// partition starts no POST, sends no InProgress, acks and Naks nothing and
// pulls nothing: its messages go back to JetStream by AckWait (or the next
// owner's reset). Acks and InProgress are also never sent while the NATS
// connection is down: nats.go would buffer them and flush them after the
// reconnect, maybe long after the lease ended (an ack not sent leaves the
// message pending: it is redelivered and the receiver deduplicates it).

// errLeasePassed is why an InProgress was not sent past the deadline.
var errLeasePassed = errors.New("partition lease deadline passed")

// errNotConnected is why an ack or InProgress was not sent.
var errNotConnected = errors.New("NATS connection not connected (an ack or InProgress would wait in the reconnect buffer)")

// leaseHeld reports whether the partition's lease deadline has not passed.
// A released partition keeps its lease (renewed) until its deliveries end.
func (pt *partition) leaseHeld() bool {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.clock.Now().Before(pt.deadline)
}

// connected reports whether the NATS connection is up right now.
func (pt *partition) connected() bool {
	return pt.connStatus == nil || pt.connStatus() == nats.CONNECTED
}

// mayAck reports whether an ack, Nak or InProgress may be sent now: the
// lease is held and the connection is up; else the reason.
func (pt *partition) mayAck() error {
	if !pt.leaseHeld() {
		return errLeasePassed
	}
	if !pt.connected() {
		return errNotConnected
	}
	return nil
}

// inProgress sends m's InProgress when mayAck allows it.
func (pt *partition) inProgress(m jetstream.Msg) error {
	if err := pt.mayAck(); err != nil {
		return err
	}
	return m.InProgress()
}

// nak returns m to JetStream at once when mayAck allows it; else m goes
// back by AckWait.
func (pt *partition) nak(log *slog.Logger, m jetstream.Msg) {
	if err := pt.mayAck(); err != nil {
		log.Debug("not Nak'd; it goes back by AckWait", slog.String("event_id", eventID(m)), slog.Any("reason", err))
		return
	}
	nak(log, m, 0)
}

// waitAck waits until an ack may be sent (mayAck) and reports true, or
// false once the partition was released (or its lease lost) with its lease
// deadline passed: nothing is acked after the deadline, and a renewal that
// comes late lets the ack go out then (the stream's next event waits for
// it, so it is not overtaken).
func (pt *partition) waitAck() bool {
	for pt.mayAck() != nil {
		if pt.ctx.Err() != nil && !pt.leaseHeld() {
			return false
		}
		released := pt.ctx.Done()
		if pt.ctx.Err() != nil {
			released = nil // released already: acks go on while the lease holds
		}
		select {
		case <-released:
		case <-pt.clock.After(20 * time.Millisecond):
		}
	}
	return true
}

// pausePull stops iter (what the client buffer holds is dropped, not
// Nak'd: it goes back by AckWait, or by the next owner's reset) and its
// reader (closing stop), waits for the lease to be renewed and opens a new
// iterator; nil when the partition was released first. The caller reads
// the new iterator.
func (pt *partition) pausePull(iter jetstream.MessagesContext, stop chan struct{}) jetstream.MessagesContext {
	pt.log.Warn("partition lease deadline passed: pulling nothing more until the lease is renewed")
	iter.Stop()
	close(stop)
	if !pt.waitLease() {
		return nil
	}
	pt.log.Info("partition lease renewed: pulling again")
	return pt.openPull()
}

// pullOpts are the options of the partition's pull iterator: pinned in
// partitionGroup, each pull request waiting up to pullExpiry.
func (pt *partition) pullOpts() []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{
		jetstream.PullMaxMessages(pt.or.pullBatch()), jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.PullExpiry(pullExpiry), jetstream.PullPriorityGroup(partitionGroup),
		jetstream.WithMessagesErrOnMissingHeartbeat(false),
	}
}
