package deliver

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/wire"
)

// fenceWaitWarnEvery is how long a partition's fence waits before it says
// so (a WARN), and how often it says so again while it keeps waiting. A
// fence normally passes within a second or two of a take or a pause; one
// that waits this long waits for an event nobody has in hand, which only
// its AckWait (or a new owner's reset) brings back.
const fenceWaitWarnEvery = 30 * time.Second

// fenceWait is how long a partition has waited behind its fence; the run
// loop's alone. The zero value is not waiting.
type fenceWait struct {
	since  time.Time // when the wait began (zero: not waiting)
	warned time.Time // when it was last logged (zero: not yet)
	// short is the lowest shortfall (events pending on the consumer not
	// in hand) seen since shortSince (zero: none).
	short      int
	shortSince time.Time
}

// shortfall records the fence's shortfall n now and returns how long it
// has not fallen: 0 when n is 0 or lower than the lowest seen since the
// last fall. A shortfall that grows (one more delivery lost) keeps the
// time of the older one.
func (w *fenceWait) shortfall(now time.Time, n int) time.Duration {
	if n <= 0 {
		w.short, w.shortSince = 0, time.Time{}
		return 0
	}
	if w.shortSince.IsZero() || n < w.short {
		w.short, w.shortSince = n, now
		return 0
	}
	return now.Sub(w.shortSince)
}

// start marks the fence as waiting from now, unless it waits already.
func (w *fenceWait) start(now time.Time) {
	if w.since.IsZero() {
		w.since, w.warned = now, time.Time{}
	}
}

// due reports how long the fence has waited and whether that is to be
// logged now: once it waited fenceWaitWarnEvery, then every
// fenceWaitWarnEvery.
func (w *fenceWait) due(now time.Time) (time.Duration, bool) {
	if w.since.IsZero() {
		return 0, false
	}
	waited := now.Sub(w.since)
	if waited < fenceWaitWarnEvery || (!w.warned.IsZero() && now.Sub(w.warned) < fenceWaitWarnEvery) {
		return waited, false
	}
	w.warned = now
	return waited, true
}

// passed ends the wait and returns how long it lasted (0 when it was not
// waiting).
func (w *fenceWait) passed(now time.Time) time.Duration {
	if w.since.IsZero() {
		return 0
	}
	d := now.Sub(w.since)
	*w = fenceWait{}
	return d
}

// handSplit is what a partition has in hand, by where it is: the fence
// buffer, the lanes, waiting for a predecessor, held behind a parked head
// (each raw, before the events settled or being acked are taken out), and
// total, each event once and without those settled or being acked. Acking is the
// events settled whose ack is on its way (behind the delivered record):
// pending on the consumer, not counted in hand. Aside is the streams set
// aside (their events were acked out: not pending). UpTo is how many of
// total are at or below the stream sequence the count was asked for (the
// fence target's, fenceTarget). Settled is how many events the partition
// settled so far.
type handSplit struct {
	total, fence, lanes, waiting, held, acking, aside, upTo int
	settled                                                 uint64 // handBook.settledN
}

// logFenceWait logs the fence's wait: the consumer's view (info) beside
// what the partition has in hand.
func (pt *partition) logFenceWait(waited time.Duration, info *jetstream.ConsumerInfo, h handSplit) {
	attrs := []any{
		slog.Duration("waited", waited.Round(time.Second)),
		slog.Int("num_ack_pending", info.NumAckPending), slog.Int("in_hand", h.total),
		slog.Int("in_fence", h.fence), slog.Int("in_lanes", h.lanes), slog.Int("waiting", h.waiting),
		slog.Int("held", h.held), slog.Int("acking", h.acking), slog.Int("streams_aside", h.aside),
		slog.Uint64("ack_floor_stream", info.AckFloor.Stream), slog.Uint64("ack_floor_consumer", info.AckFloor.Consumer),
		slog.Uint64("delivered_stream", info.Delivered.Stream), slog.Uint64("delivered_consumer", info.Delivered.Consumer),
		slog.Int("num_waiting", info.NumWaiting), slog.Uint64("num_pending", info.NumPending),
	}
	for _, g := range info.PriorityGroups {
		if g.Group == partitionGroup {
			attrs = append(attrs, slog.String("pinned_client", g.PinnedClientID))
			if !g.PinnedTS.IsZero() {
				attrs = append(attrs, slog.Duration("pinned_for", pt.clock.Since(g.PinnedTS).Round(time.Second)))
			}
		}
	}
	pt.log.Warn("partition fence still waiting: the consumer has more events pending than the partition has in hand", attrs...)
}

// resetProbe names the events a fence reset (partition.healFence) brought
// back that were not in hand when it reset: what the fence had waited
// for. A diagnosis: the reset's WARN says how many, the first fence pass
// after it says which (up to resetProbeMax) and what the partition knew
// of them. The reset brings back the events settled above the ack floor
// too (acked, or an ack that did not land: the two look alike here), so
// those are counted, and the first of them (the lowest) named.
type resetProbe struct {
	inHand  map[uint64]bool // the sequences in hand, unsettled, at the reset
	through uint64          // the last sequence delivered before the reset
	seen    map[uint64]bool
	// missing are the unsettled ones, "seq event_id state", state:
	// behind (a later event of its stream settled) or unsettled.
	missing      []string
	settled      int
	firstSettled string
}

// resetProbeMax bounds the events a resetProbe names.
const resetProbeMax = 10

// saw notes m, received after the reset, when it was delivered before
// the reset and not in hand then.
func (p *resetProbe) saw(m jetstream.Msg, b *handBook) {
	if p == nil {
		return
	}
	seq := streamSeq(m)
	if seq == 0 || seq > p.through || p.inHand[seq] || p.seen[seq] {
		return
	}
	if p.seen == nil {
		p.seen = map[uint64]bool{}
	}
	p.seen[seq] = true
	behind, stale := b.settledBefore(wire.StreamKey(m.Subject()), seq)
	switch {
	case stale:
		if p.settled++; p.firstSettled == "" {
			p.firstSettled = fmt.Sprintf("%d %s", seq, attempt.EventID(m))
		}
	case len(p.missing) >= resetProbeMax:
	case behind:
		p.missing = append(p.missing, fmt.Sprintf("%d %s behind", seq, attempt.EventID(m)))
	default:
		p.missing = append(p.missing, fmt.Sprintf("%d %s unsettled", seq, attempt.EventID(m)))
	}
}

// report logs what the probe saw, once the fence passed after the reset.
func (p *resetProbe) report(log *slog.Logger) {
	if p == nil {
		return
	}
	log.Info("partition fence reset: events it brought back that were not in hand (sequence, event id)",
		slog.Any("unsettled", p.missing), slog.Int("named_at_most", resetProbeMax),
		slog.Int("settled", p.settled), slog.String("first_settled", p.firstSettled))
}
