// Verify and repair: Postgres against JetStream, beside the data path.

package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/audit"
	"github.com/jsbridge/jsbridge/store"
)

// ErrNoStream is wrapped by Verify when the JetStream stream does not
// exist.
var ErrNoStream = errors.New("JetStream stream not found")

// DefaultVerifyPageSize is how many events of a stream one Postgres read
// of Verify returns by default.
const DefaultVerifyPageSize = 1000

// VerifyConfig configures Verify and Repair: the bridge's own settings,
// which must match the bridge's (or every event is reported missing or
// differing), and the audit's. The zero value checks the EVENTS stream
// with the bridge's defaults.
type VerifyConfig struct {
	// Stream, SubjectPrefix and Source are the bridge's Config fields of
	// the same names. Defaults DefaultStream, DefaultSubjectPrefix,
	// DefaultSource.
	Stream        string
	SubjectPrefix string
	Source        string
	// All says the streams given to Verify are every stream of the store:
	// JetStream is then read in one pass over the whole prefix. Otherwise
	// each stream's subjects are read (the whole prefix past a hundred
	// streams).
	All bool
	// Since, when not zero, checks only events created at or after it;
	// JetStream is read from 5 minutes before it (an event created at
	// Since is stored in JetStream later, and the clocks of Postgres and
	// the NATS server may disagree).
	Since time.Time
	// PageSize is how many events one Postgres read returns. Default
	// DefaultVerifyPageSize; negative is invalid.
	PageSize int
	// PublishTimeout bounds each publish of Repair. Default
	// DefaultPublishTimeout; negative is invalid.
	PublishTimeout time.Duration
	// Logger receives Repair's publish failures. Default slog.Default().
	Logger *slog.Logger
}

// ProblemKind is the kind of a Problem.
type ProblemKind string

// The kinds of problem Verify reports (their JSON and text spelling is the
// string).
const (
	// ProblemMissing: JetStream holds no message for the event.
	ProblemMissing ProblemKind = "missing"
	// ProblemDuplicate: JetStream holds the event more than once; the
	// problem names each extra copy (its sequence), not the first.
	ProblemDuplicate ProblemKind = "duplicate"
	// ProblemOutOfOrder: the event's message is stored after a message of
	// a later version of the same stream.
	ProblemOutOfOrder ProblemKind = "out_of_order"
	// ProblemContentDiffers: the stored message is not what the bridge
	// publishes for the event as Postgres holds it now (data, subject,
	// Nats-Msg-Id, Content-Type or a ce-* header differ).
	ProblemContentDiffers ProblemKind = "content_differs"
)

// Problem is one finding of Verify.
type Problem struct {
	// Stream is the event's stream.
	Stream string `json:"stream"`
	// Version is the event's version in its stream.
	Version int64 `json:"version"`
	// EventID is the event id (for a duplicate or out-of-order message, the
	// id in its Nats-Msg-Id; 0 when that is not a number).
	EventID int64 `json:"event_id"`
	// Kind is what is wrong.
	Kind ProblemKind `json:"kind"`
	// Sequence is the JetStream stream sequence of the message concerned;
	// 0 for a missing event (before a repair).
	Sequence uint64 `json:"sequence,omitempty"`
	// Tail is set on a missing event that comes after every message
	// JetStream holds of its stream: Repair re-publishes these. A missing
	// event without Tail is a hole in the middle of the stream.
	Tail bool `json:"tail,omitempty"`
	// Detail says more, for a human.
	Detail string `json:"detail,omitempty"`
	// Repaired is set by Repair on a missing event it stored again.
	Repaired bool `json:"repaired,omitempty"`
}

// Report is the result of Verify (and, after Repair, of the repair too).
type Report struct {
	// Problems are sorted by stream, version and kind.
	Problems []Problem `json:"problems"`
	// Streams is how many streams were checked.
	Streams int `json:"streams"`
	// Events is how many Postgres events were checked.
	Events int64 `json:"events"`
	// Messages is how many JetStream messages were read.
	Messages int64 `json:"messages"`
	// AgedOut is how many of the events checked JetStream no longer
	// holds because the stream's own limits removed them (MaxAge,
	// MaxBytes, MaxMsgs, MaxMsgsPerSubject): retention, not loss. They are
	// not Problems, and Repair never re-publishes them.
	AgedOut int64 `json:"aged_out"`
	// Elapsed is how long Verify took; ReadJetStream the part of it spent
	// reading JetStream (the rest is reading Postgres and comparing).
	Elapsed       time.Duration `json:"-"`
	ReadJetStream time.Duration `json:"-"`

	found audit.Report // what Verify found, with the events Repair needs
	cfg   VerifyConfig // with defaults
}

// Counts returns the number of problems of each kind (every kind present,
// 0 when none), and how many of them Repair fixed.
func (r Report) Counts() (byKind map[ProblemKind]int, repaired int) {
	byKind = map[ProblemKind]int{ProblemMissing: 0, ProblemDuplicate: 0, ProblemOutOfOrder: 0, ProblemContentDiffers: 0}
	for _, p := range r.Problems {
		byKind[p.Kind]++
		if p.Repaired {
			repaired++
		}
	}
	return byKind, repaired
}

// Unresolved returns how many problems are left (not Repaired).
func (r Report) Unresolved() int {
	n := 0
	for _, p := range r.Problems {
		if !p.Repaired {
			n++
		}
	}
	return n
}

// EventsPerSecond is Events over Elapsed (0 when nothing was timed).
func (r Report) EventsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

// Verify compares what Postgres holds of streams (read from st) with the
// messages JetStream stores for them in cfg.Stream, for every event up to
// each stream's watermark (StreamInfo.Watermark: read the watermarks
// before calling Verify, so that whatever was forwarded up to them is in
// JetStream, or lost). Events past the watermark are not forwarded yet
// and never reported.
//
// JetStream acknowledges a publish before it is on disk, so a crash of
// the server or its machine can lose messages the bridge counted as
// forwarded; Verify reports, per event, whether JetStream is missing it,
// stores it twice, out of order, or other than the bridge publishes it.
// It reads JetStream with an ordered consumer (an ephemeral cursor), so
// it leaves nothing behind and disturbs no subscription.
//
// Errors are failures to read either side (the audit is then incomplete;
// ErrNoStream when the JetStream stream does not exist), or a bad cfg
// (ErrInvalidConfig); the problems found are in the Report.
func Verify(ctx context.Context, js jetstream.JetStream, st *store.Store, streams []store.StreamInfo, cfg VerifyConfig) (Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Report{}, err
	}
	in := make([]audit.Stream, len(streams))
	for i, s := range streams {
		in[i] = audit.Stream{Name: s.Stream, Watermark: s.Watermark}
	}
	found, err := audit.Verify(ctx, js, st, in, cfg.All, audit.Config{
		Stream: cfg.Stream, Prefix: cfg.SubjectPrefix, Source: cfg.Source, Since: cfg.Since, PageSize: cfg.PageSize,
	})
	if errors.Is(err, audit.ErrNoStream) {
		err = fmt.Errorf("%w: %q", ErrNoStream, cfg.Stream)
	}
	rep := Report{found: found, cfg: cfg}
	rep.fill()
	return rep, err
}

// Repair re-publishes every missing event in its stream's tail
// (Problem.Tail: after every message JetStream holds of the stream) of
// rep, as Verify found it, in version order, and marks those JetStream
// stored as Repaired; the rest say in their Detail why they were left.
//
// The publishes take the bridge's normal path: the first publish of a
// stream expects the last message stored on its subjects
// (Nats-Expected-Last-Subject-Sequence), so a bridge publishing the same
// stream meanwhile makes the repair fail, never interleave; and
// Nats-Msg-Id is the event id, so JetStream drops a copy it still
// remembers (repair again after the duplicate window). A hole (a missing
// event before a stored version) is never re-published: JetStream
// appends, and every consumer would see the stream out of order. A
// duplicate, out-of-order or differing message is reported only:
// Postgres may be the side that changed, and deleting messages is an
// operator's decision.
//
// It returns an error only when ctx ended (or js is nil).
func Repair(ctx context.Context, js jetstream.JetStream, rep *Report) error {
	cfg := rep.cfg
	fwd, err := forward.New(js, forward.Config{Prefix: cfg.SubjectPrefix, Source: cfg.Source, Stream: cfg.Stream,
		PublishTimeout: cfg.PublishTimeout, Logger: cfg.Logger})
	if err != nil {
		return fmt.Errorf("repair: %w", err)
	}
	if err := audit.Repair(ctx, fwd, &rep.found); err != nil {
		return err
	}
	rep.fill()
	return nil
}

// fill sets r's exported fields from what the audit found.
func (r *Report) fill() {
	f := r.found
	r.Streams, r.Events, r.Messages, r.Elapsed, r.ReadJetStream = f.Streams, f.Events, f.Messages, f.Elapsed, f.ReadJetStream
	r.AgedOut = f.AgedOut
	r.Problems = make([]Problem, len(f.Problems))
	for i, p := range f.Problems {
		r.Problems[i] = Problem{Stream: p.Stream, Version: p.Version, EventID: p.EventID, Kind: ProblemKind(p.Kind),
			Sequence: p.Sequence, Tail: p.Tail, Detail: p.Detail, Repaired: p.Repaired}
	}
}

// withDefaults returns c with its zero fields set, or an error wrapping
// ErrInvalidConfig naming the first bad field.
func (c VerifyConfig) withDefaults() (VerifyConfig, error) {
	if c.PageSize < 0 {
		return c, fmt.Errorf("%w: VerifyConfig.PageSize %d is negative", ErrInvalidConfig, c.PageSize)
	}
	if c.PublishTimeout < 0 {
		return c, fmt.Errorf("%w: VerifyConfig.PublishTimeout %s is negative", ErrInvalidConfig, c.PublishTimeout)
	}
	base, err := Config{Stream: c.Stream, SubjectPrefix: c.SubjectPrefix, Source: c.Source, PublishTimeout: c.PublishTimeout, Logger: c.Logger}.withDefaults()
	if err != nil {
		return c, err
	}
	c.Stream, c.SubjectPrefix, c.Source, c.PublishTimeout, c.Logger = base.Stream, base.SubjectPrefix, base.Source, base.PublishTimeout, base.Logger
	c.PageSize = or(c.PageSize, DefaultVerifyPageSize)
	return c, nil
}
