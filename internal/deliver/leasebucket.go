package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// buckets are the lease and park buckets' configurations, as provision
// creates them.
type buckets struct {
	js     jetstream.JetStream
	log    *slog.Logger
	leases jetstream.KeyValueConfig
	parks  jetstream.KeyValueConfig
}

// restore creates the lease and park buckets again where they are gone:
// deleted while replicas run (by an operator, or a JetStream store lost).
// The key-value handles the replica holds name their bucket, so they work
// again once it exists; what the deleted buckets held is gone: leases are
// claimed again (their epochs come from the park bucket's epoch counter,
// not from the lease bucket's revisions, see leaseEpochs), and a park
// entry lost lets its stream's held events go on.
func (b buckets) restore(ctx context.Context) {
	for _, cfg := range []jetstream.KeyValueConfig{b.leases, b.parks} {
		if _, err := b.js.KeyValue(ctx, cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
			continue
		}
		if _, err := bucket(ctx, b.js, cfg); err != nil {
			b.log.Warn("a key-value bucket of ordered delivery is gone; creating it again failed, retrying at the next round",
				slog.String("bucket", cfg.Bucket), slog.Any("error", err))
			continue
		}
		b.log.Warn("a key-value bucket of ordered delivery was deleted while this replica ran; created it again",
			slog.String("bucket", cfg.Bucket))
	}
}

// bucketGone reports whether err says a key-value bucket's stream does
// not exist (a KV watch or listing reports nats.ErrStreamNotFound, of
// nats.go's older API).
func bucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// leaseEpochs hands out the lease epochs of partition claims
// (wire.HeaderLeaseEpoch) from a counter in the park bucket
// (wire.EpochKey), which has no TTL and outlives the lease bucket.
//
// Invariant: for one partition, each claim's epoch is above every epoch
// an earlier claim of it used. A claim takes its epoch only after it
// created the partition's lease key (so claims of one partition follow
// each other), and it writes the epoch to the counter with a
// compare-and-set on the revision it read before any webhook carries
// it: a later claim reads that write or a later one (a stale read, of a
// lagging follower, fails the compare-and-set and is read again), so its
// epoch is higher. Nothing here reads a clock, and the lease bucket's
// revisions only set a floor (max with the lease's create revision), so a
// lease bucket made by `nats kv add` (first revision 1), restored from a
// backup, or created again by a replica whose clock is behind gives
// higher epochs all the same.
//
// The counter can be lost with the park bucket, or a receiver may have
// seen higher epochs from another deployment: its gate then answers
// stale-epoch, and raise lifts the counter above the epoch it names
// (wire.HeaderOrderEpoch), or doubles the refused epoch when it names
// none, before the partition is claimed again: a stream is refused for at
// most one claim per raise, never for ever.
type leaseEpochs struct {
	kv jetstream.KeyValue // the park bucket
}

// epochTries bounds the compare-and-set rounds of next and raise: each
// failed round means another claim or raise wrote the counter meanwhile.
const epochTries = 20

// errEpochContended is returned when epochTries compare-and-set rounds
// all lost to other writers.
var errEpochContended = errors.New("the lease epoch counter changed at every try")

// next returns the epoch of a claim whose lease key was created at
// revision rev: the counter plus one, at least rev (epochs given before
// the counter existed were create revisions of the lease bucket), written
// back with a compare-and-set.
func (le leaseEpochs) next(ctx context.Context, rev uint64) (uint64, error) {
	for range epochTries {
		last, at, err := le.read(ctx)
		if err != nil {
			return 0, err
		}
		epoch := max(last+1, rev)
		if err := le.write(ctx, epoch, at); err == nil {
			return epoch, nil
		} else if !casLost(err) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("deliver: lease epoch: %w", errEpochContended)
}

// raise lifts the counter to at least floor, so that the next claim's
// epoch is above it. A counter already there is left alone.
func (le leaseEpochs) raise(ctx context.Context, floor uint64) error {
	for range epochTries {
		last, at, err := le.read(ctx)
		if err != nil {
			return err
		}
		if last >= floor {
			return nil
		}
		if err := le.write(ctx, floor, at); err == nil {
			return nil
		} else if !casLost(err) {
			return err
		}
	}
	return fmt.Errorf("deliver: lease epoch: %w", errEpochContended)
}

// read returns the counter's value and the revision it was read at (0,
// 0 when the key does not exist).
func (le leaseEpochs) read(ctx context.Context) (last, rev uint64, err error) {
	e, err := le.kv.Get(ctx, wire.EpochKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("deliver: read the lease epoch counter (key %q of bucket %q): %w", wire.EpochKey, le.kv.Bucket(), err)
	}
	last, err = strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("deliver: the lease epoch counter (key %q of bucket %q) holds %q, not a base-10 integer: %w", wire.EpochKey, le.kv.Bucket(), e.Value(), err)
	}
	return last, e.Revision(), nil
}

// write sets the counter to v if it is still at revision rev (0: if it
// does not exist).
func (le leaseEpochs) write(ctx context.Context, v, rev uint64) error {
	val := []byte(strconv.FormatUint(v, 10))
	var err error
	if rev == 0 {
		_, err = le.kv.Create(ctx, wire.EpochKey, val)
	} else {
		_, err = le.kv.Update(ctx, wire.EpochKey, val, rev)
	}
	if err != nil && !casLost(err) {
		return fmt.Errorf("deliver: write the lease epoch counter (key %q of bucket %q): %w", wire.EpochKey, le.kv.Bucket(), err)
	}
	return err
}

// casLost reports whether a key-value Create or Update failed because the
// key changed since it was read.
func casLost(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// refusedEpochFloor is what the counter is raised to after a receiver
// answered stale-epoch to a webhook sent under epoch: the highest epoch
// it processed for the stream (wire.HeaderOrderEpoch) when it named one,
// else twice the refused epoch (a receiver that names nothing is passed
// after a few refusals, by at most twice its epoch).
func refusedEpochFloor(epoch, named uint64) uint64 {
	if named > 0 {
		return named
	}
	if epoch > math.MaxUint64/4 {
		return math.MaxUint64 / 2 // doubling would wrap around to a low epoch
	}
	return max(2*epoch, 1)
}

// afterStale raises the counter after a receiver answered stale-epoch to
// a webhook sent under epoch (named: the epoch its answer names, 0 for
// none), before the partition is released: whoever claims it next sends
// above what the receiver processed. A failure is logged; the next
// refusal raises it again.
func (le leaseEpochs) afterStale(ctx context.Context, log *slog.Logger, epoch, named uint64) {
	if le.kv == nil {
		return
	}
	floor := refusedEpochFloor(epoch, named)
	if err := le.raise(ctx, floor); err != nil {
		log.Warn("raising the lease epoch counter after a stale-epoch answer failed; the next refusal raises it again",
			slog.Uint64("epoch", epoch), slog.Uint64("receiver_epoch", named), slog.Any("error", err))
		return
	}
	log.Info("raised the lease epoch counter above the receiver's; the partition's next claim sends above it",
		slog.Uint64("epoch", epoch), slog.Uint64("receiver_epoch", named), slog.Uint64("counter_floor", floor))
}

// memberView is this replica's picture of the lease bucket's membership
// heartbeats (every replica's, for every ordered subscription), kept from
// one long-lived watch of the bucket's member keys. It replaces a listing
// of the bucket per ordered subscription per cycle: a listing is a KV
// watch of its own, so an ephemeral consumer created and deleted each
// time (10 a second per replica at 25 ordered subscriptions, 400 at
// 1,000; a meta-layer proposal each on a cluster). The lease keys are not
// watched: every replica renews each of its leases every TTL/4, so a
// watch of them would bring every replica every other replica's renewals
// (16 per ordered subscription and replica per cycle); a cycle lists one
// subscription's lease keys only when it may claim (ordering.leaseKeys).
//
// Expiry. The bucket's keys expire after its TTL on the server, and an
// expiry sends nothing to a watch (the bucket has no limit markers). The
// view drops a member once the server's clock, as the view estimates it,
// passes the member's last heartbeat (its server timestamp) plus the TTL.
// The estimate is the newest server timestamp the watch brought plus the
// time elapsed since it came, on the injected clock: it runs behind the
// server's clock by the watch's delivery latency, so a member leaves the
// view at or after its key expired on the server, not before, and no
// clock of the replica is compared with the server's. This replica's own
// heartbeats, written every cycle, keep the estimate fresh.
//
// Staleness. The watch is an ordered consumer: nats.go makes it again
// from the next sequence after a gap or missed heartbeats, so nothing is
// missed while the bucket lives; when the bucket's stream is gone the
// watch ends and run starts a new one, which sends every key again. A
// bucket deleted and created again while nats.go was making the watch's
// consumer again would leave the watch past the new bucket's end, seeing
// nothing. So each cycle tells the view the revision of each heartbeat
// Put of this replica (wrote); a view that has not seen one by that
// key's next cycle, twice in a row (check), starts its watch again, and
// the new watch rebuilds the view from the bucket's keys.
//
// One view per replica: a Fleet's ordered units share theirs
// (sharedMemberView). A view per unit would bring every unit every other
// unit's heartbeats: n² deliveries a cycle (250 a second at 25 units).
//
// A view that is late or wrong costs a quota computed from the wrong
// members for a round: a partition unowned for a round, or a claim whose
// KV Create fails; never two owners (the lease key's Create decides).
type memberView struct {
	kv    jetstream.KeyValue
	ttl   time.Duration
	clock clockwork.Clock
	log   *slog.Logger
	// failed is called when the watch could not start (a bucket gone is
	// created again: buckets.restore).
	failed func(ctx context.Context, err error)

	restart chan struct{} // check asks run for a new watch
	loaded  chan struct{} // closed once a watch sent every key the first time

	mu    sync.Mutex
	ready bool // the current watch sent every key; false before, and while a new one starts
	// subs are the members of each subscription: replica id → its last
	// heartbeat as the watch brought it.
	subs map[string]map[string]heartbeat
	// stamp is the newest server timestamp the watch brought, at stampAt
	// on the injected clock: the server's clock estimate (serverNowLocked).
	stamp, stampAt time.Time
	// pending are this replica's last heartbeat writes (key → revision)
	// that the view should have seen by their key's next check; stale
	// counts, by key, the checks in a row that found its write missing.
	pending map[string]uint64
	stale   map[string]int
}

// heartbeat is a member key's last write as the watch brought it: its
// server timestamp and revision.
type heartbeat struct {
	at  time.Time
	rev uint64
}

// errViewNotReady is members' error while the member view's watch has not
// sent every key yet (starting, or starting again).
var errViewNotReady = errors.New("the lease bucket's member watch has not sent every key yet")

// staleChecks is how many checks in a row may find this replica's own
// heartbeat missing from the view before its watch is started again.
const staleChecks = 2

func newMemberView(kv jetstream.KeyValue, ttl time.Duration, clock clockwork.Clock, log *slog.Logger, failed func(context.Context, error)) *memberView {
	return &memberView{kv: kv, ttl: ttl, clock: clock, log: log, failed: failed,
		restart: make(chan struct{}, 1), loaded: make(chan struct{}), subs: map[string]map[string]heartbeat{},
		pending: map[string]uint64{}, stale: map[string]int{}}
}

// run keeps the view until ctx ends: it watches the bucket's member keys,
// rebuilds the view from each new watch's first keys, and starts a new
// watch when one ends or check asks for it.
func (mv *memberView) run(ctx context.Context) {
	first := true
	for ctx.Err() == nil {
		w, err := mv.kv.WatchFiltered(ctx, []string{wire.MemberFilter("")}, jetstream.MetaOnly())
		if err != nil {
			mv.log.Warn("watching the lease bucket's members failed; retrying", slog.Any("error", err))
			mv.failed(ctx, err)
			sleep(ctx, mv.clock, time.Second)
			continue
		}
		mv.follow(ctx, w, &first)
		_ = w.Stop()
		mv.mu.Lock()
		mv.ready = false
		clear(mv.stale)
		mv.mu.Unlock()
	}
}

// follow applies w's entries to the view until w ends, ctx ends or check
// asks for a new watch. The entries before the watch's nil marker are
// the bucket's keys now: they replace the view at the marker.
func (mv *memberView) follow(ctx context.Context, w jetstream.KeyWatcher, first *bool) {
	next := map[string]map[string]heartbeat{} // the keys before the marker
	for {
		var e jetstream.KeyValueEntry
		open := true
		select {
		case e, open = <-w.Updates():
		case <-ctx.Done():
			return
		case <-mv.restart:
			mv.log.Warn("the lease bucket's member watch did not bring this replica's own heartbeat for two cycles; watching it again")
			return
		}
		if !open {
			return // the watch ended (its stream gone): run starts a new one
		}
		mv.mu.Lock()
		if e == nil {
			if next != nil {
				mv.subs, next, mv.ready = next, nil, true
				if *first {
					close(mv.loaded)
					*first = false
				}
			}
			mv.mu.Unlock()
			continue
		}
		subs := mv.subs
		if next != nil {
			subs = next
		}
		mv.applyLocked(subs, e)
		mv.mu.Unlock()
	}
}

// applyLocked records entry e in subs and moves the server clock
// estimate (mv.mu held).
func (mv *memberView) applyLocked(subs map[string]map[string]heartbeat, e jetstream.KeyValueEntry) {
	if at := e.Created(); at.After(mv.stamp) {
		mv.stamp, mv.stampAt = at, mv.clock.Now()
	}
	sub, id, ok := wire.ParseMemberKey(e.Key())
	if !ok {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(subs[sub], id)
		return
	}
	if subs[sub] == nil {
		subs[sub] = map[string]heartbeat{}
	}
	subs[sub][id] = heartbeat{at: e.Created(), rev: e.Revision()}
}

// serverNowLocked is the view's estimate of the server's clock (mv.mu
// held).
func (mv *memberView) serverNowLocked() time.Time {
	return mv.stamp.Add(mv.clock.Since(mv.stampAt))
}

// members returns the ids of subscription's live replicas, sorted, with
// self among them. It fails with errViewNotReady while the watch has not
// sent every key.
func (mv *memberView) members(subscription, self string) ([]string, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if !mv.ready {
		return nil, errViewNotReady
	}
	var members []string
	now := mv.serverNowLocked()
	for id, hb := range mv.subs[subscription] {
		if hb.at.Add(mv.ttl).After(now) {
			members = append(members, id)
		} else {
			delete(mv.subs[subscription], id) // expired on the server
		}
	}
	if !slices.Contains(members, self) {
		members = append(members, self)
	}
	slices.Sort(members)
	return members, nil
}

// wrote tells the view that this replica wrote heartbeat key at revision
// rev: key's next check expects to find it.
func (mv *memberView) wrote(key string, rev uint64) {
	mv.mu.Lock()
	mv.pending[key] = rev
	mv.mu.Unlock()
}

// check compares the view with this replica's last write of heartbeat
// key (wrote): when the view has missed the writes of a key at
// staleChecks checks in a row, the watch is started again. Called at the
// start of the cycle that writes key, so the watch has a cycle (TTL/4) to
// bring each write.
func (mv *memberView) check(key string) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	rev, ok := mv.pending[key]
	if !mv.ready || !ok {
		return
	}
	delete(mv.pending, key)
	sub, id, _ := wire.ParseMemberKey(key)
	if mv.subs[sub][id].rev == rev {
		delete(mv.stale, key)
		return
	}
	if mv.stale[key]++; mv.stale[key] >= staleChecks {
		clear(mv.stale)
		select {
		case mv.restart <- struct{}{}:
		default:
		}
	}
}

// waitLoaded waits until the view's first watch sent every key, ctx
// ends, or d passes on the injected clock.
func (mv *memberView) waitLoaded(ctx context.Context, d time.Duration) {
	t := mv.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-mv.loaded:
	case <-ctx.Done():
	case <-t.Chan():
	}
}

// sharedMemberView is the member view a Fleet's ordered units share: made
// by the first unit that asks for it, run until the Fleet stops.
type sharedMemberView struct {
	mu   sync.Mutex
	ctx  context.Context // the Fleet's run (start)
	view *memberView
	wg   sync.WaitGroup
}

// start sets the context the view runs in once made: the Fleet's run.
func (sv *sharedMemberView) start(ctx context.Context) {
	sv.mu.Lock()
	sv.ctx = ctx
	sv.mu.Unlock()
}

// get returns the shared view; the first call makes it with newView and
// runs it until the context of start ends.
func (sv *sharedMemberView) get(newView func() *memberView) *memberView {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.view == nil {
		mv, ctx := newView(), sv.ctx
		if ctx == nil {
			ctx = context.Background() // not started: a unit outside Run (tests)
		}
		sv.view = mv
		sv.wg.Go(func() { mv.run(ctx) })
	}
	return sv.view
}

// wait waits for the view's run to end.
func (sv *sharedMemberView) wait() { sv.wg.Wait() }
