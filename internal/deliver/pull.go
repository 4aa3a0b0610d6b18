package deliver

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pulled is one result of a partition's pull iterator.
type pulled struct {
	msg jetstream.Msg
	err error
}

// pullWait bounds one Next call of a partition's reader. It must exceed
// two pull heartbeats (partitionHeartbeat): nats.go watches a pull's
// idle heartbeats only while a Next call waits, and only then notices
// that the pull requests it counts as pending are gone (lost with a
// server that died, or with a consumer leader that moved) and issues new
// ones. Next calls shorter than that never notice, and the partition
// would receive nothing more, not even the redeliveries its fence waits
// for.
const pullWait = 4 * partitionHeartbeat

// readPull calls iter.Next, each call waiting up to pullWait, and sends
// every message and error other than a timeout on the returned channel
// (buffered for buffer results), until iter ends (ErrMsgIteratorClosed,
// sent too) or stop is closed. A message read once nobody receives any
// more (stop closed) goes to nak.
//
// The buffer lets Next keep emptying the client's pull buffer while the
// run loop waits (on a consumer info request during a failover): nats.go
// drops what overflows that buffer ("slow consumer"), and after a
// reconnect the server may answer the pull requests of before and after
// it. Two batches absorb that; more would only keep messages out of
// JetStream, with no InProgress.
func readPull(iter jetstream.MessagesContext, stop <-chan struct{}, buffer int, nak func(jetstream.Msg)) <-chan pulled {
	out := make(chan pulled, buffer)
	go func() {
		for {
			msg, err := iter.Next(jetstream.NextMaxWait(pullWait))
			if errors.Is(err, nats.ErrTimeout) {
				select {
				case <-stop:
					return
				default:
					continue
				}
			}
			select {
			case out <- pulled{msg, err}:
			case <-stop:
				if msg != nil {
					nak(msg)
				}
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
		}
	}()
	return out
}

// partitionHeartbeat is the idle heartbeat of a partition's pull
// requests: half their expiry, the most nats.go allows. The server
// expires a request before it would send a heartbeat at its expiry, so
// an idle pull request (5 s) brings one heartbeat, where pull.Heartbeat
// (2 s) brought two: 1,600 idle partitions (100 ordered subscriptions)
// were 640 heartbeat messages a second of the replica's 2,830. A pull
// request lost on the server's side is noticed after two missed
// heartbeats: 5 s instead of 4 s.
const partitionHeartbeat = pullExpiry / 2

// partitionPullOpts are the options of a partition's pull iterator:
// batches of up to batch messages, pinned in partitionGroup, each pull
// request waiting up to pullExpiry.
func partitionPullOpts(batch int) []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{
		jetstream.PullMaxMessages(batch), jetstream.PullHeartbeat(partitionHeartbeat),
		jetstream.PullExpiry(pullExpiry), jetstream.PullPriorityGroup(partitionGroup),
		jetstream.WithMessagesErrOnMissingHeartbeat(false),
	}
}
