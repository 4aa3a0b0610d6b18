package owner

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/lifecycle"
)

// MemberView is this replica's picture of the lease bucket, kept from
// one long-lived watch of the membership heartbeats (MemberKey) and the
// partition leases (LeaseKey). It replaces
// a listing of the bucket per cycle: a listing is a KV watch of its own,
// so an ephemeral consumer created and deleted each time (a meta-layer
// proposal each on a cluster).
//
// Expiry. The bucket's keys expire after its TTL on the server, and an
// expiry sends nothing to a watch (the bucket has no limit markers). The
// view drops a key once the server's clock, as the view estimates it,
// passes the key's last write (its server timestamp) plus the TTL. The
// estimate is the newest server timestamp the watch brought plus the
// time elapsed since it came, on the injected clock: it runs behind the
// server's clock by the watch's delivery latency, so a key leaves the
// view at or after it expired on the server, not before, and no clock of
// the replica is compared with the server's. This replica's own
// heartbeats, written every cycle, keep the estimate fresh.
//
// Staleness. The watch is an ordered consumer: nats.go makes it again
// from the next sequence after a gap or missed heartbeats, so nothing is
// missed while the bucket lives; when the bucket's stream is gone the
// watch ends and the view starts a new one, which sends every key again. A
// bucket deleted and created again while nats.go was making the watch's
// consumer again would leave the watch past the new bucket's end, seeing
// nothing. So each cycle tells the view the revision of each heartbeat
// Put of this replica (Wrote); a view that has not seen one by that key's
// next cycle, twice in a row (Check), starts its watch again, and the new
// watch rebuilds the view from the bucket's keys.
//
// A view that is late or wrong costs a quota computed from the wrong
// members for a round: a partition unowned for a round, or a claim whose
// KV Create fails; never two owners (the lease key's Create decides).
type MemberView struct {
	lifecycle.Base

	kv    jetstream.KeyValue
	ttl   time.Duration
	clock clockwork.Clock
	log   *slog.Logger
	// failed is called when the watch could not start (a bucket gone is
	// created again by the caller).
	failed func(ctx context.Context, err error)

	restart chan struct{} // Check asks run for a new watch
	loaded  chan struct{} // closed once a watch sent every key the first time

	mu    sync.Mutex
	ready bool // the current watch sent every key; false before, and while a new one starts
	// members are the replicas' last heartbeats as the watch brought
	// them, by replica id.
	members map[string]heartbeat
	// leases are the lease keys' last writes, by partition.
	leases map[int]heartbeat
	// stamp is the newest server timestamp the watch brought, at stampAt
	// on the injected clock: the server's clock estimate (serverNowLocked).
	stamp, stampAt time.Time
	// pending are this replica's last heartbeat writes (key → revision)
	// that the view should have seen by their key's next check; stale
	// counts, by key, the checks in a row that found its write missing.
	pending map[string]uint64
	stale   map[string]int
}

// heartbeat is a key's last write as the watch brought it: its server
// timestamp and revision.
type heartbeat struct {
	at  time.Time
	rev uint64
}

// ErrViewNotReady is Members' error while the view's watch has not sent
// every key yet (starting, or starting again): a cycle then claims and
// releases nothing.
var ErrViewNotReady = errors.New("the lease bucket's member watch has not sent every key yet")

// staleChecks is how many checks in a row may find this replica's own
// heartbeat missing from the view before its watch is started again.
const staleChecks = 2

// NewMemberView returns the view of kv (the lease bucket, whose keys
// expire after ttl), on the archetype's clock and logger (nil:
// base.Default). failed is called with the error when a watch could not
// start (then the view retries after a second on the clock); nil:
// nothing. Start keeps it.
func NewMemberView(arch *base.Archetype, kv jetstream.KeyValue, ttl time.Duration, failed func(context.Context, error)) *MemberView {
	if failed == nil {
		failed = func(context.Context, error) {}
	}
	arch = base.Default(arch)
	return &MemberView{kv: kv, ttl: ttl, clock: arch.Clock, log: arch.Logger, failed: failed,
		restart: make(chan struct{}, 1), loaded: make(chan struct{}), members: map[string]heartbeat{},
		leases: map[int]heartbeat{}, pending: map[string]uint64{}, stale: map[string]int{}}
}

// Start keeps the view in the background until Stop (lifecycle.Part):
// it watches the bucket's keys, rebuilds the view from each new watch's
// first keys, and starts a new watch when one ends or Check asks for
// it. It opens nothing, so it returns nil.
func (mv *MemberView) Start(ctx context.Context) error {
	return mv.Base.Start(ctx, nil, func(ctx context.Context) error { mv.run(ctx); return nil })
}

// run keeps the view until ctx ends.
func (mv *MemberView) run(ctx context.Context) {
	first := true
	for ctx.Err() == nil {
		// A new slice each time: nats.go's WatchFiltered rewrites its keys
		// in place (to their subjects).
		w, err := mv.kv.WatchFiltered(ctx, []string{MemberFilter, LeaseFilter}, jetstream.MetaOnly())
		if err != nil {
			mv.log.Warn("watching the lease bucket's members failed; retrying", slog.Any("error", err))
			mv.failed(ctx, err)
			t := mv.clock.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.Chan():
			}
			t.Stop()
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

// follow applies w's entries to the view until w ends, ctx ends or Check
// asks for a new watch. The entries before the watch's nil marker are
// the bucket's keys now: they replace the view at the marker.
func (mv *MemberView) follow(ctx context.Context, w jetstream.KeyWatcher, first *bool) {
	// the keys before the marker
	nextMembers, nextLeases := map[string]heartbeat{}, map[int]heartbeat{}
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
			if nextMembers != nil {
				mv.members, mv.leases, mv.ready = nextMembers, nextLeases, true
				nextMembers, nextLeases = nil, nil
				if *first {
					select {
					case <-mv.loaded: // loaded by a run before a Stop
					default:
						close(mv.loaded)
					}
					*first = false
				}
			}
			mv.mu.Unlock()
			continue
		}
		members, leases := mv.members, mv.leases
		if nextMembers != nil {
			members, leases = nextMembers, nextLeases
		}
		mv.applyLocked(members, leases, e)
		mv.mu.Unlock()
	}
}

// applyLocked records entry e in members or leases and moves the server
// clock estimate (mv.mu held).
func (mv *MemberView) applyLocked(members map[string]heartbeat, leases map[int]heartbeat, e jetstream.KeyValueEntry) {
	if at := e.Created(); at.After(mv.stamp) {
		mv.stamp, mv.stampAt = at, mv.clock.Now()
	}
	put := e.Operation() == jetstream.KeyValuePut
	hb := heartbeat{at: e.Created(), rev: e.Revision()}
	if id, ok := ParseMemberKey(e.Key()); ok {
		if put {
			members[id] = hb
		} else {
			delete(members, id)
		}
		return
	}
	if p, ok := ParseLeaseKey(e.Key()); ok {
		if put {
			leases[p] = hb
		} else {
			delete(leases, p)
		}
	}
}

// serverNowLocked is the view's estimate of the server's clock (mv.mu
// held).
func (mv *MemberView) serverNowLocked() time.Time {
	return mv.stamp.Add(mv.clock.Since(mv.stampAt))
}

// Members returns the ids of the live replicas, sorted, with self among
// them. It fails with ErrViewNotReady while the watch has not sent every
// key.
func (mv *MemberView) Members(self string) ([]string, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if !mv.ready {
		return nil, ErrViewNotReady
	}
	var members []string
	now := mv.serverNowLocked()
	for id, hb := range mv.members {
		if hb.at.Add(mv.ttl).After(now) {
			members = append(members, id)
		} else {
			delete(mv.members, id) // expired on the server
		}
	}
	if !slices.Contains(members, self) {
		members = append(members, self)
	}
	slices.Sort(members)
	return members, nil
}

// Leases returns the partitions whose lease key exists (held by any
// replica, self included) as the view sees them: written and not deleted
// nor expired on the server by the view's estimate. A lease created since
// the watch last brought a key may be missing (its Create then decides).
// It fails with ErrViewNotReady while the watch has not sent every key.
func (mv *MemberView) Leases() (map[int]bool, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if !mv.ready {
		return nil, ErrViewNotReady
	}
	now := mv.serverNowLocked()
	taken := map[int]bool{}
	for p, hb := range mv.leases {
		if hb.at.Add(mv.ttl).After(now) {
			taken[p] = true
		} else {
			delete(mv.leases, p) // expired on the server
		}
	}
	return taken, nil
}

// Wrote tells the view that this replica wrote heartbeat key at revision
// rev: key's next Check expects to find it.
func (mv *MemberView) Wrote(key string, rev uint64) {
	mv.mu.Lock()
	mv.pending[key] = rev
	mv.mu.Unlock()
}

// Check compares the view with this replica's last write of heartbeat
// key (Wrote): when the view has missed the writes of a key at two
// checks in a row, the watch is started again. Called at the start of
// the cycle that writes key, so the watch has a cycle (TTL/4) to bring
// each write.
func (mv *MemberView) Check(key string) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	rev, ok := mv.pending[key]
	if !mv.ready || !ok {
		return
	}
	delete(mv.pending, key)
	id, _ := ParseMemberKey(key)
	if mv.members[id].rev == rev {
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

// WaitLoaded waits until the view's first watch sent every key, ctx
// ends, or d passes on the injected clock.
func (mv *MemberView) WaitLoaded(ctx context.Context, d time.Duration) {
	t := mv.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-mv.loaded:
	case <-ctx.Done():
	case <-t.Chan():
	}
}
