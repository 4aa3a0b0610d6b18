package drain

import (
	"context"
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/event"
)

// settleBatches settles the batches of c by the handler's results (as
// settle does each): the streams to ack with one Store.AckStreams call,
// one round trip for all of them where the store can (acking a cycle's
// ~100 streams one by one took 2–5 ms each, which an event appended just
// after the claim waited for), the others one by one. Each stream is
// still settled on its own: a stream whose ack fails or whose lease was
// lost does not affect the others. Every stream acked by the shared call
// reports that call's duration to the Observer. It returns the errors
// Cycle returns.
//
// With claimNext, a store that is an AckClaimer, and every stream of c
// acked, the acks and the next cycle's claim (ClaimLimit streams) go in
// one AckClaim call, whose outcome is left in c.next; the Observer hears
// of that claim as of any other.
func (d *Drain) settleBatches(runCtx, sctx context.Context, c *cycle, results []Result, claimNext bool, st *Stats) []error {
	p := d.settlePolicy()
	shuttingDown := runCtx.Err() != nil
	decs := make([]decision, len(c.batches))
	acks := make([]event.Progress, 0, len(c.batches))
	for i, b := range c.batches {
		var r Result
		if i < len(results) {
			r = results[i]
		} else {
			r = Result{Err: fmt.Errorf("handler returned %d results for %d batches", len(results), len(c.batches))}
		}
		var bad *event.Event
		if c.unreadable != nil {
			bad = c.unreadable[i]
		}
		decs[i] = decide(c.batchClaims[i], b, r, bad, shuttingDown, p)
		if decs[i].act == actAck {
			acks = append(acks, event.Progress{Stream: b.Stream, Version: decs[i].version, ID: decs[i].id})
		}
	}

	var ackErrs []error
	var ackTook time.Duration
	ac, _ := d.store.(AckClaimer)
	if claimNext && ac != nil && len(acks) > 0 && len(acks) == len(decs) && len(c.empty) == 0 && len(c.stuck) == 0 {
		began := d.cfg.Clock.Now()
		n := &nextClaim{start: began}
		perStream := 0
		if _, ok := d.store.(ClaimFetcher); ok {
			perStream, n.fetched = d.cfg.FetchLimit, true
		}
		ackErrs, n.claims, n.events, n.again, n.err = ac.AckClaim(sctx, d.cfg.Owner, acks, d.cfg.ClaimLimit, d.cfg.Lease, perStream)
		ackTook = d.cfg.Clock.Since(began)
		d.cfg.Observer.Claimed(len(n.claims), ackTook, n.err)
		if n.err != nil {
			d.loseTrack() // the claim may have committed all the same
		}
		c.next = n
	} else if len(acks) > 0 {
		began := d.cfg.Clock.Now()
		ackErrs = d.store.AckStreams(sctx, d.cfg.Owner, acks)
		ackTook = d.cfg.Clock.Since(began)
	}
	if len(acks) > 0 {
		if len(ackErrs) != len(acks) {
			err := fmt.Errorf("store answered %d acks with %d results", len(acks), len(ackErrs))
			ackErrs = make([]error, len(acks))
			for k := range ackErrs {
				ackErrs[k] = err
			}
		}
	}

	var errs []error
	k := 0
	for i, dec := range decs {
		var err error
		if dec.act == actAck {
			err = d.settled(c.batchClaims[i], dec, ackErrs[k], ackTook, st)
			k++
		} else {
			began := d.cfg.Clock.Now()
			serr := d.apply(sctx, c.batchClaims[i], dec)
			err = d.settled(c.batchClaims[i], dec, serr, d.cfg.Clock.Since(began), st)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.next != nil {
		// After the acks' settled: a stream acked and claimed again is
		// held for the new claim.
		d.hold(c.next.claims)
	}
	return errs
}
