package drain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/event"
)

// Cycle runs one pass: claim up to ClaimLimit streams (one while the bus is
// unavailable, see Run), fetch up to FetchLimit events of each past its
// watermark, hand them to the Handler in one call (Batch.Reconcile set for a
// takeover, a retry or an attempt after an outage) and settle every stream
// by its Result (decide in settle.go is these rules as a pure function):
//
//   - Err nil: ack to the last event.
//   - a NonRetryableError: block at once, keeping the progress before the
//     failed event; the stream's error names the event id and the reason.
//   - an UnavailableError (the bus failed or did not answer in time, not
//     the stream): keep the progress and Postpone: the next attempt comes
//     after OutageBackoff(n), n the number of cycles in a row before this
//     one that met the outage, and the stream's retry count stays as it
//     was, so an outage never blocks a stream and never brings it closer
//     to MaxRetries; the next claim of the stream reconciles.
//   - any other error: keep the progress (Events[Done-1]) and retry after
//     Backoff(retry), or block when retry+1 would exceed MaxRetries.
//   - when ctx is done (shutdown) and the handler failed: ack what it
//     finished and release the rest without counting a retry.
//
// An event the store could not read (event.Event.Err set: NULL data, meta
// that is not valid JSON) never reaches the handler: the stream's batch
// ends before it, and once the handler has done the events before it, the
// stream is blocked at it as for a NonRetryableError whose reason is the
// event's Err. Other streams of the cycle are not affected.
//
// The handler's context ends ShutdownGrace after ctx does, so a batch in
// flight at shutdown can finish, and in any case shortly before the leases
// expire (HandlerTimeout(Lease) after the claim). Settling uses a fresh
// context, so a batch in flight is settled even after ctx is done. A settle
// fenced off by an expired lease (event.ErrLeaseLost) is logged and counted, not
// returned: the stream is claimed again and JetStream's duplicate window
// absorbs the re-publish. Store errors are returned (joined) with the stats so far; a
// settle or claim that failed may have left leases this drainer holds but
// will not settle, so the next cycle first ends them (Store.EndLeases,
// keeping the streams in flight) and claims them again at once. Cycle
// must not run concurrently with itself or Run on the same Drain.
func (d *Drain) Cycle(ctx context.Context) (Stats, error) {
	limit := d.cfg.ClaimLimit
	if d.outage {
		limit = 1 // probe whether the bus is back
	}
	c, err := d.prepare(ctx, limit)
	if err != nil || c == nil {
		return c.stats(), err
	}
	return d.finish(ctx, c, nil)
}

// cycle is a cycle's claimed streams and their events, prepared (claimed
// and fetched) and not yet handled.
type cycle struct {
	start       time.Time // when the claim was made: leases run from it
	st          Stats
	batches     []Batch
	batchClaims []event.Claim // batchClaims[i] is the claim of batches[i]
	// unreadable[i], when not nil, is the event of batches[i]'s stream the
	// store could not read, just after the batch's last event; nil when no
	// stream of the cycle has one.
	unreadable []*event.Event
	empty      []event.Claim // claims without events past the watermark
	// stuck are streams whose first event past the watermark is unreadable:
	// nothing to hand to the handler, the stream is blocked at it.
	stuck []stuckStream
	// next is the claim made together with this cycle's acks (Run, with
	// an AckClaimer), nil when none was.
	next *nextClaim
}

// nextClaim is a claim made in one round trip with a cycle's acks
// (AckClaimer.AckClaim).
type nextClaim struct {
	start  time.Time // when the call was made: the leases run from after it
	claims []event.Claim
	// events are the claimed streams' events when the call fetched them
	// too (fetched), else nil.
	events  []event.Event
	fetched bool
	// again: a stream was acked after the claim (an appender held its
	// row), so the claim could not take it again.
	again bool
	err   error
}

// stuckStream is a claimed stream whose first event the store could not read.
type stuckStream struct {
	claim event.Claim
	ev    event.Event
}

// deadline is when c's handler must be done: HandlerTimeout after the
// claim, before the leases run out.
func (c *cycle) deadline(lease time.Duration) time.Time {
	return c.start.Add(HandlerTimeout(lease))
}

// stale reports whether c, claimed ahead, has less than half of its
// handler's time left: handing it over would have its publishes cut by the
// deadline for no fault of the bus's, so it is given back instead.
func (c *cycle) stale(lease time.Duration, now time.Time) bool {
	return c.deadline(lease).Sub(now) < HandlerTimeout(lease)/2
}

func (c *cycle) stats() Stats {
	if c == nil {
		return Stats{}
	}
	return c.st
}

// backlogged reports whether c suggests more work is waiting: it claimed
// claimLimit streams, or fetched fetchLimit events of one.
func (c *cycle) backlogged(claimLimit, fetchLimit int) bool {
	if c.st.Claimed >= claimLimit {
		return true
	}
	for _, b := range c.batches {
		if len(b.Events) >= fetchLimit {
			return true
		}
	}
	return false
}

// allDone reports whether results settle every stream of c with an ack:
// one result per batch, each without an error and done with its whole
// batch, and no stream of c is empty, stuck or ends at an unreadable
// event.
func (c *cycle) allDone(results []Result) bool {
	if len(results) != len(c.batches) || len(c.empty) > 0 || len(c.stuck) > 0 || c.unreadable != nil {
		return false
	}
	for i, r := range results {
		if r.Err != nil || r.Done != len(c.batches[i].Events) {
			return false
		}
	}
	return true
}

// streamsOf returns the streams of claims.
func streamsOf(claims []event.Claim) []string {
	out := make([]string, len(claims))
	for i, cl := range claims {
		out[i] = cl.Stream
	}
	return out
}

// streams returns the names of every stream c holds.
func (c *cycle) streams() []string {
	out := make([]string, 0, len(c.batchClaims)+len(c.empty)+len(c.stuck))
	for _, cl := range c.batchClaims {
		out = append(out, cl.Stream)
	}
	for _, cl := range c.empty {
		out = append(out, cl.Stream)
	}
	for _, sk := range c.stuck {
		out = append(out, sk.claim.Stream)
	}
	return out
}

// prepare claims up to limit streams and fetches their events. It returns
// nil and no error when nothing was claimed. When the fetch fails it gives
// the streams back and returns the error.
func (d *Drain) prepare(ctx context.Context, limit int) (*cycle, error) {
	c := &cycle{start: d.cfg.Clock.Now()}
	// The claim is not cut by shutdown: a claim cancelled on the client may
	// still commit on the server, leaving leases nobody knows it holds
	// until they expire. Finished, its streams are held, and Run gives
	// them back when it stops.
	cctx, cancel := d.settleContext()
	defer cancel()
	if ctx.Err() != nil {
		return nil, nil
	}
	d.takeBack(cctx)
	var (
		claims []event.Claim
		events []event.Event
		err    error
	)
	cf, fetched := d.store.(ClaimFetcher)
	if fetched {
		claims, events, err = cf.ClaimFetch(cctx, d.cfg.Owner, limit, d.cfg.Lease, d.cfg.FetchLimit)
	} else {
		claims, err = d.store.Claim(cctx, d.cfg.Owner, limit, d.cfg.Lease)
	}
	d.cfg.Observer.Claimed(len(claims), d.cfg.Clock.Since(c.start), err)
	if err != nil {
		d.loseTrack() // the claim may have committed all the same
		return nil, fmt.Errorf("drain: claim: %w", err)
	}
	if len(claims) == 0 {
		return nil, nil
	}
	return d.build(ctx, c, claims, events, fetched)
}

// build makes c the cycle of claims (not empty): it holds them, fetches
// their events unless fetched (events are then theirs, from the claim)
// and sorts them into batches. When the fetch fails it gives the streams
// back and returns the error.
func (d *Drain) build(ctx context.Context, c *cycle, claims []event.Claim, events []event.Event, fetched bool) (*cycle, error) {
	c.st.Claimed = len(claims)
	d.hold(claims)
	for _, cl := range claims {
		d.log.Debug("stream claimed", "stream", cl.Stream, "watermark", cl.Watermark, "retry", cl.Retry, "leased_until", cl.LeasedUntil, "previous_holder", cl.PreviousHolder)
	}

	if !fetched {
		var err error
		events, err = d.store.Fetch(ctx, claims, d.cfg.FetchLimit)
		if err != nil {
			// Give the streams back at once rather than let their leases
			// run out.
			d.giveBack(streamsOf(claims))
			return c, fmt.Errorf("drain: fetch: %w", err)
		}
	}

	byStream, unreadable := groupByStream(events, len(claims))
	c.batches = make([]Batch, 0, len(claims))
	c.batchClaims = make([]event.Claim, 0, len(claims))
	for _, cl := range claims {
		evs := byStream[cl.Stream]
		if len(evs) == 0 {
			c.empty = append(c.empty, cl)
			continue
		}
		var bad *event.Event
		if unreadable {
			for i := range evs {
				if evs[i].Err != nil {
					bad, evs = &evs[i], evs[:i]
					break
				}
			}
			if bad != nil && len(evs) == 0 {
				c.stuck = append(c.stuck, stuckStream{claim: cl, ev: *bad})
				continue
			}
			if c.unreadable == nil {
				c.unreadable = make([]*event.Event, len(c.batches), len(claims))
			}
			c.unreadable = append(c.unreadable, bad)
		}
		c.batches = append(c.batches, Batch{Stream: cl.Stream, Retry: cl.Retry, Watermark: cl.Watermark, Events: evs, Reconcile: cl.PreviousHolder != "" || cl.Retry > 0})
		c.batchClaims = append(c.batchClaims, cl)
	}
	return c, nil
}

// giveBack releases streams claimed and not handled, without counting a
// retry; a failure leaves them to their leases' expiry.
func (d *Drain) giveBack(streams []string) {
	sctx, cancel := d.settleContext()
	defer cancel()
	if err := d.store.Release(sctx, d.cfg.Owner, streams); err == nil || errors.Is(err, event.ErrLeaseLost) {
		d.unhold(streams...)
	} else {
		d.log.Warn("drain: give back streams claimed ahead", "streams", len(streams), "error", err)
		d.unhold(streams...)
		d.loseTrack()
	}
}

// finish hands c's batches to the handler and settles every stream (see
// Cycle). handled, when not nil, is called with the handler's results
// before they are settled (Run claims the next cycle then); when it
// returns true and every stream is acked, the acks and the next claim
// are made in one round trip (AckClaimer) and its outcome left in c.next.
func (d *Drain) finish(ctx context.Context, c *cycle, handled func([]Result) bool) (Stats, error) {
	st := c.st
	batches := c.batches
	var results []Result
	claimNext := false
	if len(batches) > 0 {
		// On shutdown the batch in flight goes on for ShutdownGrace, so what
		// it publishes gets acked; it never outlives the leases.
		hctx, cancel := withDeadline(context.WithoutCancel(ctx), d.cfg.Clock, c.deadline(d.cfg.Lease))
		stopGrace := context.AfterFunc(ctx, func() {
			t := d.cfg.Clock.NewTimer(d.cfg.ShutdownGrace)
			defer t.Stop()
			select {
			case <-t.Chan():
				cancel()
			case <-hctx.Done():
			}
		})
		results = d.h.Handle(hctx, batches)
		stopGrace()
		cancel()
		if len(results) != len(batches) {
			d.log.Error("drain handler returned the wrong number of results", "results", len(results), "batches", len(batches))
		}
		if handled != nil {
			claimNext = handled(results)
		}
	}

	sctx, cancel := d.settleContext()
	defer cancel()
	errs := d.settleBatches(ctx, sctx, c, results, claimNext, &st)
	for _, sk := range c.stuck {
		b := Batch{Stream: sk.claim.Stream, Retry: sk.claim.Retry, Events: []event.Event{sk.ev}}
		if err := d.settle(ctx, sctx, sk.claim, b, Result{Err: NonRetryable(sk.ev.Err)}, nil, &st); err != nil {
			errs = append(errs, err)
		}
	}
	d.noteOutage(len(batches), st)
	for _, cl := range c.empty {
		// head > watermark, yet no event past the watermark: events were
		// deleted or the head is wrong. Retrying bounds it, then it blocks
		// for an operator to see.
		r := Result{Err: fmt.Errorf("no events after watermark %d although the stream was pending", cl.Watermark)}
		if err := d.settle(ctx, sctx, cl, Batch{Stream: cl.Stream, Retry: cl.Retry}, r, nil, &st); err != nil {
			errs = append(errs, err)
		}
	}
	return st, errors.Join(errs...)
}

// noteOutage counts the cycles in a row in which a stream failed because
// the bus was unavailable (Config.OutageBackoff's argument), and enters the
// outage state when a cycle handed batches to the handler and every stream
// that got through nothing failed that way; both end with a cycle whose
// handler answered without such a failure.
func (d *Drain) noteOutage(batches int, st Stats) {
	switch {
	case st.Unavailable > 0:
		d.outages++
	case batches > 0:
		d.outages = 0
	}
	if batches == 0 {
		return
	}
	was := d.outage
	switch {
	case st.Unavailable > 0 && st.Acked == 0:
		d.outage = true
	case st.Unavailable == 0:
		d.outage = false
	}
	switch {
	case d.outage && !was:
		d.log.Warn("bus unavailable: drain paused, probing with one stream at a time", "streams", st.Unavailable)
	case !d.outage && was:
		d.log.Info("bus available again: drain resumed")
	}
}

func (d *Drain) hold(claims []event.Claim) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range claims {
		d.held[c.Stream] = true
	}
}

// loseTrack notes that a store call that claims or settles failed: this
// drainer may hold leases it will not settle, which the next takeBack
// ends. The streams concerned must no longer be held.
func (d *Drain) loseTrack() {
	d.mu.Lock()
	d.lostTrack = true
	d.mu.Unlock()
}

// takeBack, after a store call that claims or settles failed (loseTrack),
// ends every lease this drainer holds but those of the streams it holds
// in flight (Store.EndLeases), so that they are claimed again at once and
// reconciled, by this drainer or another, instead of waiting out the
// lease. A settle whose answer a Postgres failover cut is the usual case:
// its stream's lease survives on the promoted server, held by a live
// drainer that will never settle it. When the store still fails, the
// next call tries again.
func (d *Drain) takeBack(ctx context.Context) {
	d.mu.Lock()
	if !d.lostTrack {
		d.mu.Unlock()
		return
	}
	d.lostTrack = false // a failure from now on sets it again
	keep := make([]string, 0, len(d.held))
	for s := range d.held {
		keep = append(keep, s)
	}
	d.mu.Unlock()
	ended, busy, err := d.store.EndLeases(ctx, d.cfg.Owner, keep)
	if err != nil {
		d.loseTrack()
		return // the claim that follows fails too, and is logged
	}
	if len(ended) > 0 {
		d.log.Info("leases left by failed store calls ended; streams claimable again", "streams", ended)
	}
	if len(busy) > 0 {
		// Rows another transaction holds: never waited for (the other
		// streams must not wait behind them); tried again next cycle.
		d.log.Debug("leases left by failed store calls: streams busy, trying again", "streams", busy)
		d.loseTrack()
	}
}

func (d *Drain) unhold(streams ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range streams {
		delete(d.held, s)
	}
}

// groupByStream returns events by stream, in their order, and whether any
// is unreadable (Err set). A run of one stream's events next to each other
// (the usual Fetch order) is a sub-slice of events, not a copy; its
// capacity ends with the run, so appending to it cannot overwrite the next.
func groupByStream(events []event.Event, streams int) (map[string][]event.Event, bool) {
	byStream := make(map[string][]event.Event, streams)
	unreadable := false
	for i := 0; i < len(events); {
		j := i + 1
		for j < len(events) && events[j].Stream == events[i].Stream {
			j++
		}
		run := events[i:j:j]
		for k := range run {
			unreadable = unreadable || run[k].Err != nil
		}
		if prev, ok := byStream[events[i].Stream]; ok {
			byStream[events[i].Stream] = append(prev, run...)
		} else {
			byStream[events[i].Stream] = run
		}
		i = j
	}
	return byStream, unreadable
}

// anyUnavailable reports whether a result failed because the bus was
// unavailable (an UnavailableError).
func anyUnavailable(results []Result) bool {
	for _, r := range results {
		if r.Err != nil && IsUnavailable(r.Err) {
			return true
		}
	}
	return false
}
