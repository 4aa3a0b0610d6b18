package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// Where new partition consumers start. A Start speaks of the events
// stream (its sequences, the times it stored the events); the partition
// consumers read the partitioned copy, whose sequences and times are its
// own (a copy created late sources old events now). So a start is first
// made an events stream sequence (eventsStart), then the copy's first
// message sourced from that sequence or after it (copySeqFrom), found by
// its Nats-Stream-Source header.

// startSeq returns the copy sequence new partition consumers start at; 0
// means all (DeliverAll). It waits (returns an error to retry) while the
// copy has not sourced what comes before the start yet.
func (or *orderedRunner) startSeq(ctx context.Context, o *ordering) (uint64, error) {
	from, err := or.eventsStart(ctx, o)
	if err != nil || from <= 1 {
		return 0, err
	}
	return copySeqFrom(ctx, o.js, o.cfg.Stream, o.stream(), or.r.sub.Name, from)
}

// eventsStart returns the events stream sequence new partition consumers
// start at (0: all): after the ack floor of the subscription's
// OrderingNone durable consumer when it exists (a subscription switched to
// ordered delivery goes on where it was, whatever its start), else the
// subscription's start: for StartNew the events stream's last sequence
// plus one, for StartTime its first message stored at or after the time.
func (or *orderedRunner) eventsStart(ctx context.Context, o *ordering) (uint64, error) {
	old, err := o.js.Consumer(ctx, o.cfg.Stream, or.r.sub.Name)
	switch {
	case err == nil:
		floor := old.CachedInfo().AckFloor.Stream
		or.r.log.Warn(fmt.Sprintf("subscription switched to ordered delivery: its partition consumers start after the unordered durable consumer's ack floor; "+
			"delete that consumer once no replica runs the unordered version: nats consumer rm %s %s", o.cfg.Stream, or.r.sub.Name),
			slog.Uint64("ack_floor", floor))
		return floor + 1, nil
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return 0, fmt.Errorf("deliver: subscription %q: look up the unordered durable consumer: %w", or.r.sub.Name, err)
	}
	start := or.r.sub.Start
	switch start.Policy {
	case subscription.StartAll:
		return 0, nil
	case subscription.StartSequence:
		return start.Sequence, nil
	}
	events, err := o.js.Stream(ctx, o.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("deliver: ordered delivery: JetStream stream %q: %w", o.cfg.Stream, err)
	}
	if start.Policy == subscription.StartTime {
		return seqAtTime(ctx, o.js, events, start.Time)
	}
	return events.CachedInfo().State.LastSeq + 1, nil
}

// seqAtTime returns the sequence of s's first message stored at or after
// t, or its last sequence plus one when there is none; by binary search
// on the stored times, which follow the sequence. Each message is read
// from the stream's leader: with AllowDirect on (EVENTS has it) nats.go's
// GetMsg is a direct get, which a lagging follower may answer with
// nothing for the newest messages, and the search would then start past
// them.
func seqAtTime(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, t time.Time) (uint64, error) {
	st := s.CachedInfo().State
	found := st.LastSeq + 1
	lo, hi := st.FirstSeq, st.LastSeq
	for lo <= hi && st.Msgs > 0 {
		mid := lo + (hi-lo)/2
		m, ok, err := jsapi.LeaderGet(ctx, js, s.CachedInfo().Config.Name, jsapi.GetRequest{Seq: mid, NextFor: ">"}) // the first message at or after mid
		switch {
		case err != nil:
			return 0, fmt.Errorf("deliver: read JetStream stream %q: %w", s.CachedInfo().Config.Name, err)
		case !ok:
			hi = mid - 1
		case !m.Time.Before(t):
			found = m.Seq
			if mid == 0 {
				return found, nil
			}
			hi = mid - 1
		default:
			lo = m.Seq + 1
		}
	}
	return found, nil
}

// errCopyBehind is wrapped by copySeqFrom while the copy has not sourced
// what comes before the sequence asked for: retry.
var errCopyBehind = errors.New("waiting for the copy to source it")

// copySeqFrom returns the copy's first sequence whose message was sourced
// from the events stream's sequence from or later (the copy's last
// sequence plus one when none is yet), once the copy has sourced every
// message of the events stream before from; until then an error to
// retry. Sourcing keeps the events stream's order, so a binary search on
// the Nats-Stream-Source header finds it. eventsName and copyName are the
// two JetStream streams' names, sub the subscription asking (for errors).
func copySeqFrom(ctx context.Context, js jetstream.JetStream, eventsName, copyName, sub string, from uint64) (uint64, error) {
	events, err := js.Stream(ctx, eventsName)
	if err != nil {
		return 0, fmt.Errorf("deliver: ordered delivery: JetStream stream %q: %w", eventsName, err)
	}
	need := min(from-1, events.CachedInfo().State.LastSeq) // read before the copy
	s, err := js.Stream(ctx, copyName)
	if err != nil {
		return 0, fmt.Errorf("deliver: JetStream stream %q: %w", copyName, err)
	}
	st := s.CachedInfo().State
	origin := func(seq uint64) (uint64, error) {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("deliver: read JetStream stream %q: %w", copyName, err)
		}
		return wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo)), nil
	}
	var last uint64
	if st.Msgs > 0 {
		if last, err = origin(st.LastSeq); err != nil {
			return 0, err
		}
	}
	if last < need {
		return 0, fmt.Errorf("deliver: subscription %q: JetStream stream %q has sourced up to %d, not yet %d, before the subscription's start: %w",
			sub, copyName, last, need, errCopyBehind)
	}
	if st.Msgs == 0 {
		return st.LastSeq + 1, nil
	}
	lo, hi := st.FirstSeq, st.LastSeq // the first seq whose origin >= from is in [lo, hi+1]
	for lo <= hi {
		mid := lo + (hi-lo)/2
		v, err := origin(mid)
		if err != nil {
			return 0, err
		}
		if v != 0 && v < from {
			lo = mid + 1
		} else {
			hi = mid - 1
		}
	}
	return lo, nil
}
