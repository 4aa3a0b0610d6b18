package forward

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of StreamConfig.
const (
	// DefaultDuplicateWindow is the duplicate window of a created stream.
	DefaultDuplicateWindow = 2 * time.Minute
)

// ErrInvalidConfig is returned (wrapped) by New and Provision when a field of
// their configuration is out of range; the message names the field and value.
var ErrInvalidConfig = errors.New("invalid forward configuration")

// ErrSubjectsNotCovered is returned (wrapped) by Provision when the JetStream
// stream exists but none of its subjects covers "<prefix>.>", so some events
// would be published to no stream (or to another one).
var ErrSubjectsNotCovered = errors.New("JetStream stream does not cover the subject prefix")

// ErrReplicasNotSupported is returned (wrapped) by Provision when
// StreamConfig.Replicas is above 1 and the server is not part of a
// JetStream cluster (JetStream API error 10074): a standalone server keeps
// one copy only. Waiting cannot fix it.
var ErrReplicasNotSupported = errors.New("replicas > 1 need a clustered JetStream")

// apiErrReplicasNotSupported is JetStream's error code for a stream asking
// for more than 1 replica on a server that is not clustered.
const apiErrReplicasNotSupported jetstream.ErrorCode = 10074

// StreamConfig says which JetStream stream Provision makes sure exists.
type StreamConfig struct {
	// Name is the JetStream stream's name. Default "EVENTS".
	Name string
	// Prefix is the subject prefix; the stream's subjects are "<prefix>.>".
	// Default "events". It must be a literal subject (no wildcards, no empty
	// tokens, no whitespace).
	Prefix string
	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id to drop a
	// re-publish. Default 2 min. The bridge sizes it (bridge.RequiredDuplicateWindow).
	DuplicateWindow time.Duration
	// Replicas is the number of copies JetStream keeps of a stream it
	// creates: 1 on a standalone server, 3 (or 5) on a cluster so that the
	// stream survives the loss of a node. Default 1. A standalone server
	// refuses more than 1 (ErrReplicasNotSupported); an existing stream
	// with another count is reported in Provisioned.Warnings, not changed.
	Replicas int
	// MaxMsgSize is the largest message the stream accepts, in bytes. 0 means
	// the server's limit.
	MaxMsgSize int32
	// Limits is the retention of a stream Provision creates. The zero
	// value keeps every message forever. An existing stream keeps its own;
	// Provisioned.Limits reports them and a warning says when they differ.
	Limits Limits
	// Compress asks for S2 compression of a stream Provision creates:
	// JetStream compresses each block of its file store once the block is
	// full (8 MiB), about 2.7 × smaller with JSON events (docs/retention.md),
	// and decompresses a whole block to read an older message from it
	// (reconciliation's look-ups, `bridge verify`, a consumer far behind).
	// MaxBytes and the stream's state count uncompressed bytes. Default
	// false (no compression). An existing stream keeps its own; a warning
	// says when compression was asked for and the stream has none.
	Compress bool
}

// Limits is a JetStream stream's retention: what JetStream removes, oldest
// first, without anyone asking. Zero fields mean no limit. A limit gives
// up the events it removes: a new subscription cannot read them, and
// `bridge verify` reports them as aged out (never missing, never
// repaired). Reconciliation tells an aged-out stream from a lost one (see
// Forwarder.Handle). docs/retention.md says what each one gives up.
type Limits struct {
	// MaxAge removes a message once it is older than this.
	MaxAge time.Duration
	// MaxBytes removes the oldest messages while the stream holds more
	// than this many bytes.
	MaxBytes int64
	// MaxMsgsPerSubject keeps at most this many messages per subject:
	// the last n events of each event name of each source stream.
	MaxMsgsPerSubject int64
}

// IsZero reports whether l keeps every message forever.
func (l Limits) IsZero() bool { return l == Limits{} }

// String spells l for logs: "max_age=24h0m0s max_bytes=1073741824
// max_msgs_per_subject=none", "none" for no limit.
func (l Limits) String() string {
	age, bytes, per := "none", "none", "none"
	if l.MaxAge > 0 {
		age = l.MaxAge.String()
	}
	if l.MaxBytes > 0 {
		bytes = strconv.FormatInt(l.MaxBytes, 10)
	}
	if l.MaxMsgsPerSubject > 0 {
		per = strconv.FormatInt(l.MaxMsgsPerSubject, 10)
	}
	return "max_age=" + age + " max_bytes=" + bytes + " max_msgs_per_subject=" + per
}

// LimitsOf returns the retention of a JetStream stream's configuration
// (JetStream spells "no limit" as 0 or -1; Limits as 0).
func LimitsOf(c jetstream.StreamConfig) Limits {
	return Limits{MaxAge: max(c.MaxAge, 0), MaxBytes: max(c.MaxBytes, 0), MaxMsgsPerSubject: max(c.MaxMsgsPerSubject, 0)}
}

// jetStream returns l as JetStream spells it: -1 for no size or
// count limit.
func (l Limits) jetStream() (maxAge time.Duration, maxBytes, perSubject int64) {
	maxBytes, perSubject = -1, -1
	if l.MaxBytes > 0 {
		maxBytes = l.MaxBytes
	}
	if l.MaxMsgsPerSubject > 0 {
		perSubject = l.MaxMsgsPerSubject
	}
	return l.MaxAge, maxBytes, perSubject
}

// withDefaults fills defaults and validates.
func (c StreamConfig) withDefaults() (StreamConfig, error) {
	if c.Name == "" {
		c.Name = wire.DefaultEventsStream
	}
	if c.Prefix == "" {
		c.Prefix = wire.DefaultEventsPrefix
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if strings.ContainsAny(c.Name, ".*> \t\r\n/\\") {
		return c, fmt.Errorf("%w: StreamConfig.Name %q: a JetStream stream name may not contain '.', '*', '>', whitespace or path separators", ErrInvalidConfig, c.Name)
	}
	if err := wire.ValidatePrefix(c.Prefix); err != nil {
		return c, fmt.Errorf("%w: StreamConfig.Prefix: %w", ErrInvalidConfig, err)
	}
	if c.DuplicateWindow < 0 {
		return c, fmt.Errorf("%w: StreamConfig.DuplicateWindow %s is negative", ErrInvalidConfig, c.DuplicateWindow)
	}
	if c.Replicas < 0 {
		return c, fmt.Errorf("%w: StreamConfig.Replicas %d is negative", ErrInvalidConfig, c.Replicas)
	}
	if c.MaxMsgSize < 0 {
		return c, fmt.Errorf("%w: StreamConfig.MaxMsgSize %d is negative", ErrInvalidConfig, c.MaxMsgSize)
	}
	if err := c.Limits.validate("StreamConfig.Limits"); err != nil {
		return c, err
	}
	return c, nil
}

// validate fails with ErrInvalidConfig naming field when a limit is
// negative (or MaxAge is below the 100 ms JetStream accepts).
func (l Limits) validate(field string) error {
	switch {
	case l.MaxAge < 0:
		return fmt.Errorf("%w: %s.MaxAge %s is negative", ErrInvalidConfig, field, l.MaxAge)
	case l.MaxAge > 0 && l.MaxAge < 100*time.Millisecond:
		return fmt.Errorf("%w: %s.MaxAge %s is below the 100ms JetStream accepts", ErrInvalidConfig, field, l.MaxAge)
	case l.MaxBytes < 0:
		return fmt.Errorf("%w: %s.MaxBytes %d is negative", ErrInvalidConfig, field, l.MaxBytes)
	case l.MaxMsgsPerSubject < 0:
		return fmt.Errorf("%w: %s.MaxMsgsPerSubject %d is negative", ErrInvalidConfig, field, l.MaxMsgsPerSubject)
	}
	return nil
}

// Provisioned reports what Provision found or did.
type Provisioned struct {
	// Created is true when Provision created the stream, false when it
	// existed (and was left unchanged).
	Created bool
	// Name is the JetStream stream's name.
	Name string
	// Subjects are the stream's subjects.
	Subjects []string
	// DuplicateWindow is the stream's actual duplicate window.
	DuplicateWindow time.Duration
	// Storage is the stream's storage type.
	Storage jetstream.StorageType
	// Replicas is the stream's actual replica count.
	Replicas int
	// BatchPublish reports whether the stream allows fast batches
	// (allow_batched, nats-server 2.14+), which the Forwarder uses to
	// publish a stream's events without a round trip each.
	BatchPublish bool
	// Limits is the stream's actual retention (for an existing stream,
	// its own, whatever was asked).
	Limits Limits
	// Compressed reports whether the stream's file store is compressed
	// (S2; for an existing stream, its own, whatever was asked).
	Compressed bool
	// AllowDirect reports whether the stream answers direct gets
	// ($JS.API.DIRECT.GET, allow_direct), which the consumer's readers
	// use to read a stretch of it back without a consumer (a
	// subscription catching up, a new owner's catch-up). A created
	// stream has it; an existing one keeps its own, with a warning when
	// it is off.
	AllowDirect bool
	// Warnings are human-readable problems of an existing stream that do not
	// stop the bridge but weaken its guarantees (a duplicate window shorter
	// than configured, memory storage). Empty when there are none.
	Warnings []string
}

// Provision makes sure the JetStream stream cfg describes exists. When it is
// missing, Provision creates it with subjects "<prefix>.>", file storage,
// cfg.DuplicateWindow, cfg.Replicas, cfg.MaxMsgSize, cfg.Limits (the
// oldest messages discarded first) and, when cfg.Compress, S2
// compression, and AllowDirect (direct gets, which the consumer's readers
// use). When it exists (or another bridge creates it concurrently),
// Provision changes nothing: it fails with ErrSubjectsNotCovered unless
// one of the stream's subjects covers "<prefix>.>", and adds a warning to
// Provisioned when the stream's duplicate window is shorter than
// cfg.DuplicateWindow, it does not allow batched publishing (nats-server
// 2.14+) or direct gets, its replica count is not cfg.Replicas, its
// limits are not cfg.Limits, it is not compressed although cfg.Compress
// asks for it, or its storage is memory.
// Invalid cfg fields fail with ErrInvalidConfig, replicas above 1 on a
// standalone server with ErrReplicasNotSupported; JetStream errors are
// returned wrapped.
func Provision(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (Provisioned, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Provisioned{}, err
	}
	if js == nil {
		return Provisioned{}, fmt.Errorf("%w: JetStream context is nil", ErrInvalidConfig)
	}
	subject := cfg.Prefix + ".>"
	maxAge, maxBytes, perSubject := cfg.Limits.jetStream()
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        cfg.Name,
			Description: "jsbridge: events forwarded from the event store",
			Subjects:    []string{subject},
			Storage:     jetstream.FileStorage,
			Duplicates:  cfg.DuplicateWindow,
			Replicas:    cfg.Replicas,
			MaxMsgSize:  cfg.MaxMsgSize,
			// Retention: the oldest go first (DiscardOld), so a limit
			// never refuses a publish.
			MaxAge:            maxAge,
			MaxBytes:          maxBytes,
			MaxMsgsPerSubject: perSubject,
			Discard:           jetstream.DiscardOld,
			// Fast batches (nats-server 2.14+): see Forwarder.
			AllowBatchPublish: serverAtLeast(js.Conn(), 2, 14),
			Compression:       compression(cfg.Compress),
			// Direct gets: reads of a stretch of events by sequence or
			// subject that any replica may answer, for the consumer's
			// readers (docs/design/next-engine.md, section 3).
			AllowDirect: true,
		})
		if err == nil {
			info := s.CachedInfo()
			return Provisioned{
				Created:         true,
				Name:            info.Config.Name,
				Subjects:        info.Config.Subjects,
				DuplicateWindow: info.Config.Duplicates,
				Storage:         info.Config.Storage,
				Replicas:        info.Config.Replicas,
				BatchPublish:    info.Config.AllowBatchPublish,
				Limits:          LimitsOf(info.Config),
				Compressed:      info.Config.Compression != jetstream.NoCompression,
				AllowDirect:     info.Config.AllowDirect,
			}, nil
		}
		var api *jetstream.APIError
		if errors.As(err, &api) && api.ErrorCode == apiErrReplicasNotSupported {
			return Provisioned{}, fmt.Errorf("%w: StreamConfig.Replicas %d for JetStream stream %s, but the NATS server is standalone (not in a cluster); ask for 1 replica or connect to a JetStream cluster: %w",
				ErrReplicasNotSupported, cfg.Replicas, cfg.Name, err)
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return Provisioned{}, fmt.Errorf("create JetStream stream %s (subjects %s): %w", cfg.Name, subject, err)
		}
		// Another bridge created it first: check theirs like any existing one.
		s, err = js.Stream(ctx, cfg.Name)
	}
	if err != nil {
		return Provisioned{}, fmt.Errorf("look up JetStream stream %s: %w", cfg.Name, err)
	}
	info := s.CachedInfo()
	p := Provisioned{
		Name:            info.Config.Name,
		Subjects:        info.Config.Subjects,
		DuplicateWindow: info.Config.Duplicates,
		Storage:         info.Config.Storage,
		Replicas:        info.Config.Replicas,
		BatchPublish:    info.Config.AllowBatchPublish,
		Limits:          LimitsOf(info.Config),
		Compressed:      info.Config.Compression != jetstream.NoCompression,
		AllowDirect:     info.Config.AllowDirect,
	}
	covered := false
	for _, have := range info.Config.Subjects {
		if subjectCovers(have, subject) {
			covered = true
			break
		}
	}
	if !covered {
		return p, fmt.Errorf("%w: JetStream stream %s has subjects %q, none covers %q; add it with: nats stream edit %s --subjects %q",
			ErrSubjectsNotCovered, cfg.Name, info.Config.Subjects, subject, cfg.Name, subject)
	}
	if p.DuplicateWindow < cfg.DuplicateWindow {
		p.Warnings = append(p.Warnings, fmt.Sprintf(
			"JetStream stream %s has duplicate window %s, shorter than the configured %s: an event re-published after %s is stored twice; "+
				"raise it with: nats stream edit %s --dupe-window %s (or set the bridge's DuplicateWindow to the window you accept)",
			cfg.Name, p.DuplicateWindow, cfg.DuplicateWindow, p.DuplicateWindow, cfg.Name, cfg.DuplicateWindow))
	}
	if !p.BatchPublish && serverAtLeast(js.Conn(), 2, 14) {
		p.Warnings = append(p.Warnings, fmt.Sprintf(
			"JetStream stream %s does not allow batched publishing (allow_batched): the bridge publishes one event at a time, waiting for each PubAck, several times slower; "+
				"turn it on by setting \"allow_batched\": true in the stream's configuration (e.g. nats stream info %s --json, edit, nats stream edit %s --config FILE)", cfg.Name, cfg.Name, cfg.Name))
	}
	if p.Limits != cfg.Limits {
		p.Warnings = append(p.Warnings, fmt.Sprintf(
			"JetStream stream %s has retention %s, not the %s asked for; it is left as it is (a stream's retention is the operator's): "+
				"change it with: bridge retention --jetstream-stream %s --max-age ... --max-bytes ... --max-msgs-per-subject ... --yes (or ask for what it has)",
			cfg.Name, p.Limits, cfg.Limits, cfg.Name))
	}
	if cfg.Compress && !p.Compressed {
		p.Warnings = append(p.Warnings, fmt.Sprintf(
			"JetStream stream %s is not compressed, and compression was asked for; it is left as it is (an existing stream's configuration is the operator's): "+
				"turn it on with: nats stream edit %s --compression s2 (JetStream compresses the blocks it writes after the server's next restart)", cfg.Name, cfg.Name))
	}
	if !p.AllowDirect {
		p.Warnings = append(p.Warnings, allowDirectWarning(cfg.Name))
	}
	if w := replicasWarning(cfg.Name, p.Replicas, cfg.Replicas); w != "" {
		p.Warnings = append(p.Warnings, w)
	}
	if p.Storage == jetstream.MemoryStorage {
		p.Warnings = append(p.Warnings, fmt.Sprintf(
			"JetStream stream %s uses memory storage: forwarded events are lost when the server restarts", cfg.Name))
	}
	return p, nil
}

// allowDirectWarning is the warning for an existing JetStream stream
// without AllowDirect. Provision does not turn it on: an existing stream's
// configuration is the operator's.
func allowDirectWarning(stream string) string {
	return fmt.Sprintf("JetStream stream %s does not allow direct gets (allow_direct): a consumer reading a stretch of it back by direct gets "+
		"(a subscription catching up, a new owner's catch-up) gets no answer; it is left as it is: "+
		"turn it on with: nats stream edit %s --allow-direct (readers of its subjects see no change)", stream, stream)
}

// compression is the JetStream store compression for Compress.
func compression(compress bool) jetstream.StoreCompression {
	if compress {
		return jetstream.S2Compression
	}
	return jetstream.NoCompression
}

// replicasWarning returns the warning for an existing JetStream stream
// whose replica count (have) differs from the one asked for (want), or ""
// when they are equal. Provision does not change the count itself: scaling
// a stream moves its data between servers, an operator's decision
// ("nats stream edit <stream> --replicas <want>").
func replicasWarning(stream string, have, want int) string {
	if have == want {
		return ""
	}
	return fmt.Sprintf("JetStream stream %s has %d replica(s), not the %d asked for; it is left as it is: "+
		"change it with: nats stream edit %s --replicas %d (or ask for %d)", stream, have, want, stream, want, have)
}

// serverAtLeast reports whether the server nc is connected to runs version
// major.minor or later ("2.15.2" is at least 2.14). It is false when nc is
// nil or the version cannot be read.
func serverAtLeast(nc *nats.Conn, major, minor int) bool {
	if nc == nil {
		return false
	}
	parts := strings.SplitN(nc.ConnectedServerVersion(), ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimLeft(parts[1], "v"))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// subjectCovers reports whether every subject matching sub also matches
// filter. Both may contain wildcards ("*" one token, ">" one or more
// trailing tokens).
func subjectCovers(filter, sub string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(sub, ".")
	for i, f := range ft {
		if f == ">" {
			return i < len(st)
		}
		if i >= len(st) {
			return false
		}
		switch s := st[i]; {
		case s == ">":
			return false
		case f == "*":
		case f != s || s == "*":
			return false
		}
	}
	return len(ft) == len(st)
}
