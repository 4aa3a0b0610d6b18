package audit

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
)

// TestStreamCheck is the comparison's rules as a table: the stored order
// of a stream's messages (their versions), the events under audit, and
// exactly what is reported.
func TestStreamCheck(t *testing.T) {
	t.Parallel()
	type want struct {
		version int64
		kind    Kind
		tail    bool
		seq     uint64
	}
	tests := []struct {
		name          string
		stored        []int64 // versions in stored order, at sequences 1, 2, ...
		from, through int64
		events        int64 // events 0..events-1 in Postgres
		want          []want
	}{
		{name: "clean", stored: []int64{0, 1, 2}, from: 0, through: 2, events: 3},
		{name: "past the watermark is not checked", stored: []int64{0, 1}, from: 0, through: 1, events: 3},
		{name: "missing tail", stored: []int64{0, 1}, from: 0, through: 3, events: 4,
			want: []want{{2, Missing, true, 0}, {3, Missing, true, 0}}},
		{name: "hole", stored: []int64{0, 2}, from: 0, through: 2, events: 3,
			want: []want{{1, Missing, false, 0}}},
		{name: "nothing stored", from: 0, through: 1, events: 2,
			want: []want{{0, Missing, true, 0}, {1, Missing, true, 0}}},
		{name: "a stored later version makes a hole, even past the watermark", stored: []int64{0, 3}, from: 0, through: 2, events: 4,
			want: []want{{1, Missing, false, 0}, {2, Missing, false, 0}}},
		{name: "duplicate names the extra copy", stored: []int64{0, 1, 1, 2}, from: 0, through: 2, events: 3,
			want: []want{{1, Duplicate, false, 3}}},
		{name: "out of order", stored: []int64{0, 2, 1}, from: 0, through: 2, events: 3,
			want: []want{{1, OutOfOrder, false, 3}}},
		{name: "copy of an earlier version after a later one is a duplicate only", stored: []int64{0, 1, 2, 0}, from: 0, through: 2, events: 3,
			want: []want{{0, Duplicate, false, 4}}},
		{name: "before --since is out of the audit", stored: []int64{1, 0, 0, 2}, from: 1, through: 2, events: 3},
		{name: "an unreadable version is skipped", stored: []int64{0, -1, 1}, from: 0, through: 1, events: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			evs := make([]event.Event, tt.events)
			var msgs []stored
			for v := range tt.events {
				evs[v] = event.Event{ID: v + 1, Stream: "s-1", Version: v, Name: "N", Data: []byte(`{}`)}
			}
			for i, v := range tt.stored {
				m := stored{seq: uint64(i + 1), version: v}
				if v >= 0 {
					w := forward.Message(evs[v], forward.Config{})
					m.id, m.sums = w.Header.Get("Nats-Msg-Id"), sumsOf(w.Subject, w.Header, w.Data)
				}
				msgs = append(msgs, m)
			}
			c := newStreamCheck("s-1", msgs, tt.from, tt.through, Retention{})
			for _, e := range evs[tt.from : tt.through+1] {
				c.event(e, forward.Message(e, forward.Config{}))
			}
			sortProblems(c.problems)
			var got []want
			for _, p := range c.problems {
				got = append(got, want{p.Version, p.Kind, p.Tail, p.Sequence})
				require.Equal(t, p.Version+1, p.EventID, "event id of %+v", p)
			}
			require.Equal(t, tt.want, got)
		})
	}
}

// TestStreamCheckContent: what the bridge derives from the event is
// compared, nothing else.
func TestStreamCheckContent(t *testing.T) {
	t.Parallel()
	e := event.Event{ID: 7, Stream: "s-1", Version: 0, Name: "N", Data: []byte(`{"a": 1}`), Meta: event.Meta{Correlation: "c"}}
	tests := []struct {
		name   string
		change func(w *stored, e event.Event)
		detail string
	}{
		{name: "same", change: func(*stored, event.Event) {}},
		{name: "a publisher's expectation header is not the event's", change: func(s *stored, e event.Event) {
			m := forward.Message(e, forward.Config{})
			m.Header.Set("Nats-Expected-Last-Subject-Sequence", "12")
			s.sums = sumsOf(m.Subject, m.Header, m.Data)
		}},
		{name: "data", detail: "data differs (Postgres 8 bytes, JetStream 8 bytes)", change: func(s *stored, e event.Event) {
			e.Data = []byte(`{"a": 2}`)
			m := forward.Message(e, forward.Config{})
			s.sums = sumsOf(m.Subject, m.Header, m.Data)
		}},
		{name: "a ce header", detail: "subject or headers (Nats-Msg-Id, Content-Type, ce-*) differ", change: func(s *stored, e event.Event) {
			e.Meta.Correlation = "other"
			m := forward.Message(e, forward.Config{})
			s.sums = sumsOf(m.Subject, m.Header, m.Data)
		}},
		{name: "a ce header the event does not have", detail: "subject or headers (Nats-Msg-Id, Content-Type, ce-*) differ", change: func(s *stored, e event.Event) {
			m := forward.Message(e, forward.Config{})
			m.Header.Set("ce-extra", "x")
			s.sums = sumsOf(m.Subject, m.Header, m.Data)
		}},
		{name: "the source", detail: "subject or headers (Nats-Msg-Id, Content-Type, ce-*) differ", change: func(s *stored, e event.Event) {
			m := forward.Message(e, forward.Config{Source: "elsewhere"})
			s.sums = sumsOf(m.Subject, m.Header, m.Data)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := forward.Message(e, forward.Config{})
			s := stored{seq: 1, version: 0, id: "7", sums: sumsOf(w.Subject, w.Header, w.Data)}
			tt.change(&s, e)
			c := newStreamCheck("s-1", []stored{s}, 0, 0, Retention{})
			c.event(e, forward.Message(e, forward.Config{}))
			if tt.detail == "" {
				require.Empty(t, c.problems)
				return
			}
			require.Len(t, c.problems, 1)
			require.Equal(t, ContentDiffers, c.problems[0].Kind)
			require.Equal(t, tt.detail, c.problems[0].Detail)
		})
	}
}
