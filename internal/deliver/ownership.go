package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/wire"
)

// orderedRunner is an ordered subscription's state on this replica.
type orderedRunner struct {
	r      *runner
	o      *ordering // the state the ordered subscriptions share
	clock  clockwork.Clock
	inHand *handGate            // events in the lanes of all partitions, against handLimit
	cons   []jetstream.Consumer // one per partition, set by createConsumers (and ensureConsumer)
	// created are the partition consumers' configs as createConsumers
	// made or found them: where one deleted before it acked anything is
	// made again from (ensureConsumer).
	created []jetstream.ConsumerConfig
	// replicas is the replica count new partition consumers get.
	replicas int
	parts    []*partition  // owned partitions; nil where not owned
	slots    chan struct{} // bounds concurrent POSTs to MaxInFlight

	parking *park.Parking // the parked streams and the events held behind them

	streamMu sync.Mutex
	stream   jetstream.Stream // the partitioned stream, once looked up (copyStream)
}

// handLimit bounds the events in this subscription's lanes on this
// replica (running, waiting for a slot, or queued behind their stream's
// running one): 8 × MaxInFlight, enough to keep MaxInFlight POSTs busy
// over many streams; more would only wait here, kept alive with
// InProgress, instead of in JetStream. A new owner's fence and released
// held events may go over it.
func (or *orderedRunner) handLimit() int64 { return 8 * int64(or.r.sub.MaxInFlight) }

// pullBatch is each partition's client pull buffer: MaxInFlight shared by
// the partitions, at least 8.
func (or *orderedRunner) pullBatch() int {
	return max(8, 2*or.r.sub.MaxInFlight/len(or.parts))
}

func newOrderedRunner(r *runner, o *ordering, partitions int) *orderedRunner {
	or := &orderedRunner{
		r:       r,
		o:       o,
		clock:   r.clock,
		cons:    make([]jetstream.Consumer, partitions),
		created: make([]jetstream.ConsumerConfig, partitions),
		parts:   make([]*partition, partitions),
		slots:   make(chan struct{}, r.sub.MaxInFlight),
		parking: newParking(r, o),
	}
	or.inHand = newHandGate(or.handLimit())
	return or
}

// consumerConfig is partition p's durable pull consumer: the subscription's
// filters on partition p of the partitioned stream. As for OrderingNone,
// MaxDeliver is enforced by deliver (in place), not by the server.
func (or *orderedRunner) consumerConfig(o *ordering, p int) (jetstream.ConsumerConfig, error) {
	s := or.r.sub
	filters := make([]string, len(s.FilterSubjects))
	for i, f := range s.FilterSubjects {
		var err error
		if filters[i], err = wire.OrderedFilter(o.eventsPrefix, p, f); err != nil {
			return jetstream.ConsumerConfig{}, err
		}
	}
	return jetstream.ConsumerConfig{
		Durable:        wire.PartitionDurable(s.Name, p),
		Description:    fmt.Sprintf("jsbridge ordered webhook subscription %s, partition %d, to %s", s.Name, p, or.r.endpoint),
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  s.MaxAckPending,
		// The server's own fence: the lease owner's pulls are pinned, a
		// new owner unpins the old one (so the server refuses its pulls
		// from then on), a release unpins.
		PriorityGroups: []string{partitionGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      pinnedTTL(o.leaseTTL),
	}, nil
}

// partitionGroup is the one priority group of every partition consumer:
// its lease owner pulls pinned in it.
const partitionGroup = "owner"

// pullExpiry is how long a partition's pull request waits on the server:
// the owner sends a new one at least this often, which keeps its pin.
const pullExpiry = 5 * time.Second

// pinnedTTL is a partition consumer's PinnedTTL: the lease TTL, but at
// least twice pullExpiry, so that an idle owner is not unpinned between
// its pull requests. A new owner unpins the old one at once; the TTL
// only frees a pin nobody unpinned.
func pinnedTTL(lease time.Duration) time.Duration { return max(lease, 2*pullExpiry) }

// releaseLease unpins partition p's consumer and deletes its lease (at
// revision rev), when the lease is still this replica's: unpinned first,
// while nobody else can be pinned yet; not unpinned when another replica
// holds the lease now (a partition stopped by a stale-epoch answer before
// its renewal found the lease lost), whose pin it would take away.
func (or *orderedRunner) releaseLease(ctx context.Context, o *ordering, p int, rev uint64) {
	key := wire.LeaseKey(or.r.sub.Name, p)
	if e, err := o.leases.Get(ctx, key); err == nil && e.Revision() == rev {
		_ = or.unpin(ctx, p)
	}
	if err := o.leases.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		or.r.log.Debug("deleting a released lease failed; it expires", slog.Int("partition", p), slog.Any("error", err))
	}
}

// unpin unpins partition p's consumer (its pinned client loses the pin;
// its pulls are refused from then on and the next pull gets it). An
// error is logged and returned: the pin then ends by PinnedTTL.
func (or *orderedRunner) unpin(ctx context.Context, p int) error {
	s, err := or.copyStream(ctx)
	if err == nil {
		err = s.UnpinConsumer(ctx, wire.PartitionDurable(or.r.sub.Name, p), partitionGroup)
	}
	if err != nil {
		or.r.log.Warn("unpinning a partition consumer failed; its pin ends by PinnedTTL", slog.Int("partition", p), slog.Any("error", err))
	}
	return err
}

// resetToAckFloor is a take-over's last step before the new owner pulls
// (after the delivered record's claim and the unpin): when partition p's
// consumer has events pending (a former owner's, in flight, queued or
// unacked when it died or froze), it resets the consumer to its ack floor
// (JetStream's consumer reset, nats-server 2.14 and later): every event
// above the floor is delivered again at once, in stream order, instead of
// each pending one after AckWait. Those the delivered record covers are
// acked without a POST (partition.ackSettledCopy), those of a stream set
// aside are acked out again (asides.takes), the rest were never acked and
// go through the fence and the lanes as usual (docs/ordering.md, "Reset
// on take-over"). Nothing pending: no reset (one consumer info). Not
// unpinned: no reset either (the former owner may still be pinned, and
// would get what comes again).
//
// It returns the last stream sequence the consumer had delivered before
// the reset (0: no reset asked): the reset clears JetStream's delivery
// counts, so an event at or below it counts as delivered before whatever
// its NumDelivered says (failedAttempts). A reset whose answer did not
// come (a timeout, a consumer leader moving) may still be applied later:
// the sequence is returned all the same, and the partition takes what
// comes again then as any redelivery (a delivery sequence that goes back
// puts it behind its fence; copies of events in hand or settled are
// dropped or acked).
func (or *orderedRunner) resetToAckFloor(ctx context.Context, p int) uint64 {
	log := or.r.log.With(slog.Int("partition", p))
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := or.cons[p].Info(ctx)
	if err != nil {
		log.Warn("reading the partition consumer before the take-over failed; not reset: a former owner's unacked events come back after AckWait", slog.Any("error", err))
		return 0
	}
	if info.NumAckPending == 0 {
		return 0
	}
	durable := wire.PartitionDurable(or.r.sub.Name, p)
	if _, err := or.r.js.ResetConsumer(ctx, or.o.stream(), durable); err != nil {
		log.Warn("resetting the partition consumer to its ack floor failed; a former owner's unacked events come back after AckWait",
			slog.String("durable", durable), slog.Int("pending", info.NumAckPending), slog.Any("error", err))
		return info.Delivered.Stream
	}
	log.Info("partition consumer reset to its ack floor: the events pending on it come again at once",
		slog.Int("pending", info.NumAckPending), slog.Uint64("ack_floor", info.AckFloor.Stream), slog.Uint64("delivered", info.Delivered.Stream))
	return info.Delivered.Stream
}

// is claimed or released, only renewed).
// renewed, when not nil, is p's lease renewal made for this cycle by
// renewAll; step renews it itself otherwise.
func (or *orderedRunner) step(ctx context.Context, o *ordering, p int, want, unknown bool, start time.Time, renewed *renewal) {
	key := wire.LeaseKey(or.r.sub.Name, p)
	self := []byte(o.cfg.ReplicaID)
	pt := or.parts[p]
	ttl := o.leaseTTL
	if pt != nil && renewed != nil && renewed.err == nil {
		pt.rev = renewed.rev // a finished partition releases this revision
	}
	if pt != nil && !pt.lost && pt.record.lostLease() {
		// A write of its delivered record found it taken: another
		// replica claimed the partition (the partition stopped itself).
		pt.lost = true
	}
	switch {
	case pt != nil && pt.finished():
		// A partition ends when its consumer was deleted (among other
		// causes): it is made again before the partition is claimed anew.
		or.ensureConsumer(ctx, o, p, pt.watch.floor.Load())
		if !pt.lost {
			or.releaseLease(ctx, o, p, pt.rev)
		}
		or.parts[p] = nil
	case pt != nil && pt.lost:
		// Waiting for its deliveries to end; the lease is someone else's.
	case pt != nil:
		var rev uint64
		var err error
		if renewed != nil {
			rev, err = renewed.rev, renewed.err
		} else {
			rev, err = o.leases.Update(ctx, key, self, pt.rev)
		}
		switch {
		case err == nil:
			pt.rev = rev
			pt.lease.SetDeadline(start.Add(ttl - ttl/4))
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			or.r.log.Warn("partition lease lost (expired or taken); stopping it: nothing more is sent, acked or Nak'd", slog.Int("partition", p), slog.Any("error", err))
			pt.lost = true
			pt.lease.Lose() // before the release: acks stop now, not at the old deadline
			pt.release()
		case !errors.Is(ctx.Err(), context.Canceled): // not shutdown
			o.warns.Warn(or.r.log, or.r.sub.Name, "renewing a partition lease failed", slog.Int("partition", p), slog.Any("error", err))
		}
		if !want && !unknown && !pt.lost {
			or.r.log.Info("releasing partition: another replica's share now", slog.Int("partition", p))
			pt.release()
			go wakeOnFinish(pt.done, o.cycleNow)
		}
	case want:
		rev, err := o.leases.Create(ctx, key, self)
		if err != nil {
			if !errors.Is(err, jetstream.ErrKeyExists) {
				o.warns.Warn(or.r.log, or.r.sub.Name, "claiming a partition lease failed", slog.Int("partition", p), slog.Any("error", err))
			}
			return
		}
		epoch, err := o.epochs.Next(ctx, rev)
		if err != nil {
			o.warns.Warn(or.r.log, or.r.sub.Name, "giving a claimed partition its lease epoch failed; releasing the lease", slog.Int("partition", p), slog.Any("error", err))
			if err := o.leases.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
				or.r.log.Debug("deleting an unused lease failed; it expires", slog.Int("partition", p), slog.Any("error", err))
			}
			return
		}
		// The delivered record: what the former owners settled; once this
		// replica wrote it, their writes (and so their acks) fail.
		rec, err := or.claimRecord(ctx, p)
		if err != nil {
			o.warns.Warn(or.r.log, or.r.sub.Name, "claiming a partition's delivered record failed; releasing the lease", slog.Int("partition", p), slog.Any("error", err))
			if err := o.leases.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
				or.r.log.Debug("deleting an unused lease failed; it expires", slog.Int("partition", p), slog.Any("error", err))
			}
			return
		}
		// The previous owner (crashed, frozen, cut off) may still be
		// pinned: from now on the server refuses its pulls. Then what it
		// left pending comes again at once, not after AckWait.
		var resetThrough uint64
		if or.unpin(ctx, p) == nil {
			resetThrough = or.resetToAckFloor(ctx, p)
		}
		pt = or.newPartition(p, rev, epoch, start.Add(ttl-ttl/4), rec, resetThrough)
		or.parts[p] = pt
		or.r.metrics.handovers.WithLabelValues(or.r.sub.Name).Inc()
		or.r.log.Info("partition taken", slog.Int("partition", p))
		go pt.run()
	}
}

// wakeOnFinish starts the next ownership cycle (cycleNow) once a
// partition released to another replica finished (done closed): the cycle
// deletes its lease, which the other replica may then claim. Waiting for
// the next cycle instead left the partition with no owner for up to
// TTL/4 more (2.5 s with the default TTL) at every hand-over.
func wakeOnFinish(done <-chan struct{}, cycleNow chan<- struct{}) {
	<-done
	select {
	case cycleNow <- struct{}{}:
	default: // a cycle is due already
	}
}

// renewal is the answer to renewing one partition's lease: its new
// revision, or the error.
type renewal struct {
	rev uint64
	err error
}

// renewAll renews the leases of the partitions this replica holds (not
// lost, not finished) all at once, and returns the answers by partition
// for step. One after the other, 16 renewals under load took long enough
// that the next cycle's came after the leases' deadlines (start + 3/4 of
// the TTL), and every partition stopped pulling until then (pausePull):
// with 2 replicas sharing the machine with the server, the steady ordered
// rate fell to a third.
// A renewed lease's deadline moves at once (from start, the cycle's
// start, as step moves it), not after the membership listing.
func (or *orderedRunner) renewAll(ctx context.Context, o *ordering, start time.Time) map[int]*renewal {
	self := []byte(o.cfg.ReplicaID)
	out := map[int]*renewal{}
	var wg sync.WaitGroup
	for p, pt := range or.parts {
		if pt == nil || pt.lost || pt.finished() {
			continue
		}
		rn := &renewal{}
		out[p] = rn
		key, rev := wire.LeaseKey(or.r.sub.Name, p), pt.rev
		wg.Go(func() { rn.rev, rn.err = o.leases.Update(ctx, key, self, rev) })
	}
	wg.Wait()
	for p, rn := range out {
		if rn.err == nil {
			pt := or.parts[p]
			pt.rev = rn.rev
			pt.lease.SetDeadline(start.Add(o.leaseTTL - o.leaseTTL/4))
		}
	}
	return out
}

// releaseAll releases every owned partition, waits for each (bounded by
// ctx) and deletes its lease.
func (or *orderedRunner) releaseAll(ctx context.Context, o *ordering) {
	for _, pt := range or.parts {
		if pt != nil {
			pt.release()
		}
	}
	for p, pt := range or.parts {
		if pt == nil {
			continue
		}
		select {
		case <-pt.done:
		case <-ctx.Done():
		}
		if !pt.lost {
			or.releaseLease(ctx, o, p, pt.rev)
		}
		or.parts[p] = nil
	}
	or.report()
}

// ownedOrReleasing returns the partitions this replica has a partition
// for: owned, being released, or lost and still ending.
func (or *orderedRunner) ownedOrReleasing() []int {
	var ps []int
	for p, pt := range or.parts {
		if pt != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// report sets the partitions-owned gauge.
func (or *orderedRunner) report() {
	n := 0
	for _, pt := range or.parts {
		if pt != nil && !pt.lost {
			n++
		}
	}
	or.r.metrics.partitionsOwned.WithLabelValues(or.r.sub.Name).Set(float64(n))
}

// claimRecord reads and claims partition p's delivered record
// (deliveredRecord.claim) for this replica.
func (or *orderedRunner) claimRecord(ctx context.Context, p int) (*deliveredRecord, error) {
	s, err := or.copyStream(ctx)
	if err != nil {
		return nil, err
	}
	rec := newDeliveredRecord(or.o.parks, wire.DeliveredKey(or.r.sub.Name, p), or.o.cfg.ReplicaID, s.CachedInfo().Created, or.clock, or.r.log.With(slog.Int("partition", p)))
	if err := rec.claim(ctx); err != nil {
		return nil, err
	}
	return rec, nil
}

// newPartition makes partition p of the subscription, its lease created
// at KV revision rev under epoch (owner.Epochs.Next) and held until
// deadline, with its claimed delivered record rec; resetThrough is what
// resetToAckFloor returned.
func (or *orderedRunner) newPartition(p int, rev, epoch uint64, deadline time.Time, rec *deliveredRecord, resetThrough uint64) *partition {
	// createConsumers made the partition consumers from the same config.
	cfg, _ := or.consumerConfig(or.o, p)
	d := partitionDeps{
		inHand: or.inHand, pullBatch: or.pullBatch(), r: or.r, parking: or.parking, clock: or.clock, log: or.r.log, eventsPrefix: or.o.eventsPrefix, filters: cfg.FilterSubjects,
		attempts:   failedAttempts{kv: or.o.parks, sub: or.r.sub.Name, log: or.r.log, resetThrough: resetMark(resetThrough)},
		checkEvery: ordercopy.CheckEvery(or.o.leaseTTL), slots: or.slots, copyStream: or.copyStream,
		record: rec, sendAck: or.o.cfg.sendAck,
		epoch: epoch, epochs: or.o.epochs, stuckAfter: or.o.cfg.OrderStuckAfter, parks: or.o.parks,
		reset: func(ctx context.Context) uint64 { return or.resetToAckFloor(ctx, p) },
	}
	cs := chainSource{
		js: or.r.js, copyName: or.o.stream(), eventsPrefix: or.o.eventsPrefix, sub: or.r.sub.Name,
		filters: cfg.FilterSubjects, from: chainStart(or.created[p]), parks: or.o.parks,
	}
	d.chain = cs.previous
	d.skipped = func(ctx context.Context, streamKey string, version, previous int64) error {
		return deadletter.RecordSkipped(ctx, or.o.parks, or.r.sub.Name, streamKey, version, previous)
	}
	if nc := or.r.js.Conn(); nc != nil {
		d.connStatus = nc.Status
	}
	return newPartition(d, p, or.cons[p], rev, deadline)
}
