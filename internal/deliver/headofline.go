package deliver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// headOfLine delivers a partition's events, one lane's head at a time:
// the attempt, retried in place, then the ack or the dead letter (and the
// park). What it sends, acks and Naks goes through the lease fence.
type headOfLine struct {
	ctx     context.Context // the partition's: ends at release
	release func()          // releases the partition
	clock   clockwork.Clock
	log     *slog.Logger
	r       *runner // the subscription's: its sender, dead letters and metrics
	lease   *leaseFence
	book    *handBook
	parking *park.Parking // the subscription's parked streams
	holder  *park.Holder  // the partition, as parking sees it
	// attempts is the subscription's failed POSTs, across owners.
	attempts failedAttempts
	// slots bounds the subscription's POSTs in flight on this replica.
	slots chan struct{}
	// eventsPrefix is the events stream's subject prefix, to name an event
	// as on the events stream (spans, records, dead letters).
	eventsPrefix string
	p            int
	// epoch is the claim's lease epoch (owner.Epochs.Next; renewals leave
	// it): every webhook of the partition carries it as
	// Jsbridge-Lease-Epoch.
	epoch uint64
	// epochs is raised above the receiver's epoch after a stale-epoch
	// answer, before the partition is released.
	epochs owner.Epochs
	// stuckAfter bounds the time a head is refused by the receiver's
	// order gate before it is dead-lettered and parked (0: never).
	stuckAfter time.Duration
	// chain is the partition's version chain: each webhook's
	// Jsbridge-Previous-Version.
	chain *chain
	// record is the partition's delivered record: an event is acked
	// only once a write of it holds the event.
	record *deliveredRecord
	// sendAck sends an ack (nil: the message's Ack; Config.sendAck).
	sendAck func(jetstream.Msg) error
	// skipped records a dead-lettered version of a stream (by its events
	// stream key) and the predecessor it carried in the park bucket
	// (deadletter.RecordSkipped); nil: not recorded.
	skipped func(ctx context.Context, streamKey string, version, previous int64) error
	// aside learns which heads are retried in place, and moves the record
	// of a stream set aside past each event settled (aside.go); nil: no
	// stream is set aside.
	aside *asides
}

// deliver delivers one event of an ordered subscription with head-of-line
// retry: the message stays with this replica (InProgress every AckWait/2)
// while it is retried in place with backoff (Retry-After honoured), so its
// stream's later events, queued behind it in the lane, cannot overtake it;
// other streams' lanes go on. It ends with an ack behind the delivered
// record (2xx), a dead
// letter (then the stream parks or goes on, see DeadLetterPolicy), a Nak
// when the partition is released first, or nothing when the lease
// deadline passed (JetStream redelivers it after AckWait to the next owner).
// MaxDeliver counts POSTs only, across owners (failedAttempts): a Nak at a
// hand-over or an AckWait expiry in a reader's buffer spends no attempt.
func (hl *headOfLine) deliver(m jetstream.Msg) {
	r := hl.r
	key := wire.StreamKey(m.Subject())
	id := attempt.EventID(m)
	stop := r.snd.KeepAlive(id, func() error { return hl.lease.inProgress(m) })
	defer stop()
	defer hl.aside.headEnded(key, m)
	if hl.attempts.redelivered(m) && !isReread(m) {
		r.redeliveries.Inc()
	}
	n, recorded := hl.attempts.first(m, id)
	var lookupPause backoff.Backoff
	log := func(more ...any) *slog.Logger {
		return hl.log.With(append([]any{slog.String("event_id", id), slog.Int("attempt", n)}, more...)...)
	}
	ctx := context.WithoutCancel(hl.ctx)
	// Attempt spans and records name the event as on the events stream,
	// as the dead letters do.
	em := eventsMsg{Msg: m, subject: wire.EventsSubject(hl.eventsPrefix, m.Subject())}
	var refusedSince time.Time // since when the receiver's order gate refuses it (zero: it does not)
	afterFailure := false      // an attempt before failed without spending one (attempt.Call.AfterFailure)
	for {
		if hl.ctx.Err() != nil {
			hl.lease.nak(log(), m)
			return
		}
		if !hl.lease.WaitLease() {
			continue // released: Nak'd above
		}
		if hl.parking.Hold(hl.holder, m) {
			return
		}
		prev, err := hl.chain.previous(hl.ctx, key, m)
		if err != nil {
			if hl.ctx.Err() == nil {
				d := lookupPause.Next()
				log().Warn("looking up the version its stream delivered before it failed; retrying (its stream waits)", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
				sleep(hl.ctx, hl.clock, d)
			}
			continue
		}
		lookupPause.Reset()
		order := attempt.OrderFieldsOf(m.Headers(), prev, hl.p, hl.epoch)
		// The slot it takes bounds the subscription's POSTs in flight on
		// this replica; it is given back once the POST ended.
		ready := func() (uint64, func(), bool) {
			gen, err := r.snd.Gate(hl.ctx, noHold)
			if err != nil || r.br.Wait(hl.ctx) != nil {
				return 0, nil, false // released: Nak'd above
			}
			select {
			case hl.slots <- struct{}{}:
			case <-hl.ctx.Done():
				return 0, nil, false
			}
			if !hl.lease.MayStart() {
				<-hl.slots
				return 0, nil, false // waitLease again
			}
			r.inFlight.Inc()
			return gen, func() { r.inFlight.Dec(); <-hl.slots }, true
		}
		s := r.snd.Attempt(ctx, m, n, attempt.Call{ID: id, Traced: em, Replica: r.replicaID, Order: order,
			Owner: &attempt.Owner{Partition: hl.p, Epoch: hl.epoch}, Ready: ready, Fence: hl.lease.Bound, AfterFailure: afterFailure})
		r.snd.End(s.Trace)
		afterFailure = afterFailure || (s.Trace != nil && s.Act != attempt.ActAck)
		resp := s.Response
		switch s.Act {
		case attempt.ActNotReady, attempt.ActNotSent, attempt.ActBreakerOpen:
			// Released, or the lease to wait for again, or the breaker to
			// wait for again (another lane's probe won; a probe claim
			// against the shared state or a freeze past the deadline).
			// No attempt spent.
			continue
		case attempt.ActCut:
			// Cut at the lease deadline (no renewal in time, or the lease
			// found taken): nothing is settled from it; the lease decides
			// whether it goes again (waitLease) or back to JetStream. No
			// attempt spent.
			log().Warn("the partition's lease deadline passed during the POST; cut, nothing settled from it", slog.Any("error", resp.Err))
			continue
		case attempt.ActDeadLetter:
			if resp.Status == 0 && resp.Err == nil {
				// It cannot become a webhook: no POST.
				hl.deadLetter(m, log(), deadletter.Letter{EventID: id, Attempt: n, Reason: s.Reason}.WithOrder(order), s.Outcome, s.Class)
				hl.forgetAttempts(id, recorded)
				return
			}
		}
		if s.Act != attempt.ActWait {
			refusedSince = time.Time{} // the order gate's refusals must be continuous to count
		}
		switch s.Act {
		case attempt.ActAck:
			r.snd.Count(attempt.OutcomeAck, s.Class, resp.Status)
			if order != nil {
				hl.chain.delivered(key, order.Version)
			}
			hl.ack(m, func() *slog.Logger { return log() })
			hl.forgetAttempts(id, recorded)
			return
		case attempt.ActDeadLetter:
			hl.deadLetter(m, log(slog.Int("status", resp.Status)), deadletter.Letter{EventID: id, Attempt: n, Status: resp.Status, Reason: s.Reason, At: resp.At}.WithOrder(order), s.Outcome, s.Class)
			hl.forgetAttempts(id, recorded)
			return
		case attempt.ActRetry:
			hl.aside.refusedHead(key, m, s.Reason) // its later events may be set aside
			r.snd.Count(attempt.OutcomeRetry, s.Class, 0)
			hl.attempts.failed(id, n)
			recorded = true
			log(slog.Int("status", resp.Status)).Warn("delivery failed, retrying in place (its stream waits)", slog.String("reason", s.Reason), slog.Duration("delay", s.Delay))
			sleep(hl.ctx, hl.clock, s.Delay)
			n++
		case attempt.ActWait:
			// The receiver's order gate waits for an earlier version (or
			// for an earlier attempt of this one to end): retried in
			// place, spending no attempt, up to stuckAfter.
			if refusedSince.IsZero() {
				refusedSince = hl.clock.Now()
			}
			hl.aside.refusedHead(key, m, s.Reason)
			if dl, stuck := attempt.OrderStuck(refusedSince, hl.clock.Now(), hl.stuckAfter, resp, id, n); stuck {
				hl.deadLetter(m, log(slog.Int("status", resp.Status)), dl.WithOrder(order), attempt.OutcomeOrderStuck, s.Class)
				hl.forgetAttempts(id, recorded)
				return
			}
			r.snd.Count(attempt.OutcomeRetry, s.Class, 0)
			if resp.Order == wire.OrderGap {
				// The receiver's last version is not the predecessor sent:
				// the next attempt looks it up again rather than trust
				// what this partition knew (a follower's stale answer,
				// a replay or skip by another process).
				hl.chain.forget(key)
			}
			log(slog.Int("status", resp.Status)).Info("the receiver's order gate refused the event for now; retrying in place", slog.String("reason", s.Reason), slog.Duration("delay", s.Delay),
				slog.String("previous_version", wire.FormatPreviousVersion(prev)), slog.String("receiver_last_version", resp.OrderLast))
			sleep(hl.ctx, hl.clock, s.Delay)
		case attempt.ActThrottle, attempt.ActDisable:
			// Throttled (429, 503 with Retry-After) or disabled (410):
			// sent again in place once gate lets it, spending no attempt.
			r.snd.Count(s.Outcome, s.Class, 0)
			if s.Act == attempt.ActDisable {
				log(slog.Int("status", resp.Status)).Warn("endpoint answered 410 Gone: subscription disabled; the event waits, unsent, until `consumer subscriptions enable`")
			}
		case attempt.ActStale:
			// The receiver processed the stream under a later lease: this
			// replica's lease is stale. Stop the partition; the message
			// goes back unacked (Nak'd above, or AckWait) to the owner.
			r.snd.Count(attempt.OutcomeStaleEpoch, s.Class, 0)
			log(slog.Int("status", resp.Status)).Warn("the receiver's order gate says this replica's partition lease is stale; releasing the partition", slog.String("reason", s.Reason))
			hl.epochs.AfterStale(ctx, log(), hl.epoch, resp.OrderEpoch)
			hl.release()
		}
	}
}

// noHold is gate's hold for a message a keepAlive already keeps.
func noHold() func() { return func() {} }

// forgetAttempts deletes event id's failed attempts count once it
// settled: not when the partition was released first (the ack or the dead
// letter did not happen, and the event comes back to the next owner).
func (hl *headOfLine) forgetAttempts(id string, recorded bool) {
	if hl.ctx.Err() == nil {
		hl.attempts.settled(id, recorded)
	}
}

// ack settles m: when m's stream is set aside, it first moves the
// stream's aside record past m (asides.settle); then it waits until a
// write of the partition's delivered record holds m (so a new owner knows
// m was delivered, whether or not the ack reaches JetStream), records m
// settled, then acks it. An event read again from the copy (isReread)
// moves the record too, but has no consumer ack: it is only marked
// settled for the re-read. The lane sends
// m's successor only after that. When the record is not written (the
// partition was released past its lease deadline, the record was taken
// by a new owner, or 10 writes failed, which releases the partition), m is
// not acked and the lane's later events are returned to JetStream, not
// delivered: m comes back first, to whoever owns the partition next.
//
// log gives the logger of its warnings; it is called only when one is
// logged (slog's With formats a delivery's attributes at once, and an
// ack that succeeds logs nothing).
func (hl *headOfLine) ack(m jetstream.Msg, log func() *slog.Logger) {
	seq := streamSeq(m)
	key := wire.StreamKey(m.Subject())
	// An event read again from the copy (aside.go) is no delivery of the
	// partition consumer: the fence must not count it as acked, and it
	// has no consumer ack to send.
	reread := isReread(m)
	if !reread {
		hl.book.acked(seq, true)
		defer hl.book.acked(seq, false)
	}
	// A stream set aside: its record moves past m before m counts as
	// settled, so that m is never read again once acked.
	var pause backoff.Backoff
	for tries := 1; ; tries++ {
		if !hl.lease.waitAck() {
			log().Warn("not acked: the partition lease ended first; the event comes back to the next owner (the receiver deduplicates it)")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := hl.aside.settle(ctx, m)
		cancel()
		if err == nil {
			break
		}
		if hl.ctx.Err() != nil {
			return
		}
		if tries >= 10 {
			log().Error("moving the record of a stream set aside failed 10 times; releasing the partition so that the event comes back before its successors", slog.Any("error", err))
			hl.release()
			return
		}
		d := pause.Next()
		log().Warn("moving the record of a stream set aside failed; retrying (the stream's next event waits for it)", slog.Any("error", err), slog.Duration("retry_in", d))
		sleep(hl.ctx, hl.clock, d)
	}
	// The delivered record holds live and re-read events alike: a re-read
	// event settled moves its stream's entry, so that a new owner, once
	// the stream is live again, hands its next event on at once.
	err := hl.record.settleAndWait(hl.ctx, key, seq)
	switch {
	case err == nil:
	case errors.Is(err, errRecordLost), errors.Is(err, errLeasePassed):
		log().Warn("not acked: the partition lease ended first; the event comes back to the next owner (the receiver deduplicates it)", slog.Any("reason", err))
		return
	default:
		if hl.ctx.Err() == nil {
			log().Error("writing the delivered record failed 10 times; releasing the partition so that the event comes back before its successors", slog.Any("error", err))
			hl.release()
		}
		return
	}
	if reread {
		_ = m.Ack() // tells the re-read that m settled; nothing is sent
		return
	}
	hl.book.settled(key, seq) // before it leaves acking
	// Not a double ack: the record says m was delivered, and a copy
	// that comes back (its ack lost) is acked without a POST. Sent once
	// the fence allows it (a late renewal), 3 tries: the fence does not
	// count a settled event in hand, so one left pending would hold it
	// until the copy comes back.
	send := jetstream.Msg.Ack
	if hl.sendAck != nil {
		send = hl.sendAck
	}
	for tries := 1; hl.lease.waitAck(); tries++ {
		err := send(m)
		if err == nil || tries >= 3 {
			if err != nil {
				log().Debug("ack not sent; the event comes back and is acked without a POST", slog.Any("error", err))
			}
			return
		}
	}
}

// deadLetter stores the dead letter (retrying in place while the DLQ
// fails), parks the stream when the policy says so, then acks m.
func (hl *headOfLine) deadLetter(m jetstream.Msg, log *slog.Logger, dl deadletter.Letter, outcome, class string) {
	r := hl.r
	dl.Subscription = r.sub.Name
	dl.Endpoint = r.endpoint
	// The dead letter names the event as on the events stream (subject,
	// sequence), as for an unordered subscription.
	dl.Msg = eventsMsg{Msg: m, subject: wire.EventsSubject(hl.eventsPrefix, m.Subject())}
	var pause backoff.Backoff
	for r.deadLetters != nil {
		err := r.deadLetters.DeadLetter(context.WithoutCancel(hl.ctx), dl)
		if err == nil {
			break
		}
		d := pause.Next()
		log.Error("dead letter failed; retrying in place", slog.String("reason", dl.Reason), slog.Any("error", err), slog.Duration("retry_in", d))
		sleep(hl.ctx, hl.clock, d)
		if hl.ctx.Err() != nil {
			// Through the fence: a partition released because its
			// lease was found taken Naks nothing.
			hl.lease.nak(log, m)
			return
		}
	}
	key := wire.StreamKey(m.Subject())
	if v, prev, ok := dl.Chain(); ok && hl.skipped != nil {
		// Not delivered: the stream's next event names v's own
		// predecessor, whoever sends it, unless a replay delivers v first
		// (it forgets the record).
		pause.Reset()
		for {
			err := hl.skipped(context.WithoutCancel(hl.ctx), wire.StreamKey(dl.Msg.Subject()), v, prev)
			if err == nil {
				break
			}
			d := pause.Next()
			log.Error("recording the dead-lettered version for its stream's version chain failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d))
			sleep(hl.ctx, hl.clock, d)
			if hl.ctx.Err() != nil {
				hl.lease.nak(log, m)
				return
			}
		}
	}
	park := (r.sub.OnDeadLetter == subscription.DeadLetterPark || dl.OrderStuck) && dl.EventID != ""
	if park {
		// Replay, skip or unpark decide what the stream's next event
		// names as its predecessor: looked up when it goes.
		hl.chain.forget(key)
		pause.Reset()
		for {
			err := hl.parking.Park(hl.holder, m, dl)
			if err == nil {
				break
			}
			d := pause.Next()
			log.Error("parking the stream failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d))
			sleep(hl.ctx, hl.clock, d)
			if hl.ctx.Err() != nil {
				hl.lease.nak(log, m)
				return
			}
		}
	}
	r.metrics.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
	if r.deadLetters != nil {
		r.metrics.deadLetters.WithLabelValues(r.sub.Name).Inc()
	}
	if dl.Status == http.StatusGone {
		log.Warn("endpoint answered 410 Gone: it says it no longer exists")
	}
	if park {
		log.Error("delivery failed for good, dead-lettered; its stream is parked until `consumer dlq replay` or `consumer dlq skip`", slog.String("outcome", outcome), slog.String("reason", dl.Reason))
	} else {
		log.Error("delivery failed for good, dead-lettered; its stream goes on", slog.String("outcome", outcome), slog.String("reason", dl.Reason))
	}
	hl.ack(m, func() *slog.Logger { return log })
}

// eventsMsg is a message of the partitioned copy seen as the events
// stream's: its subject there and, in its metadata, the origin sequence
// (Nats-Stream-Source) as the stream sequence.
type eventsMsg struct {
	jetstream.Msg
	subject string
}

func (m eventsMsg) Subject() string { return m.subject }

func (m eventsMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := m.Msg.Metadata()
	if err != nil {
		return nil, err
	}
	out := *md
	if seq := wire.SourceSequence(m.Msg.Headers().Get(wire.HeaderSourceInfo)); seq != 0 {
		out.Sequence.Stream = seq
	}
	return &out, nil
}
