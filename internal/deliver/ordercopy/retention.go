package ordercopy

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The partitioned copy's retention and lag (docs/ordering.md, "The copy's
// retention"). The copy is a limits stream: a message leaves it when it is
// older than its MaxAge or when the copy passes its MaxBytes, whether an
// ordered subscription settled it or not. A new copy gets
// retentionFactor times the events stream's limits, so that an event
// held behind a parked head (or not delivered yet) outlives its original
// by as long again; an owner that finds an unsettled event past
// RetentionWarn of the copy's MaxAge logs an error naming the event and
// the cause (the engine's partition consumer watch), and Watch one for a
// copy past RetentionWarn of its MaxBytes. A parked stream whose oldest
// held event nears or passes the copy's MaxAge gets the cause in its park
// entry (the park room's keep-alive, RiskOf): held in memory, the event is
// still delivered on replay, but a hand-over would lose it.

// retentionFactor is how many times the events stream's MaxAge and
// MaxBytes a new partitioned copy gets.
const retentionFactor = 2

// RetentionWarn is the share of the copy's MaxAge (or MaxBytes) past
// which an unsettled event (or the copy) is reported, in quarters.
const RetentionWarn = 3 // quarters

// copyMaxAge is a new copy's MaxAge for an events stream's: twice it, 0
// (no limit) for 0.
func copyMaxAge(events time.Duration) time.Duration {
	if events <= 0 {
		return 0
	}
	return retentionFactor * events
}

// copyMaxBytes is a new copy's MaxBytes for an events stream's: twice it,
// -1 (no limit) for none.
func copyMaxBytes(events int64) int64 {
	if events <= 0 {
		return -1
	}
	return retentionFactor * events
}

// allowDirect turns AllowDirect on for an existing copy s created without
// it (the version chain's look-ups start with a direct get), logging once.
func allowDirect(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, log *slog.Logger) error {
	cfg := s.CachedInfo().Config
	if cfg.AllowDirect {
		return nil
	}
	cfg.AllowDirect = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("deliver: turn on AllowDirect of JetStream stream %q: %w", cfg.Name, err)
	}
	log.Info("the partitioned copy had no AllowDirect; turned it on (the version chain's look-ups read it with direct gets)",
		slog.String("jetstream_stream", cfg.Name))
	return nil
}

// reportCompression says, at Info, when an existing copy (cfg) is not
// compressed, as an earlier version made it: a new one is (S2,
// compression). It is left as it is: compression costs the server
// CPU, and the operator may have turned it off. JetStream takes the
// change in place but compresses only the blocks written after the
// server opened the stream again (a restart).
func reportCompression(log *slog.Logger, cfg jetstream.StreamConfig) {
	if cfg.Compression != jetstream.NoCompression {
		return
	}
	log.Info(fmt.Sprintf("the partitioned copy is not compressed; a new one is (S2: about a third of the disk with JSON events, "+
		"for a few µs of server CPU per event). Turn it on with: nats stream edit %s --compression s2 "+
		"(JetStream compresses the blocks it writes after the server's next restart)", cfg.Name),
		slog.String("jetstream_stream", cfg.Name))
}

// reportRetention warns when an existing copy (cfg) keeps messages for
// less than a new one would (copyMaxAge, copyMaxBytes of the events
// stream's ecfg): held events may age out of it. Its retention is the
// operator's: it is left as it is.
func reportRetention(log *slog.Logger, cfg, ecfg jetstream.StreamConfig) {
	name := cfg.Name
	if want := copyMaxAge(ecfg.MaxAge); cfg.MaxAge > 0 && (want == 0 || cfg.MaxAge < want) {
		log.Warn(fmt.Sprintf("the partitioned copy keeps messages for less than twice the events stream's MaxAge: an event held behind a parked stream, "+
			"or not delivered yet, is removed from it once older than its MaxAge, and never delivered; it is left as it is. "+
			"Raise it with: nats stream edit %s --max-age %s", name, maxAgeFlag(want)),
			slog.String("jetstream_stream", name), slog.Duration("max_age", cfg.MaxAge), slog.Duration("events_max_age", ecfg.MaxAge))
	}
	if want := copyMaxBytes(ecfg.MaxBytes); cfg.MaxBytes > 0 && (want < 0 || cfg.MaxBytes < want) {
		log.Warn(fmt.Sprintf("the partitioned copy keeps fewer bytes than twice the events stream's MaxBytes: once full, it removes its oldest messages, "+
			"held or not delivered yet; it is left as it is. Raise it with: nats stream edit %s --max-bytes %d", name, want),
			slog.String("jetstream_stream", name), slog.Int64("max_bytes", cfg.MaxBytes), slog.Int64("events_max_bytes", ecfg.MaxBytes))
	}
}

// Risk is how close a held event, in the copy since at, is to
// leaving the copy (whose MaxAge is maxAge) at now.
type Risk int

// The retention risks, from none to removed.
const (
	// RiskNone: younger than RetentionWarn quarters of MaxAge, or no MaxAge.
	RiskNone Risk = iota
	// RiskNear: past RetentionWarn quarters; the copy removes it at MaxAge.
	RiskNear
	// RiskRemoved: past MaxAge; the copy removed it.
	RiskRemoved
)

// RiskOf is the retention risk of a held event in the copy since at.
func RiskOf(at, now time.Time, maxAge time.Duration) Risk {
	if maxAge <= 0 || at.IsZero() {
		return RiskNone
	}
	switch age := now.Sub(at); {
	case age >= maxAge:
		return RiskRemoved
	case age >= maxAge/4*RetentionWarn:
		return RiskNear
	}
	return RiskNone
}

// RiskError is the cause a parked stream's entry records for its held
// event id, in copy (named) since at, at risk r at now.
func RiskError(r Risk, copy, id string, at, now time.Time, maxAge time.Duration, replica string) string {
	age := now.Sub(at).Round(time.Millisecond)
	switch r {
	case RiskNear:
		return fmt.Sprintf("held event %s is %s old, past 3/4 of the partitioned copy %s's MaxAge %s: the copy removes it at MaxAge; "+
			"replay or skip the parked stream's head (consumer dlq), or raise the copy's MaxAge (nats stream edit %s --max-age)",
			id, age, copy, maxAge, copy)
	case RiskRemoved:
		return fmt.Sprintf("held event %s is %s old, past the partitioned copy %s's MaxAge %s: the copy removed it, and it is delivered "+
			"only while replica %s holds it (a hand-over or a restart loses it); replay or skip the parked stream's head now (consumer dlq), "+
			"and raise the copy's MaxAge (nats stream edit %s --max-age)", id, age, copy, maxAge, replica, copy)
	}
	return ""
}

// maxAgeFlag is d as the nats CLI's --max-age takes it ("-1": no limit).
func maxAgeFlag(d time.Duration) string {
	if d <= 0 {
		return "-1"
	}
	return d.String()
}
