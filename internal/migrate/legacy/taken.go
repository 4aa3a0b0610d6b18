package legacy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
)

// What a stopped consumer of the old layout took: the messages it was
// delivered above its ack floor, and those of them it holds pending.

// PendingMargin is added to a durable's AckWait and longest BackOff step
// when its pending set is read back: the server moves an expired
// delivery to its redelivery queue on a timer of its own.
const PendingMargin = 2 * time.Second

// PendingBound is how long a pending event of a durable with cfg may
// take to come back: AckWait plus its longest BackOff step.
func PendingBound(cfg jetstream.ConsumerConfig) time.Duration {
	d := cfg.AckWait
	for _, b := range cfg.BackOff {
		d = max(d, b)
	}
	return d
}

// PendingSet reads durable c's pending set back (the design's section 5):
// with every replica stopped, JetStream redelivers exactly the events
// delivered and not acked once their AckWait (or Nak delay) passed,
// before anything new. It pulls, never acking, until it has seen
// info.NumAckPending redeliveries (NumDelivered > 1) at or below the last
// delivered sequence, or for the bound (PendingBound + PendingMargin, on
// clock), and returns their sequences. Each pull
// counts as a delivery of its events on the old durable; events past the
// last delivered sequence it pulls stay pending there.
func PendingSet(ctx context.Context, c jetstream.Consumer, info *jetstream.ConsumerInfo, clock clockwork.Clock) (map[uint64]bool, error) {
	seen := map[uint64]bool{}
	last := info.Delivered.Stream
	deadline := clock.Now().Add(PendingBound(info.Config) + PendingMargin)
	for len(seen) < info.NumAckPending {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		left := deadline.Sub(clock.Now())
		if left <= 0 {
			break
		}
		fctx, cancel := context.WithTimeout(ctx, min(left, time.Second))
		batch, err := c.Fetch(info.NumAckPending-len(seen), jetstream.FetchContext(fctx))
		if err != nil && fctx.Err() != nil && ctx.Err() == nil {
			// The round's time ran out before the pull was sent (nats.go
			// refuses a context already past its deadline): the next
			// round, or the bound, decides.
			cancel()
			continue
		}
		if err != nil {
			cancel()
			return nil, fmt.Errorf("migrate: read the pending events of durable %q back: %w", info.Name, err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err == nil && md.NumDelivered > 1 && md.Sequence.Stream <= last {
				seen[md.Sequence.Stream] = true
			}
		}
		err = batch.Error()
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoHeartbeat) {
			return nil, fmt.Errorf("migrate: read the pending events of durable %q back: %w", info.Name, err)
		}
	}
	return seen, nil
}

// Filters are a consumer's filter subjects (none: everything).
func Filters(cfg jetstream.ConsumerConfig) []string {
	f := slices.Clone(cfg.FilterSubjects)
	if cfg.FilterSubject != "" {
		f = append(f, cfg.FilterSubject)
	}
	if len(f) == 0 {
		f = []string{">"}
	}
	return f
}

// Taken is a message a consumer takes: its sequence and subject.
type Taken struct {
	Seq     uint64
	Subject string
}

// ListTaken lists s's messages in [from, to] on any of filters (which a
// consumer keeps from overlapping), by sequence: one message get each,
// next by subject.
func ListTaken(ctx context.Context, s jetstream.Stream, filters []string, from, to uint64) ([]Taken, error) {
	var out []Taken
	for _, f := range filters {
		for seq := from; seq <= to; {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(f))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("migrate: read JetStream stream %q from %d on %q: %w", s.CachedInfo().Config.Name, seq, f, err)
			}
			if m.Sequence > to {
				break
			}
			out = append(out, Taken{m.Sequence, m.Subject})
			seq = m.Sequence + 1
		}
	}
	slices.SortFunc(out, func(a, b Taken) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}
