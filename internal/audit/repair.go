// Repair: re-publishing a stream's missing tail through the bridge's
// fenced path.

package audit

import (
	"context"
	"fmt"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
)

// Repair re-publishes, through fwd, every Missing event of r that is in its
// stream's tail (Problem.Tail: after every message JetStream holds of the
// stream), in version order, and marks those JetStream stored as Repaired.
// fwd must publish with the bridge's Prefix, Source and JetStream stream.
//
// The publishes take the bridge's normal path: fwd looks up the last
// message stored on the stream's subjects and expects it on the first
// publish (Nats-Expected-Last-Subject-Sequence), so a bridge publishing
// the same stream meanwhile makes the repair fail, never interleave; and
// Nats-Msg-Id is the event id, so JetStream drops a copy it still
// remembers. What is left unrepaired says why in its Detail:
//
//   - a hole (a Missing event before a stored version) is never
//     re-published: JetStream appends, so it would land after later
//     versions and every consumer would see the stream out of order;
//   - a content mismatch, duplicate or out-of-order message is reported
//     only: Postgres may be the side that changed, and deleting messages
//     is an operator's decision;
//   - a re-publish JetStream dropped as a duplicate (its id is still in
//     the duplicate window: run the repair again after the window);
//   - a publish that failed or found a later version already stored.
//
// It returns an error only when ctx ended.
func Repair(ctx context.Context, fwd *forward.Forwarder, r *Report) error {
	var evs []event.Event
	var idx []int
	for i, p := range r.Problems {
		if p.Kind == Missing && p.Tail && !p.Repaired {
			evs = append(evs, p.ev)
			idx = append(idx, i)
		}
	}
	if len(evs) == 0 {
		return ctx.Err()
	}
	// r.Problems is sorted by stream and version: each stream's tail goes
	// out in order.
	for k, o := range fwd.Publish(ctx, evs) {
		p := &r.Problems[idx[k]]
		switch o.Status {
		case forward.Stored:
			p.Repaired, p.Sequence = true, o.Sequence
			p.Detail = fmt.Sprintf("re-published: stored at sequence %d", o.Sequence)
		case forward.Duplicate:
			p.Detail = fmt.Sprintf("re-publish dropped as a duplicate of sequence %d: JetStream's duplicate window still holds the event id; repair again after the window", o.Sequence)
		case forward.AlreadyStored:
			p.Detail = fmt.Sprintf("not re-published: JetStream now holds a later version of the stream (sequence %d); verify again", o.Sequence)
		default:
			p.Detail = fmt.Sprintf("re-publish failed: %v", o.Err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("repair: %w", err)
	}
	return nil
}
