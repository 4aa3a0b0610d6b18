package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/internal/proc"
)

// handoverResult is what the hand-over run measured: the longest time from
// the SIGKILL until each victim partition (one the killed replica was last
// to deliver, with events left) was delivered by another replica; or, when
// that could no longer happen, why (unmet).
type handoverResult struct {
	took             time.Duration
	victim           string
	victims, resumed int
	unmet            string
}

// killOne waits until a quarter of n was delivered and a replica is the
// last to deliver some partitions with events left, SIGKILLs the replica
// last on the most of them, and waits until each of those partitions is
// delivered by another replica, or until that can no longer happen (see
// partSink.handover), which the result then says instead of waiting out
// the timeout.
func (e *env) killOne(ctx context.Context, s *partSink, name string, ps []*proc.Process, n int) (handoverResult, error) {
	var res handoverResult
	var parts int
	err := e.waitFor(ctx, 10*time.Minute, name+": a quarter delivered and a replica delivering partitions with events left", func() (bool, error) {
		if s.n.Load() < int64(n/4) {
			return false, nil
		}
		if res.victim, parts = s.busiest(); parts > 0 {
			return true, nil
		}
		if s.allDelivered() {
			res.unmet = fmt.Sprintf("every event was delivered (%d) before a replica could be killed with partitions left to hand over", n)
			return true, nil
		}
		return false, nil
	})
	if err != nil || res.unmet != "" {
		return res, err
	}
	idx := -1
	for i := range ps {
		if fmt.Sprintf("%s-%d", name, i) == res.victim {
			idx = i
		}
	}
	if idx < 0 {
		return res, fmt.Errorf("%s: deliveries name replica %q, which this run did not start", name, res.victim)
	}
	s.kill(res.victim)
	at := time.Now()
	ps[idx].Kill()
	grace := 5 * orderedLeaseTTL
	var st handoverState
	err = e.waitFor(ctx, 10*time.Minute, name+": the killed replica's partitions delivered again", func() (bool, error) {
		res.took, res.victims, res.resumed, st = s.handover(at, time.Now(), grace)
		return st != handoverWaiting, nil
	})
	if err != nil {
		return res, err
	}
	switch {
	case st == handoverUnmeetable && res.victims == 0:
		res.unmet = fmt.Sprintf("the partitions %s was last to deliver had no events left by the kill: nothing to hand over", res.victim)
	case st == handoverUnmeetable:
		res.unmet = fmt.Sprintf("%d of the %d partitions %s was last to deliver with events left at the kill were never delivered by another replica; "+
			"every event was delivered and %s passed, so none can be", res.victims-res.resumed, res.victims, res.victim, grace)
	}
	if res.unmet != "" {
		fmt.Printf("bench: ordered: %s: SIGKILL of %s: %s\n", name, res.victim, res.unmet)
		return res, nil
	}
	fmt.Printf("bench: ordered: %s: SIGKILL of %s (last to deliver %d partitions with events left): all of them delivered by another replica after %s\n",
		name, res.victim, res.victims, res.took.Round(time.Millisecond))
	return res, nil
}

// handoverTarget is the hand-over row's target, in lease TTLs: the dead
// replica's leases expire one TTL after its last renewal at most, the
// other replica claims them at its next cycle (TTL/4 later at most), then
// claims each partition's record, takes it on its reader from the
// record's floor and POSTs the first event it reads: the rest of the
// second TTL is for those.
const handoverTarget = 2

// row is the hand-over row of the results table.
func (h handoverResult) row() row {
	r := row{
		Name: fmt.Sprintf("ordered hand-over after SIGKILL of 1 of 2 replicas (lease TTL %s): from the kill until each partition it was last to deliver, "+
			"with events left, is delivered by the other", orderedLeaseTTL),
		Reference: "lease TTL = " + orderedLeaseTTL.String(),
		Target: fmt.Sprintf("< %d (under %d lease TTLs: its leases expire within one TTL, the other replica claims them at its next cycle (TTL/4), "+
			"then claims each partition's record and reads on from its floor)", handoverTarget, handoverTarget),
	}
	if h.unmet != "" {
		r.Ours, r.Ratio = "not measured: "+h.unmet, "—"
		return r
	}
	r.Ours = fmt.Sprintf("%s (%d partitions)", h.took.Round(100*time.Millisecond), h.victims)
	ratio := h.took.Seconds() / orderedLeaseTTL.Seconds()
	r.Ratio = fmt.Sprintf("%.2f", ratio)
	r.Met = ratio < handoverTarget
	return r
}
