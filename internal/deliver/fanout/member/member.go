// Package member is the shared engine's member index: every
// subscription of a replica as the fan-out sees it (Member: what it
// takes, how it is sent, how much it may hold), its filters in a subject
// trie (nats-server's generic sublist) that every partition the replica
// owns matches its events against. It knows nothing of partitions,
// positions or attempts; the fan-out (internal/deliver/fanout) and the
// replica (internal/deliver/shared) use it.
package member

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats-server/v2/server/gsl"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// Defaults of a Member's limits (MaxInFlight, MaxInHand).
const defaultMaxInFlight, defaultMaxInHand = 1, 1000

// errInvalid is wrapped by Index.Put for a Member it cannot use; the
// message names the field and the value.
var errInvalid = errors.New("invalid fan-out member")

// Member is one subscription as the fan-out sees it: what it takes, how
// it is sent, and how much it may hold.
type Member struct {
	// Name is the subscription's name ([A-Za-z0-9_-]+, a key token of the
	// positions bucket). Required.
	Name string
	// Filters select its events by their subject as stored
	// ("events.order.>", "events.*.*.OrderPlaced"); an event is its when
	// any filter matches. At least one.
	Filters []string
	// Ordered is ordering: stream (each stream's versions one at a time,
	// write before next); false is ordering: none (in parallel).
	Ordered bool
	// MaxInFlight bounds an unordered subscription's sends running at
	// once on the partition (its events of one stream included); an
	// ordered one's are bounded by the Sender (the replica's slots).
	// Default 1.
	MaxInFlight int
	// MaxInHand bounds its events dispatched and not settled on the
	// partition (max_ack_pending per partition owner); reaching it gives
	// the subscription a cursor. Default 1000 (the subscription's
	// max_ack_pending default); at least MaxInFlight.
	MaxInHand int
}

// Of is the Member of subscription s (its defaults applied):
// FilterSubjects, Ordering, MaxInFlight and MaxAckPending.
func Of(s subscription.Subscription) Member {
	return Member{Name: s.Name, Filters: s.FilterSubjects, Ordered: s.Ordering != subscription.OrderingNone,
		MaxInFlight: s.MaxInFlight, MaxInHand: s.MaxAckPending}
}

func (m *Member) check() error {
	if m.MaxInFlight == 0 {
		m.MaxInFlight = defaultMaxInFlight
	}
	if m.MaxInHand == 0 {
		m.MaxInHand = max(defaultMaxInHand, m.MaxInFlight)
	}
	switch {
	case m.Name == "" || strings.ContainsAny(m.Name, ".*> \t\r\n"):
		return fmt.Errorf("%w: Name %q: want [A-Za-z0-9_-]+", errInvalid, m.Name)
	case len(m.Filters) == 0:
		return fmt.Errorf("%w: %s: Filters is empty", errInvalid, m.Name)
	case m.MaxInFlight < 0:
		return fmt.Errorf("%w: %s: MaxInFlight %d is negative", errInvalid, m.Name, m.MaxInFlight)
	case m.MaxInHand < m.MaxInFlight:
		return fmt.Errorf("%w: %s: MaxInHand %d is below MaxInFlight %d", errInvalid, m.Name, m.MaxInHand, m.MaxInFlight)
	}
	return nil
}

// Entry is a Member as the index holds it; each Put makes a new one, so
// a partition can tell a Member put again (new limits) by its pointer.
type Entry struct {
	Member
	// Gen is the index's generation when the name was first put (a
	// replacement keeps it): an Entry whose Gen is above a partition's
	// Index.Generation at its start was put after it.
	Gen   uint64
	multi bool // more than one filter: a subject may match it twice
}

// Takes reports whether e's filters match subject (one member, without
// the trie).
func (e *Entry) Takes(subject string) bool {
	for _, f := range e.Filters {
		if _, ok := wire.IntersectFilters(f, subject); ok {
			return true
		}
	}
	return false
}

// Index is the replica's member index: every subscription's filters in
// a subject trie (nats-server's generic sublist), shared by the
// partitions the replica owns, edited as subscriptions are put or
// removed. Matching an event costs about 0.2 µs plus 0.02 µs per
// subscription that takes it (the design's BenchmarkMemberMatch). Safe
// for concurrent use. The zero value is not usable: make one with
// NewIndex.
type Index struct {
	mu     sync.Mutex // Put and Remove
	sl     *gsl.GenericSublist[*Entry]
	byName sync.Map // name → *Entry
	gen    uint64   // names put so far, under mu
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{sl: gsl.NewSublist[*Entry]()}
}

// Put adds subscription m, or replaces the one of its name (its filters
// and limits; the partitions see the new limits from their next event).
// A name new to the index gets the next generation (Entry.Gen). Errors
// name the field and the value (errInvalid), or wrap gsl's
// ErrInvalidSubject for a filter that is no subject.
func (ix *Index) Put(m Member) error {
	if err := m.check(); err != nil {
		return err
	}
	nm := &Entry{Member: m, multi: len(m.Filters) > 1}
	nm.Filters = slices.Clone(m.Filters)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if old, ok := ix.Entry(m.Name); ok {
		nm.Gen = old.Gen
	} else {
		ix.gen++
		nm.Gen = ix.gen
	}
	for i, f := range nm.Filters {
		if err := ix.sl.Insert(f, nm); err != nil {
			for _, g := range nm.Filters[:i] {
				_ = ix.sl.Remove(g, nm)
			}
			return fmt.Errorf("%w: %s: filter %q: %w", errInvalid, m.Name, f, err)
		}
	}
	if old, ok := ix.byName.Swap(m.Name, nm); ok {
		ix.unindex(old.(*Entry))
	}
	return nil
}

// Remove takes subscription name out of the index and reports whether it
// was there. Matches stop finding it at once.
func (ix *Index) Remove(name string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	old, ok := ix.byName.LoadAndDelete(name)
	if ok {
		ix.unindex(old.(*Entry))
	}
	return ok
}

// Generation is the count of names put so far: an Entry whose Gen is
// above it was put after the call.
func (ix *Index) Generation() uint64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.gen
}

func (ix *Index) unindex(e *Entry) {
	for _, f := range e.Filters {
		_ = ix.sl.Remove(f, e)
	}
}

// Get returns subscription name's Member.
func (ix *Index) Get(name string) (Member, bool) {
	e, ok := ix.Entry(name)
	if !ok {
		return Member{}, false
	}
	return e.Member, true
}

// Entry returns subscription name's Entry (do not change it).
func (ix *Index) Entry(name string) (*Entry, bool) {
	v, ok := ix.byName.Load(name)
	if !ok {
		return nil, false
	}
	return v.(*Entry), true
}

// Match appends to out the entries that take subject, each once.
func (ix *Index) Match(subject string, out []*Entry) []*Entry {
	ix.sl.Match(subject, func(e *Entry) {
		if e.multi && slices.Contains(out, e) {
			return
		}
		out = append(out, e)
	})
	return out
}
