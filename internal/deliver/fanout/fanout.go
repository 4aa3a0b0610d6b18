// Package fanout is what the owner of a partition runs once the reader
// hands it events (docs/design/next-engine.md, section 2 "What a new
// owner does" step 5 and section 3; the staged plan's stage 4): every
// event goes to each live subscription that takes it (member.Index, a subject
// trie of their filters), unless the partition's record says the
// subscription settled it; an ordered subscription's events go through
// one lane per stream, one at a time, a stream's next version only once
// the commit covering the previous one succeeded (write before next, the
// design's D6 and R2); an unordered one's go out in parallel up to its
// in-flight limit and wait for no commit. The owner raises the
// partition's floor as events settle (R1), and a subscription that holds
// too much, or is paused, disabled or behind an open breaker, gets a
// cursor (D5), stops holding the floor back, catches up through its own
// reads and rejoins the shared read. A subscription put while the
// partition runs starts where Join says: a cursor from its start, or
// live. A parked stream is read again once the operator's request
// (package unpark: a Request under its Key in the positions bucket,
// watched once per replica) is applied by CatchUp; a
// stream whose head is retried in place too long is set aside (the
// stuck-stream rule, stuck.go) and read again once its head settled. An
// event whose attempt failed is recorded with its count (the record's
// retries entries, retries.go): a new owner goes on from that count, and
// an unordered one no longer holds the floor back.
//
// The package owns the interfaces of what it uses: Position (the
// partition's record, *position.Partition), Sender (one attempt, stage 6
// adapts internal/deliver/attempt), Chain (a stream's predecessor when
// the record has none) and CursorReader (a cursor's reads of the events
// stream, a cursor.Read; cursor.Reader answers it through
// reader.Cursor's direct gets); the replica (internal/deliver/shared)
// adapts them. Its rooms, below it: member (the replica's member index,
// matched against every event), cursor (a cursor's reads), unpark (the
// operator's requests on parked streams) and floor (the window of events
// owed that holds the floor back).
//
// Not here yet (the design's stage 4 row says what is left): the
// detached groups of a mass outage and the bound on cursors read at
// once.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/floor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/unpark"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// NoPrevious is a Delivery's Previous when its stream has no version
// delivered before it (the chain header's "none").
const NoPrevious int64 = -1

// dropCursor drops subscription sub's cursor reads on the partition
// when the CursorReader keeps any (cursor.Reader does): its reads are
// over.
func (p *Partition) dropCursor(sub string) {
	if d, ok := p.cursors.(interface{ Drop(string, int) }); ok {
		d.Drop(sub, p.cfg.Partition)
	}
}

// Cursor states (position.Cursor.State) the fan-out gives. A subscription
// in StateBehind reads its own events (CatchUp); in any other state it
// reads nothing until SetState("") resumes it.
const (
	// StateBehind: it held MaxInHand events, or was resumed; it reads.
	StateBehind = "behind"
	// StateBreaker: its endpoint's circuit breaker is open.
	StateBreaker = "breaker"
	// StatePaused: paused by the operator (the subscriptions bucket).
	StatePaused = "paused"
	// StateDisabled: disabled (410 Gone, sustained failure, operator).
	StateDisabled = "disabled"
	// StateHeld: a stranger's place, kept. The claimed record listed the
	// subscription live, or it had a cursor, but this replica does not
	// deliver it (not in the member index: replicas whose subscription sets
	// differ, as during a rolling deploy that adds or removes one). Its
	// cursor holds where it stood; it is neither read nor sent to, and
	// the floor passes it. A replica that delivers it and claims the
	// partition (or a Join here) reads it as StateBehind and rejoins.
	StateHeld = "held"
)

// Position is the partition's record as the fan-out writes it: the
// methods of *position.Partition it calls, with their contracts (see
// there): the record and cursors as claimed, a settlement recorded, the
// write-before-next wait, the floor and members edited, cursors made
// (from the record, or from a start position), edited and dropped, and
// a subscription deleted for good forgotten.
type Position interface {
	Record() position.Record
	Cursors() map[string]position.Cursor
	Settled(sub, stream string, e position.Entry)
	Wait(ctx context.Context, sub, stream string, seq uint64) error
	Edit(fn func(*position.Record))
	EditCursor(sub string, fn func(*position.Cursor)) bool
	Detach(sub, state string) bool
	StartCursor(sub, state string, floor uint64) bool
	Rejoin(sub string) bool
	Drop(sub string) bool
	Flush(ctx context.Context) error
}

// Act is what an attempt's answer means for its event.
type Act int

const (
	// Delivered: answered 2xx. The event is settled.
	Delivered Act = iota
	// Retry: a retryable failure; the same event goes again after
	// Settlement.Delay (an ordered stream waits meanwhile).
	Retry
	// DeadLetter: the Sender stored a dead letter; the event is settled
	// and its stream goes on (its next event names the same predecessor).
	DeadLetter
	// Park: dead-lettered, and the ordered subscription's stream is set
	// aside (an aside entry "parked" from the event on): its later events
	// are not dispatched to it. For an unordered one, as DeadLetter.
	Park
)

// Settlement is a Sender's answer for one attempt.
type Settlement struct {
	// Act is what the answer means for the event.
	Act Act
	// Delay is the pause before the next attempt of a Retry.
	Delay time.Duration
	// Spent is, for a Retry, the attempts at the event that spent one
	// of the subscription's MaxDeliver so far, over every owner (from
	// Delivery.Spent on): what its retries entry records, so that the
	// next owner goes on counting from there.
	Spent int
}

// Delivery is one attempt at one event for one subscription.
type Delivery struct {
	// Subscription is the subscription's name (Member.Name).
	Subscription string
	// Event is the event as the reader (or a cursor's read) handed it.
	Event reader.Event
	// Attempt counts the attempts at the event, from one past its
	// retries entry's count (1 without one).
	Attempt int
	// Spent is the event's retries entry's count when this owner began
	// sending it (0 without one): the attempts earlier owners spent of
	// the subscription's MaxDeliver, which the Sender counts on from.
	Spent int
	// Ordered: an ordered subscription's event; Previous is then its
	// stream's version delivered before it (NoPrevious: none), the
	// version chain's Jsbridge-Previous-Version.
	Ordered  bool
	Previous int64
	// Partition and Epoch are the owner's (Config).
	Partition int
	Epoch     uint64
}

// Sender makes one attempt (stage 6: internal/deliver/attempt behind the
// lease fence). It returns once the attempt settled or failed; it is
// called from many goroutines at once.
type Sender interface {
	Attempt(ctx context.Context, d Delivery) Settlement
}

// Chain looks up the version subscription sub delivered of stream before
// the event at seq, for a stream's first event since the claim when the
// record holds no entry for it (today's chain.go, pointed at the events
// stream): NoPrevious when none. stream is wire.StreamKey of the subject.
type Chain interface {
	Previous(ctx context.Context, sub, stream string, seq uint64) (int64, error)
}

// CursorReader reads a cursor's events (the reader room's direct gets,
// stage 6). It returns them in stream order and through, the sequence up
// to which the answer is complete: every event of the read in
// (After, through] is in events (through is To once the read reached it;
// a short answer ends below).
type CursorReader interface {
	Read(ctx context.Context, r cursor.Read) (events []reader.Event, through uint64, err error)
}

// Config is one partition's fan-out.
type Config struct {
	// Partition is the partition's number; Epoch the claim's lease epoch.
	// Both are passed on in every Delivery.
	Partition int
	Epoch     uint64
	// Archetype is the engine's clock (the retry pauses, the order
	// gate's stuck heads) and logger. Default base.Default.
	*base.Archetype
	// Requests are the operator's requests on parked streams (unpark.Request),
	// applied by CatchUp. Nil: none are (a parked stream stays parked).
	Requests *unpark.Requests
	// Deleted reports whether a subscription not in the member index was
	// deleted on purpose (the subscriptions bucket says so): New drops
	// what the claimed record and cursors keep of it (Forget) instead of
	// holding it (StateHeld). Nil: every stranger is held.
	Deleted func(sub string) bool
	// Wake, when set, is called (never with the partition's lock held)
	// when a lane leaves CatchUp something to do: its stream set aside
	// as stuck, or the stuck head settled (the stream's later events are
	// to read). The replica's dispatch loop, which waits for the next
	// event without a bound while CatchUp reports nothing, runs CatchUp
	// then. Nil: CatchUp runs at the loop's next event only, so a stream
	// set aside after the last event waits for another one.
	Wake func()
}

// Partition is the fan-out of one claimed partition. Dispatch and
// CatchUp are called by the replica's dispatch loop, one at a time
// (that keeps the head still while a cursor decides to rejoin); the
// other methods are safe for concurrent use.
type Partition struct {
	cfg     Config
	members *member.Index
	pos     Position
	send    Sender
	chain   Chain
	cursors CursorReader
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu      sync.Mutex
	err     error
	claimed position.Record            // at the claim: what former owners settled
	curs    map[string]position.Cursor // at the claim
	subs    map[string]*subState
	// watch names the subscriptions of subs that may have a cursor
	// (a state, or joining): CatchUp's round goes over these alone, not
	// over every subscription (mark adds; the round drops the live).
	watch      map[string]struct{}
	asides     map[[2]string]*aside // (subscription, stream) set aside
	deleting   map[string]bool      // requests applied, being deleted
	held       map[string]bool      // strangers held (StateHeld) with no state here
	win        floor.Window
	floor      uint64 // the floor last written
	head       uint64 // the last sequence dispatched live
	gen        uint64 // the members' generation at New: later names wait for Join
	scratch    []*member.Entry
	starts     []start             // runs and sends to start once the lock is released
	spare      []start             // the dispatch loop's: the next starts' array
	claimedTop uint64              // the highest sequence the claim's record names
	retried    []stuckLane         // lanes whose retried head got an event queued behind it
	retries    map[retryKey]uint64 // failed attempts of the events in retry (the record's retries entries)
	refetch    []retryKey          // a former owner's unordered events in retry, to fetch
	nretries   atomic.Int64        // len(retries), read without the lock
}

// New starts the fan-out of the partition whose record pos holds (just
// claimed: its floor is where the reader hands events from). It reads the
// record and the cursors once; subscriptions with a cursor start behind
// it. chain may be nil (no predecessor is ever looked up: NoPrevious);
// cursors may be nil until a subscription needs a read (CatchUp then
// fails).
func New(cfg Config, members *member.Index, pos Position, send Sender, chain Chain, cursors CursorReader) *Partition {
	cfg.Archetype = base.Default(cfg.Archetype)
	ctx, cancel := context.WithCancel(context.Background())
	held := holdStrangers(cfg, members, pos)
	rec := pos.Record()
	p := &Partition{cfg: cfg, members: members, pos: pos, send: send, chain: chain, cursors: cursors,
		ctx: ctx, cancel: cancel, claimed: rec, curs: pos.Cursors(), subs: map[string]*subState{}, watch: map[string]struct{}{},
		asides: map[[2]string]*aside{}, deleting: map[string]bool{}, held: held, floor: rec.Floor, head: rec.Floor, gen: members.Generation()}
	p.win = floor.New(rec.Floor)
	p.retries = map[retryKey]uint64{}
	p.loadRetries()
	p.claimedTop = claimedTop(rec)
	for _, a := range rec.Asides {
		p.asides[[2]string{a.Sub, a.Stream}] = asideOf(a)
	}
	for name := range p.curs {
		if m, ok := members.Entry(name); ok {
			p.sub(m, rec.Floor) // behind from the claim: CatchUp reads it
		}
	}
	return p
}

// Head returns the last sequence dispatched live (the record's floor
// before the first).
func (p *Partition) Head() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.head
}

// Asides returns the streams the record sets aside (AsideParked,
// AsideStuck, AsideReading): the streams gauges read them.
func (p *Partition) Asides() []position.Aside {
	return p.pos.Record().Asides
}

// Floor returns the floor last written to the record.
func (p *Partition) Floor() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.floor
}

// Err returns why the fan-out stopped on its own: nil while it runs or
// after Close, else the commit's error (position.ErrLost: the partition
// is someone else's).
func (p *Partition) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close stops the fan-out gracefully: nothing more is started (waits
// for a commit, a slot or a retry's pause end, the context every attempt
// gets is cancelled), and it waits for the attempts running. One that
// answers with a settlement (its POST ran to its answer: the Sender lets
// a POST started finish, bounded by its lease) is settled, so the
// commit after Close covers it and the next owner does not send it
// again (docs/design/next-engine.md, "Faults": graceful release). An
// unordered subscription's events left unsettled below one it settled
// get retries entries (retryHolesLocked), so the floor passes them and
// the next owner sends them alone. Nothing is settled after it returns.
func (p *Partition) Close() {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	p.retryHolesLocked()
	p.mu.Unlock()
}

// fail stops the fan-out for err (the record lost, or its commit loop
// stopped): nothing more is sent.
func (p *Partition) fail(err error) {
	if p.ctx.Err() != nil && !errors.Is(err, position.ErrLost) {
		return // closed
	}
	p.mu.Lock()
	if p.err == nil {
		p.err = err
		p.cfg.Logger.Warn("the partition's record cannot be committed: its fan-out stops", slog.Int("partition", p.cfg.Partition), slog.Any("error", err))
	}
	p.mu.Unlock()
	p.cancel()
}

// Dispatch hands the event at ev.Seq (of this partition, in stream order
// after the last one) to every live subscription that takes it and has
// not settled it, and raises the floor past what nobody waits for. It
// never waits for a subscription: one that holds MaxInHand events gets a
// cursor instead.
func (p *Partition) Dispatch(ev reader.Event) {
	stream := wire.StreamKey(ev.Subject)
	// The match needs no lock of the partition's (the index has its own;
	// scratch is the dispatch loop's): the lanes wait less.
	p.scratch = p.members.Match(ev.Subject, p.scratch[:0])
	p.mu.Lock()
	defer p.unlock()
	if p.ctx.Err() != nil || ev.Seq <= p.head {
		clear(p.scratch)
		return
	}
	p.head = ev.Seq
	owe := 0
	covered := ev.Seq <= p.claimedTop // past it, the claim's record covers nothing
	for _, m := range p.scratch {
		st := p.subs[m.Name]
		if st == nil {
			if p.awaitsJoin(m) {
				continue
			}
			st = p.sub(m, ev.Seq-1)
		} else if st.m != m {
			st.m = m // put again: its new limits
		}
		if st.state != "" || ev.Seq <= st.from || covered && p.claimed.Covers(m.Name, stream, ev.Seq) ||
			len(p.asides) > 0 && p.asides[[2]string{m.Name, stream}].gates() {
			continue
		}
		if _, dup := st.inHand[ev.Seq]; dup {
			continue // matched twice while Put replaced it
		}
		if len(st.inHand) >= m.MaxInHand {
			p.detach(st, StateBehind)
			continue
		}
		p.push(st, ev, stream, true)
		owe++
	}
	clear(p.scratch)
	p.win.Add(ev.Seq, ev.Subject, owe)
	if len(p.retried) > 0 {
		p.tendStuck()
	}
	p.raise()
}

// claimedTop is the highest sequence r names (floor, entries, members):
// Record.Covers is false for every event above it.
func claimedTop(r position.Record) uint64 {
	top := r.Floor
	for _, e := range r.Streams {
		top = max(top, e.Seq)
	}
	for _, own := range r.Ahead {
		for _, e := range own {
			top = max(top, e.Seq)
		}
	}
	for _, m := range r.Members {
		top = max(top, m)
	}
	return top
}

// raise writes the floor when it rose.
func (p *Partition) raise() {
	if f := p.win.Floor(); f > p.floor {
		p.floor = f
		p.pos.Edit(func(r *position.Record) { r.Floor = max(r.Floor, f) })
	}
}

// wake calls Config.Wake, if set. The partition's lock is not held.
func (p *Partition) wake() {
	if p.cfg.Wake != nil {
		p.cfg.Wake()
	}
}

// sleep waits d on clock, or until ctx ends (false).
func sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		return true
	case <-ctx.Done():
		return false
	}
}

// String names the act, for logs and test failures.
func (a Act) String() string {
	switch a {
	case Delivered:
		return "delivered"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead-letter"
	case Park:
		return "park"
	}
	return fmt.Sprintf("act(%d)", int(a))
}
