// Package audit compares the events Postgres holds with the messages
// JetStream stores for them, and re-publishes a stream's missing tail.
//
// JetStream acknowledges a publish before it is on disk (the server
// flushes periodically), so a crash of the server or its machine can lose
// messages the bridge already counted as forwarded. Postgres holds every
// event: Verify reads both sides and reports, for every event up to its
// stream's watermark, whether JetStream is missing it, stores it twice,
// stores it out of order, or stores something other than what the bridge
// publishes for it. Events past the watermark are not forwarded yet and
// are never reported.
//
// JetStream is read with an ordered consumer (an ephemeral, server-side
// cursor the client recreates on a gap), never a durable consumer, so an
// audit leaves nothing behind and disturbs no subscription. Postgres is
// read through a Source, one page of one stream at a time.
package audit

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// Kind is the kind of a Problem.
type Kind string

// The kinds of problem Verify reports.
const (
	// Missing: JetStream holds no message for the event.
	Missing Kind = "missing"
	// Duplicate: JetStream holds the event more than once; the problem
	// names each extra copy (its sequence), not the first.
	Duplicate Kind = "duplicate"
	// OutOfOrder: the event's message is stored after a message of a later
	// version of the same stream.
	OutOfOrder Kind = "out_of_order"
	// ContentDiffers: the stored message is not what the bridge publishes
	// for the event as Postgres holds it now (data, subject, Nats-Msg-Id,
	// Content-Type or a ce-* header differ).
	ContentDiffers Kind = "content_differs"
)

// Problem is one finding of Verify.
type Problem struct {
	// Stream is the event's stream.
	Stream string `json:"stream"`
	// Version is the event's version in its stream.
	Version int64 `json:"version"`
	// EventID is the event id (for a Duplicate or OutOfOrder message, the
	// id in its Nats-Msg-Id; 0 when that is not a number).
	EventID int64 `json:"event_id"`
	// Kind is what is wrong.
	Kind Kind `json:"kind"`
	// Sequence is the JetStream stream sequence of the message concerned;
	// 0 for Missing (before a repair) .
	Sequence uint64 `json:"sequence,omitempty"`
	// Tail is set on a Missing event that comes after every message JetStream
	// holds of its stream: Repair re-publishes these. A Missing event
	// without Tail is a hole in the middle of the stream.
	Tail bool `json:"tail,omitempty"`
	// Detail says more, for a human.
	Detail string `json:"detail,omitempty"`
	// Repaired is set by Repair on a Missing event it stored again.
	Repaired bool `json:"repaired,omitempty"`

	ev event.Event // the event as Postgres holds it, for Repair
}

// Stream is one stream to verify.
type Stream struct {
	// Name is the stream's name.
	Name string
	// Watermark is the version of its last forwarded event (-1: none).
	// Read it before Verify reads JetStream: whatever was forwarded up to
	// it is then in JetStream (or lost).
	Watermark int64
}

// Source reads a stream's events from Postgres; *store.Store is one.
type Source interface {
	// StreamEvents returns up to limit events of stream with after <
	// version <= through (created at or after since, when since is not
	// zero), in version order, read as the drain reads them.
	StreamEvents(ctx context.Context, stream string, after, through int64, since time.Time, limit int) ([]event.Event, error)
}

// Defaults of Config.
const (
	// DefaultPageSize is how many events of a stream one Postgres read
	// returns.
	DefaultPageSize = 1000
	// SinceSkew is how much earlier than Config.Since JetStream is read:
	// an event created at Since is stored in JetStream later, but the
	// clocks of Postgres and the NATS server may disagree by this much.
	SinceSkew = 5 * time.Minute
	// maxFilterSubjects is how many streams are read with one filter
	// subject each; past it the whole prefix is read and other streams'
	// messages are skipped.
	maxFilterSubjects = 100
	// readers is how many streams are read from Postgres at once.
	readers = 8
)

// ErrNoStream is wrapped when the JetStream stream does not exist.
var ErrNoStream = errors.New("JetStream stream not found")

// Config configures Verify. The zero value checks the EVENTS stream with
// the bridge's defaults.
type Config struct {
	// Stream is the JetStream stream the bridge publishes to. Default
	// "EVENTS".
	Stream string
	// Prefix and Source are the bridge's subject prefix and CloudEvents
	// source (forward.Config); they must match the bridge's, or every
	// event is reported missing or differing. Defaults "events" and
	// "jsbridge".
	Prefix string
	Source string
	// Since, when not zero, checks only events created at or after it;
	// JetStream is read from SinceSkew before it.
	Since time.Time
	// PageSize is how many events one Postgres read returns. Default
	// DefaultPageSize.
	PageSize int
}

// Report is the result of Verify.
type Report struct {
	// Problems are sorted by stream, version and kind.
	Problems []Problem `json:"problems"`
	// Streams is how many streams were checked.
	Streams int `json:"streams"`
	// Events is how many Postgres events were checked.
	Events int64 `json:"events"`
	// Messages is how many JetStream messages were read.
	Messages int64 `json:"messages"`
	// AgedOut is how many events checked the stream's limits removed
	// from JetStream (see Retention); they are not Problems.
	AgedOut int64 `json:"aged_out"`
	// Elapsed is how long Verify took; ReadJetStream the part of it spent
	// reading JetStream (the rest is reading Postgres and comparing).
	Elapsed       time.Duration `json:"-"`
	ReadJetStream time.Duration `json:"-"`
}

// Counts returns the number of problems of each kind, and how many of
// them Repair fixed.
func (r Report) Counts() (byKind map[Kind]int, repaired int) {
	byKind = map[Kind]int{Missing: 0, Duplicate: 0, OutOfOrder: 0, ContentDiffers: 0}
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

// Verify compares streams in Postgres (through src) with what js stores
// in cfg.Stream. whole reads every subject under the prefix in one pass
// (an audit of all streams); otherwise each stream's subjects are read
// (wire.StreamFilter), or the whole prefix when there are more than a
// hundred of them. Errors are failures to read either side (the audit is
// then incomplete); problems found are in the Report.
func Verify(ctx context.Context, js jetstream.JetStream, src Source, streams []Stream, whole bool, cfg Config) (Report, error) {
	start := time.Now()
	cfg = cfg.withDefaults()
	var filters []string
	if !whole && len(streams) <= maxFilterSubjects {
		for _, s := range streams {
			filters = append(filters, wire.StreamFilter(cfg.Prefix, s.Name))
		}
	}
	rep := Report{Streams: len(streams)}
	if len(streams) == 0 {
		rep.Elapsed = time.Since(start)
		return rep, nil
	}
	if filters == nil {
		filters = []string{cfg.Prefix + ".>"}
	}
	wanted := make(map[string]bool, len(streams))
	for _, s := range streams {
		wanted[s.Name] = true
	}
	stored, n, ret, err := readStored(ctx, js, cfg, filters, wanted)
	rep.ReadJetStream = time.Since(start)
	if err != nil {
		return rep, err
	}
	rep.Messages = n
	// Streams are read from Postgres concurrently: each is one round trip
	// per page, and a sequential audit of many small streams would wait on
	// them one after the other.
	type result struct {
		probs   []Problem
		checked int64
		agedOut int64
		err     error
	}
	results := make([]result, len(streams))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(readers, len(streams)) {
		wg.Go(func() {
			for i := range next {
				r := &results[i]
				r.probs, r.checked, r.agedOut, r.err = checkStream(ctx, src, cfg, streams[i], stored[streams[i].Name], ret)
			}
		})
	}
	for i := range streams {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, r := range results {
		if r.err != nil {
			return rep, r.err
		}
		rep.Events += r.checked
		rep.AgedOut += r.agedOut
		rep.Problems = append(rep.Problems, r.probs...)
	}
	sortProblems(rep.Problems)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = wire.DefaultEventsStream
	}
	if c.Prefix == "" {
		c.Prefix = wire.DefaultEventsPrefix
	}
	if c.Source == "" {
		c.Source = forward.DefaultSource
	}
	if c.PageSize <= 0 {
		c.PageSize = DefaultPageSize
	}
	return c
}

// checkStream pages through s's events up to its watermark and compares
// each with what JetStream stores of the stream; it returns the problems,
// the events checked and how many of them aged out (ret).
func checkStream(ctx context.Context, src Source, cfg Config, s Stream, msgs []stored, ret Retention) ([]Problem, int64, int64, error) {
	var c *streamCheck
	var checked int64
	after := int64(-1)
	for {
		evs, err := src.StreamEvents(ctx, s.Name, after, s.Watermark, cfg.Since, cfg.PageSize)
		if err != nil {
			return nil, checked, 0, fmt.Errorf("verify stream %q: %w", s.Name, err)
		}
		for _, e := range evs {
			if c == nil {
				// The first event checked: with Since, earlier versions
				// are out of the audit on both sides.
				c = newStreamCheck(s.Name, msgs, e.Version, s.Watermark, ret)
			}
			c.event(e, forward.Message(e, forward.Config{Prefix: cfg.Prefix, Source: cfg.Source}))
			checked++
		}
		if len(evs) < cfg.PageSize {
			break
		}
		after = evs[len(evs)-1].Version
	}
	if c == nil {
		return nil, 0, 0, nil
	}
	return c.problems, checked, c.agedOut, nil
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.Stream != b.Stream {
			return a.Stream < b.Stream
		}
		if a.Version != b.Version {
			return a.Version < b.Version
		}
		return a.Kind < b.Kind
	})
}

// sums are what an audit keeps of a message to compare it: a hash of its
// data and one of its subject and the headers the bridge derives from the
// event.
type sums struct {
	data    [sha256.Size]byte
	dataLen int
	meta    [sha256.Size]byte
}

// sumsOf hashes msg's data, and its subject with Nats-Msg-Id,
// Content-Type and every ce-* header (names sorted, values in order).
// Other headers (a publisher's Nats-Expected-* expectations) are not the
// event's and are left out.
func sumsOf(subject string, h nats.Header, data []byte) sums {
	s := sums{data: sha256.Sum256(data), dataLen: len(data)}
	keys := make([]string, 0, len(h))
	for k := range h {
		if derivedHeader(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	m := sha256.New()
	m.Write([]byte(subject))
	for _, k := range keys {
		m.Write([]byte{0})
		m.Write([]byte(strings.ToLower(k)))
		for _, v := range h[k] {
			m.Write([]byte{1})
			m.Write([]byte(v))
		}
	}
	m.Sum(s.meta[:0])
	return s
}

// derivedHeader reports whether a header is one the bridge derives from
// the event.
func derivedHeader(k string) bool {
	return k == wire.HeaderMsgID || strings.EqualFold(k, wire.HeaderContentType) ||
		len(k) > 3 && strings.EqualFold(k[:3], "ce-")
}
