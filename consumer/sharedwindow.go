package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/wire"
)

// replayWindow is Consumer.ReplayWindow under the shared engine
// (docs/design/next-engine.md section 3, "consumer replay --since"): a
// cursor with an end, run here and not by the partitions' owners, reads
// the events stream by direct gets from the first sequence stored at or
// after w.Since to the stream's last sequence at the call, and each
// event goes through deliver.WindowRun. An
// ordered subscription's stream names, for its first event in the
// window, the predecessor a new owner would look up (the stream's last
// event before it the subscription selects, stepped over the versions
// dead-lettered and not delivered, from the positions bucket).
func (e *sharedEngine) replayWindow(ctx context.Context, sub string, w deliver.Window) (deliver.WindowResult, error) {
	res := deliver.WindowResult{Subscription: sub}
	snd := e.r.Sender(sub)
	if snd == nil {
		return res, fmt.Errorf("consumer: replay: %w: %q", ErrUnknownSubscription, sub)
	}
	if err := w.Validate(); err != nil {
		return res, err
	}
	events, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return res, fmt.Errorf("consumer: replay: JetStream stream %q: %w", e.stream, err)
	}
	prefix := eventsPrefix(events.CachedInfo().Config)
	last := events.CachedInfo().State.LastSeq
	s := snd.Subscription()
	filters := deliver.WindowFilters(s.FilterSubjects, prefix, w.Stream)
	if len(filters) == 0 || last == 0 {
		return res, nil // nothing the subscription selects is in that stream
	}
	before, err := e.r.SeqBefore(ctx, w.Since)
	if err != nil {
		return res, fmt.Errorf("consumer: replay: %w", err)
	}
	if before >= last {
		return res, nil
	}
	cur, err := e.r.WindowCursor(filters, before+1, last)
	if err != nil {
		return res, fmt.Errorf("consumer: replay: %w", err)
	}
	run := &deliver.WindowRun{Window: w, Sender: snd, Prefix: prefix, Last: last}
	// The run's result knows no subscription: name it, as `consumer
	// replay` prints it.
	result := func(run *deliver.WindowRun) deliver.WindowResult {
		r := run.Result()
		r.Subscription = sub
		return r
	}
	if s.Ordered() {
		kv, err := shared.PositionsBucket(ctx, e.js, "")
		if err != nil {
			return res, fmt.Errorf("consumer: replay: %w", err)
		}
		run.Before = func(ctx context.Context, key, _ string, v int64, seq uint64) (int64, error) {
			if v == 0 {
				return fanout.NoPrevious, nil
			}
			return e.r.Predecessor(ctx, kv, sub, key, seq)
		}
	}
	for {
		ev, err := cur.Next(ctx)
		switch {
		case errors.Is(err, reader.ErrCaughtUp):
			return result(run), nil
		case err != nil && ctx.Err() != nil:
			return result(run), ctx.Err()
		case err != nil:
			return result(run), fmt.Errorf("consumer: replay: read JetStream stream %q: %w", e.stream, err)
		}
		dev := deliver.WindowEvent{Seq: ev.Seq, Time: ev.Time, Subject: ev.Subject, Header: ev.Header, Data: ev.Data}
		if done, err := run.Send(ctx, dev); done || err != nil {
			return result(run), err
		}
	}
}

// eventsPrefix is the subject prefix of the events stream cfg: the
// prefix of its one "<prefix>.>" subject, else wire.DefaultEventsPrefix.
func eventsPrefix(cfg jetstream.StreamConfig) string {
	if len(cfg.Subjects) == 1 && strings.HasSuffix(cfg.Subjects[0], ".>") {
		return strings.TrimSuffix(cfg.Subjects[0], ".>")
	}
	return wire.DefaultEventsPrefix
}
