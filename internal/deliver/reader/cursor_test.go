package reader_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// stored is what a test published to the events stream: the subject of
// each sequence.
type stored map[uint64]string

// publishMixed stores n events interleaved over three categories (a, b,
// c) of four streams each and two event names (Placed, Paid), and one
// message on a subject that is no event's, and records their subjects.
func publishMixed(t *testing.T, js jetstream.JetStream, s stored, n int) {
	t.Helper()
	for k := range n {
		subject := wire.Subject(wire.DefaultEventsPrefix, fmt.Sprintf("%c-%d", 'a'+k%3, k/3%4), []string{"Placed", "Paid"}[k/12%2])
		ack, err := js.Publish(t.Context(), subject, []byte(fmt.Sprintf(`{"k":%d}`, k)))
		require.NoError(t, err)
		s[ack.Sequence] = subject
	}
	stray := wire.DefaultEventsPrefix + ".a.stray" // matches events.a.> but is no event's
	ack, err := js.Publish(t.Context(), stray, []byte(`{}`))
	require.NoError(t, err)
	s[ack.Sequence] = stray
}

// want returns the sequences in [from, to] of the events whose subject
// matches one of filters, in order.
func (s stored) want(from, to uint64, filters ...string) []uint64 {
	var out []uint64
	for seq := from; seq <= to; seq++ {
		subject, ok := s[seq]
		if !ok {
			continue
		}
		if _, _, err := wire.ParseSubject(wire.DefaultEventsPrefix, subject); err != nil {
			continue
		}
		for _, f := range filters {
			if matches(f, subject) {
				out = append(out, seq)
				break
			}
		}
	}
	return out
}

// matches reports whether subject matches filter (* one token, > the
// rest).
func matches(filter, subject string) bool {
	ft, st := splitTokens(filter), splitTokens(subject)
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) || f != "*" && f != st[i] {
			return false
		}
	}
	return len(ft) == len(st)
}

func splitTokens(s string) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == '.' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// drain reads c until ErrCaughtUp, checking each event against what was
// stored, and returns their sequences.
func drain(t *testing.T, c *reader.Cursor, s stored) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var out []uint64
	for {
		ev, err := c.Next(ctx)
		if errors.Is(err, reader.ErrCaughtUp) {
			return out
		}
		require.NoError(t, err, "after %d events", len(out))
		require.Equal(t, s[ev.Seq], ev.Subject)
		require.LessOrEqual(t, ev.Seq, c.Target(), "nothing past the target")
		stream, _, err := wire.ParseSubject(wire.DefaultEventsPrefix, ev.Subject)
		require.NoError(t, err)
		require.Equal(t, wire.StreamPartition(stream, partitions), ev.Partition)
		require.NotEmpty(t, ev.Data)
		require.False(t, ev.Time.IsZero())
		out = append(out, ev.Seq)
	}
}

// A cursor filtered by one category over interleaved categories reads
// exactly that category's events, in stream order, up to its target and
// nothing past it; extended, it reads on from where it was.
func TestACursorReadsItsCategoryUpToItsTarget(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	s := stored{}
	publishMixed(t, b.js, s, 300)
	c, err := reader.NewCursor(b.js, reader.Config{Batch: 16}, []string{"events.a.>"}, 1, 200)
	require.NoError(t, err)
	got := drain(t, c, s)
	require.Equal(t, s.want(1, 200, "events.a.>"), got)
	require.Len(t, got, 67, "every third of the first 200")
	_, err = c.Next(t.Context())
	require.ErrorIs(t, err, reader.ErrCaughtUp, "still caught up")

	publishMixed(t, b.js, s, 30)
	last := uint64(len(s))
	c.Extend(last)
	c.Extend(10) // a lower target changes nothing
	require.Equal(t, last, c.Target())
	require.Equal(t, s.want(201, last, "events.a.>"), drain(t, c, s), "on from the old target, the stray subject passed over")
}

// Two filters that overlap (a category, and an event name that category
// also has) merge by sequence: their union once, in order.
func TestACursorMergesItsFiltersBySequenceOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	s := stored{}
	publishMixed(t, b.js, s, 300)
	filters := []string{"events.a.>", "events.*.*.Paid"}
	c, err := reader.NewCursor(b.js, reader.Config{Batch: 7}, filters, 40, 260)
	require.NoError(t, err)
	got := drain(t, c, s)
	want := s.want(40, 260, filters...)
	require.Equal(t, want, got)
	require.Less(t, len(want), len(s.want(40, 260, filters[0]))+len(s.want(40, 260, filters[1])), "the filters overlap")
}

// A stream cursor reads its one stream and nothing else, from the Reader
// it came from.
func TestAStreamCursorReadsOneStream(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	s := stored{}
	publishMixed(t, b.js, s, 200)
	r := open(t, b, reader.Config{Batch: 4}, 1)
	filter := wire.StreamFilter(wire.DefaultEventsPrefix, "b-2")
	c, err := r.Cursor([]string{filter}, 1, uint64(len(s)))
	require.NoError(t, err)
	got := drain(t, c, s)
	require.Equal(t, s.want(1, uint64(len(s)), filter), got)
	require.NotEmpty(t, got)
}

func TestNewCursorRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	for _, c := range []struct {
		filters []string
		from    uint64
		want    string
	}{
		{nil, 1, "none given"},
		{[]string{"events.a.>", "events..b"}, 1, `filters[1] "events..b"`},
		{[]string{"events.>.a"}, 1, `filters[0] "events.>.a"`},
		{[]string{"events.a*"}, 1, `filters[0] "events.a*"`},
		{[]string{"events.a b"}, 1, `filters[0] "events.a b"`},
		{[]string{"events.>"}, 0, "start sequence 0"},
	} {
		_, err := reader.NewCursor(b.js, reader.Config{}, c.filters, c.from, 10)
		require.ErrorIs(t, err, reader.ErrInvalidConfig)
		require.ErrorContains(t, err, c.want)
	}
	_, err := reader.NewCursor(b.js, reader.Config{Batch: -1}, []string{"events.>"}, 1, 10)
	require.ErrorContains(t, err, "Batch -1")
}

func TestACursorWithoutDirectGetsSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	s := stored{}
	publishMixed(t, b.js, s, 10)
	c, err := reader.NewCursor(b.js, reader.Config{}, []string{"events.>"}, 1, 10)
	require.NoError(t, err)
	_, err = c.Next(t.Context())
	require.ErrorIs(t, err, reader.ErrNoDirectGet)
}
