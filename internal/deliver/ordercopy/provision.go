package ordercopy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// ErrPartitionsChanged is wrapped by Provision when the partitioned copy
// of the events stream exists with another partition count: its stored
// subjects would not match the partition consumers' filters. Waiting
// does not fix it; the copy must be deleted (docs/ordering.md).
var ErrPartitionsChanged = errors.New("partition count differs from the partitioned stream's")

// ErrEventsRecreated is wrapped by Provision when the partitioned copy of
// the events stream has sourced it past its last sequence: the events
// stream was deleted and created again, and the copy would go on sourcing
// from its old sequence on, skipping the new stream's messages up to
// there. Waiting does not fix it; the error names the copy to delete.
var ErrEventsRecreated = errors.New("the partitioned stream sourced the events stream past its last sequence")

// Provision creates the partitioned copy of the events stream events
// (StreamConfig with partitions and replicas), or checks the one that
// exists: it must source events with the transform of partitions
// (ErrPartitionsChanged) and not from past events' last sequence
// (ErrEventsRecreated); AllowDirect is turned on when missing, and a
// retention or compression below a new copy's is reported, not changed.
// It returns the copy's MaxAge (0: none): the existing copy's, or a new
// one's. Other errors are JetStream's, wrapped with the stream's name.
func Provision(ctx context.Context, js jetstream.JetStream, events jetstream.Stream, partitions, replicas int, log *slog.Logger) (time.Duration, error) {
	ecfg := events.CachedInfo().Config
	name := wire.OrderedStream(ecfg.Name)
	_, dest := wire.OrderedTransform(EventsPrefix(ecfg), partitions)
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, StreamConfig(ecfg, partitions, replicas))
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return 0, fmt.Errorf("deliver: create JetStream stream %q: %w", name, err)
		}
		return copyMaxAge(ecfg.MaxAge), nil // or another replica's, the same
	}
	if err != nil {
		return 0, fmt.Errorf("deliver: JetStream stream %q: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	if len(cfg.Sources) != 1 || len(cfg.Sources[0].SubjectTransforms) != 1 || cfg.Sources[0].SubjectTransforms[0].Destination != dest {
		return 0, fmt.Errorf("deliver: %w: JetStream stream %q does not source %q with the transform %q (partitions %d); "+
			"delete it (nats stream rm %s) and every ordered subscription's partition consumers to repartition (docs/ordering.md)",
			ErrPartitionsChanged, name, ecfg.Name, dest, partitions, name)
	}
	if err := checkSourced(ctx, s, events); err != nil {
		return 0, err
	}
	if err := allowDirect(ctx, js, s, log); err != nil {
		return 0, err
	}
	reportRetention(log, cfg, ecfg)
	reportCompression(log, cfg)
	return cfg.MaxAge, nil
}

// checkSourced fails, wrapping ErrEventsRecreated, when the last message of
// the partitioned copy s came from past the events stream's last sequence
// (read after it, so that a copy keeping up is never ahead).
func checkSourced(ctx context.Context, s, events jetstream.Stream) error {
	name, ename := s.CachedInfo().Config.Name, events.CachedInfo().Config.Name
	last := s.CachedInfo().State.LastSeq
	if last == 0 {
		return nil
	}
	m, err := s.GetMsg(ctx, last)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deliver: read JetStream stream %q: %w", name, err)
	}
	origin := wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo))
	info, err := events.Info(ctx)
	if err != nil {
		return fmt.Errorf("deliver: ordered delivery: JetStream stream %q: %w", ename, err)
	}
	if origin > info.State.LastSeq {
		return fmt.Errorf("deliver: %w: JetStream stream %q holds messages of %q up to its sequence %d, and %q ends at %d: %q was created again. "+
			"Delete %q (nats stream rm %s) and every ordered subscription's partition consumers, which go with it; they are made again from the new stream",
			ErrEventsRecreated, name, ename, origin, ename, info.State.LastSeq, ename, name, name)
	}
	return nil
}
