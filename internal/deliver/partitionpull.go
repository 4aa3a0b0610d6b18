package deliver

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// pausePull stops iter (what the client buffer holds is dropped, not
// Nak'd: it goes back by AckWait, or by the next owner's reset) and its
// reader (closing stop), waits for the lease to be renewed and opens a new
// iterator; nil when the partition was released first. The caller reads
// the new iterator.
func (pt *partition) pausePull(iter jetstream.MessagesContext, stop chan struct{}) jetstream.MessagesContext {
	pt.log.Warn("partition lease deadline passed: pulling nothing more until the lease is renewed")
	iter.Stop()
	close(stop)
	if !pt.lease.WaitLease() {
		return nil
	}
	pt.log.Info("partition lease renewed: pulling again")
	return pt.openPull()
}

// pauseDisabled stops iter while the subscription is disabled: what the
// client buffer and the reader hold is Nak'd (the partition is still
// ours: it comes back when pulling resumes), stop is closed, and once
// enabled a new iterator opens; nil when the partition was released
// first. What is in hand stays, kept alive with InProgress.
func (pt *partition) pauseDisabled(iter jetstream.MessagesContext, pulled <-chan pulled, stop chan struct{}) jetstream.MessagesContext {
	pt.log.Info("subscription disabled: the partition pulls nothing more until it is enabled")
	pt.stopPull(iter, pulled)
	close(stop)
	if pt.health.WaitEnabled(pt.ctx, pt.sub) != nil {
		return nil
	}
	pt.log.Info("subscription enabled: the partition pulls again")
	return pt.openPull()
}

// openPull opens the partition consumer's pull iterator, retrying with
// backoff until it opens; nil when the partition was released first.
func (pt *partition) openPull() jetstream.MessagesContext {
	var pause backoff.Backoff
	for pt.ctx.Err() == nil {
		iter, err := pt.cons.Messages(partitionPullOpts(pt.pullBatch)...)
		if err == nil {
			return iter
		}
		if pull.ConsumerGone(err) {
			// The partition ends; the ownership loop makes the consumer
			// again (ensureConsumer) and claims it anew.
			pt.log.Warn("the partition consumer no longer exists; releasing the partition to create it again", slog.Any("error", err))
			return nil
		}
		d := pause.Next()
		pt.log.Warn("pulling from a partition failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		sleep(pt.ctx, pt.clock, d)
	}
	return nil
}

// stopPull drains iter: the reader returns what was buffered (each
// message Nak'd for the next owner), then ends; what it reads after
// stopReading it Naks itself.
func (pt *partition) stopPull(iter jetstream.MessagesContext, in <-chan pulled) {
	iter.Drain()
drain:
	for {
		select {
		case p := <-in:
			if p.err != nil {
				break drain
			}
			pt.lease.nak(pt.log, p.msg)
		case <-time.After(time.Second):
			break drain
		}
	}
	iter.Stop()
}

// read reads iter on its own goroutine (readPull), with room for two pull
// batches; a message read once stop is closed is Nak'd.
func (pt *partition) read(iter jetstream.MessagesContext, stop <-chan struct{}) <-chan pulled {
	return readPull(iter, stop, 2*pt.pullBatch, func(m jetstream.Msg) { pt.lease.nak(pt.log, m) })
}
