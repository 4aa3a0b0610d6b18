package subscription

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Where a subscription starts (docs/subscriptions-start.md): a start is
// applied once, when a subscription's durable consumers are created (the
// unordered durable, or the partition consumers of an ordered one); an
// existing durable keeps the position it has, and its start is reported,
// never changed. The start a durable was created with is recorded in its
// metadata (StartMetadataKey), so that a later, different start is refused
// (ErrStartChanged) instead of silently not applying.

// StartPolicy is the kind of a Start.
type StartPolicy string

const (
	// StartNew delivers only the events stored after the subscription's
	// durable consumers were created, as webhook platforms do for a new
	// endpoint. The default.
	StartNew StartPolicy = "new"
	// StartAll delivers every event the events stream still holds.
	StartAll StartPolicy = "all"
	// StartTime delivers the events stored in the events stream at or
	// after Start.Time (the time JetStream stored them, not the events'
	// own creation time in Postgres).
	StartTime StartPolicy = "time"
	// StartSequence delivers the events from the events stream's sequence
	// Start.Sequence on (the sequence `nats stream view EVENTS` and
	// `consumer trace` show). For an ordered subscription it is still the
	// events stream's sequence, not its partitioned copy's: the partition
	// consumers start at the copy's first message sourced from it.
	StartSequence StartPolicy = "sequence"
)

// StartMetadataKey is the durable consumer metadata key holding the start
// it was created with (Start.String). Durable consumers created before
// starts were recorded have none; they were created with StartAll.
const StartMetadataKey = "jsbridge_start"

// ErrInvalidStart is wrapped by ParseStart for a start it cannot read.
var ErrInvalidStart = errors.New("invalid start")

// ErrStartChanged is wrapped by CheckStart, so by the engine's Provision
// (Consumer and Fleet), when a subscription's start differs from the one
// its existing durable consumer was created with: a start applies only at
// creation, so it would silently not apply. The message says how to reset
// the subscription (delete its durable consumers). Waiting does not fix
// it.
var ErrStartChanged = errors.New("start differs from the durable consumer's")

// Start says where a subscription's durable consumers begin when they are
// created. The zero value is StartNew.
type Start struct {
	// Policy is StartNew (default ""), StartAll, StartTime or
	// StartSequence.
	Policy StartPolicy
	// Time is where StartTime begins; not zero for it, unused otherwise.
	Time time.Time
	// Sequence is the events stream's sequence StartSequence begins at; 1
	// or more for it, unused otherwise.
	Sequence uint64
}

// StartAtTime returns the start at the first event stored at or after t.
func StartAtTime(t time.Time) Start { return Start{Policy: StartTime, Time: t} }

// StartAtSequence returns the start at the events stream's sequence seq.
func StartAtSequence(seq uint64) Start { return Start{Policy: StartSequence, Sequence: seq} }

// ParseStart reads a start written as Start.String writes it: "new",
// "all", "time:<RFC 3339>" or "sequence:<n>" (a space after the colon is
// allowed; "" is "new"). An error wraps ErrInvalidStart and quotes s.
func ParseStart(s string) (Start, error) {
	v := strings.TrimSpace(s)
	kind, arg, hasArg := strings.Cut(v, ":")
	kind, arg = strings.TrimSpace(kind), strings.TrimSpace(arg)
	switch {
	case v == "" || v == string(StartNew):
		return Start{Policy: StartNew}, nil
	case v == string(StartAll):
		return Start{Policy: StartAll}, nil
	case hasArg && kind == string(StartTime):
		t, err := time.Parse(time.RFC3339Nano, arg)
		if err != nil {
			return Start{}, fmt.Errorf("%w %q: %q is not an RFC 3339 time (e.g. 2026-11-01T00:00:00Z)", ErrInvalidStart, s, arg)
		}
		return StartAtTime(t), nil
	case hasArg && kind == string(StartSequence):
		n, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || n == 0 {
			return Start{}, fmt.Errorf("%w %q: %q is not a stream sequence (1 or more)", ErrInvalidStart, s, arg)
		}
		return StartAtSequence(n), nil
	}
	return Start{}, fmt.Errorf("%w %q: want new, all, time:<RFC 3339> or sequence:<n>", ErrInvalidStart, s)
}

// String writes s as ParseStart reads it: "new", "all",
// "time:2026-11-01T00:00:00Z" (UTC) or "sequence:42".
func (s Start) String() string {
	switch s.Policy {
	case "", StartNew:
		return string(StartNew)
	case StartTime:
		return string(StartTime) + ":" + s.Time.UTC().Format(time.RFC3339Nano)
	case StartSequence:
		return string(StartSequence) + ":" + strconv.FormatUint(s.Sequence, 10)
	}
	return string(s.Policy)
}

// validate reports what is wrong with s, or nil.
func (s Start) validate() error {
	switch s.Policy {
	case "", StartNew, StartAll:
		return nil
	case StartTime:
		if s.Time.IsZero() {
			return errors.New("time start without a time")
		}
		return nil
	case StartSequence:
		if s.Sequence == 0 {
			return errors.New("sequence start at 0 (want 1 or more)")
		}
		return nil
	}
	return fmt.Errorf("%q (want %q, %q, %q or %q)", s.Policy, StartNew, StartAll, StartTime, StartSequence)
}

// ApplyStart sets cfg's deliver policy for a durable consumer on the
// events stream itself (an unordered subscription) created with start s,
// and records s in its metadata (RecordStart).
func ApplyStart(cfg *jetstream.ConsumerConfig, s Start) {
	switch s.Policy {
	case StartAll:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	case StartTime:
		t := s.Time
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	case StartSequence:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, s.Sequence
	default:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	RecordStart(cfg, s)
}

// RecordStart records s in cfg's metadata (StartMetadataKey, written as
// Start.String), creating the metadata map if cfg has none.
func RecordStart(cfg *jetstream.ConsumerConfig, s Start) {
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	cfg.Metadata[StartMetadataKey] = s.String()
}

// KeepStart makes cfg keep the deliver policy (with its start sequence or
// time) and the recorded start (StartMetadataKey) of the existing durable
// consumer's config have, and the metadata keys also (the engine passes
// the version chain's start), so that an update never moves them: a key
// have lacks is removed from cfg.
func KeepStart(cfg *jetstream.ConsumerConfig, have jetstream.ConsumerConfig, also ...string) {
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
	for _, k := range append([]string{StartMetadataKey}, also...) {
		delete(cfg.Metadata, k)
		if v, ok := have.Metadata[k]; ok {
			if cfg.Metadata == nil {
				cfg.Metadata = map[string]string{}
			}
			cfg.Metadata[k] = v
		}
	}
}

// RecordedStart returns the start an existing durable consumer's config
// records (StartMetadataKey), and false when it records none (created
// before starts were recorded, or not by jsbridge).
func RecordedStart(cfg jetstream.ConsumerConfig) (string, bool) {
	v, ok := cfg.Metadata[StartMetadataKey]
	return v, ok
}

// ReportedStart is the start an existing durable consumer (its config)
// was created with, for logs and `consumer status`: the recorded one, else
// what its deliver policy says, marked "(not recorded)".
func ReportedStart(cfg jetstream.ConsumerConfig) string {
	if v, ok := RecordedStart(cfg); ok {
		return v
	}
	var s Start
	switch cfg.DeliverPolicy {
	case jetstream.DeliverAllPolicy:
		s.Policy = StartAll
	case jetstream.DeliverByStartSequencePolicy:
		s = StartAtSequence(cfg.OptStartSeq)
	case jetstream.DeliverByStartTimePolicy:
		if cfg.OptStartTime != nil {
			s = StartAtTime(*cfg.OptStartTime)
		}
	}
	return s.String() + " (not recorded)"
}

// CheckStart refuses (ErrStartChanged) a subscription start want that
// differs from the one recorded on its existing durable consumer
// (cfg, named durable on stream); reset says how to delete the durables.
// A durable without a recorded start was created with StartAll before
// starts were recorded: it is accepted whatever want is, as it always was.
func CheckStart(sub string, want Start, cfg jetstream.ConsumerConfig, durable, stream, reset string) error {
	have, ok := RecordedStart(cfg)
	if !ok || have == want.String() {
		return nil
	}
	return fmt.Errorf("deliver: subscription %q: %w: start %q, but its durable consumer %q on JetStream stream %q was created with start %q; "+
		"a start applies only when the durable consumer is created, and the durable keeps its position. Keep start %q, "+
		"or reset the subscription to start %q: stop every replica running it, delete its durable consumer (%s), and start again",
		sub, ErrStartChanged, want.String(), durable, stream, have, have, want.String(), reset)
}
