// Reading JetStream: one ordered consumer over the streams' subjects.

package audit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// idleWait is how long the reader waits for a message before asking the
// server whether any is left.
const idleWait = 2 * time.Second

// maxIdle is how many idle waits in a row (no message, yet the server
// does not say it has none left, or does not answer) end the read with an
// error, instead of an audit that waits forever on a server that went
// away.
const maxIdle = 15

// readStored reads every message on filters in cfg.Stream, up to the
// stream's last sequence when the read began, with an ordered consumer,
// and returns what it keeps of them by source stream (only streams in
// wanted), in stored order, and how many messages it read.
func readStored(ctx context.Context, js jetstream.JetStream, cfg Config, filters []string, wanted map[string]bool) (map[string][]stored, int64, Retention, error) {
	s, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, 0, Retention{}, fmt.Errorf("%w: %q", ErrNoStream, cfg.Stream)
	}
	if err != nil {
		return nil, 0, Retention{}, fmt.Errorf("JetStream stream %q: %w", cfg.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, Retention{}, fmt.Errorf("JetStream stream %q: %w", cfg.Stream, err)
	}
	out := make(map[string][]stored)
	ret := RetentionOf(info)
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return out, 0, ret, nil
	}
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !cfg.Since.IsZero() {
		from := cfg.Since.Add(-SinceSkew)
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &from
	}
	cons, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return nil, 0, Retention{}, fmt.Errorf("ordered consumer on JetStream stream %q: %w", cfg.Stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1000))
	if err != nil {
		return nil, 0, Retention{}, fmt.Errorf("read JetStream stream %q: %w", cfg.Stream, err)
	}
	defer it.Stop()
	// Nothing to read at all (a start time past the last message): say
	// so now rather than after idleWait.
	if ci, err := cons.Info(ctx); err == nil && ci.NumPending == 0 && ci.Delivered.Consumer == 0 {
		return out, 0, ret, nil
	}
	var n int64
	idle := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, n, ret, fmt.Errorf("read JetStream stream %q: %w", cfg.Stream, err)
		}
		msg, err := it.Next(jetstream.NextMaxWait(idleWait))
		if ctx.Err() == nil && (errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)) {
			// Nothing came: done when the server has nothing left for us.
			ci, ierr := cons.Info(ctx)
			if ierr == nil && ci.NumPending == 0 {
				return out, n, ret, nil
			}
			if idle++; idle >= maxIdle {
				if ierr == nil {
					ierr = fmt.Errorf("%d messages pending", ci.NumPending)
				}
				return nil, n, ret, fmt.Errorf("read JetStream stream %q: no message for %s: %w", cfg.Stream, maxIdle*idleWait, ierr)
			}
			continue
		}
		if err != nil {
			return nil, n, ret, fmt.Errorf("read JetStream stream %q: %w", cfg.Stream, err)
		}
		idle = 0
		meta, err := msg.Metadata()
		if err != nil {
			return nil, n, ret, fmt.Errorf("read JetStream stream %q: %w", cfg.Stream, err)
		}
		n++
		if stream, _, perr := wire.ParseSubject(cfg.Prefix, msg.Subject()); perr == nil && wanted[stream] {
			h := msg.Headers()
			v, verr := strconv.ParseInt(h.Get(wire.HeaderStreamVersion), 10, 64)
			if verr != nil {
				v = -1
			}
			out[stream] = append(out[stream], stored{
				seq: meta.Sequence.Stream, version: v, id: h.Get(wire.HeaderMsgID), subject: msg.Subject(),
				sums: sumsOf(msg.Subject(), h, msg.Data()),
			})
		}
		if meta.NumPending == 0 || meta.Sequence.Stream >= last {
			return out, n, ret, nil
		}
	}
}
