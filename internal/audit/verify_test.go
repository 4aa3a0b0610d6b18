package audit_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/audit"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

type bundle struct {
	st  *store.Store
	dir string
	srv *embedded.Server
	js  jetstream.JetStream
}

func setup(t *testing.T) *bundle { return setupB(t) }

func setupB(t testing.TB) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := jsbridgetest.Pool(t)
	st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	b := &bundle{st: st, dir: t.TempDir()}
	b.srv = jsbridgetest.StartJetStream(t, embedded.Config{Dir: b.dir})
	_, b.js = jsbridgetest.Connect(t, b.srv)
	_, err = forward.Provision(ctx, b.js, forward.StreamConfig{})
	require.NoError(t, err)
	return b
}

// restart stops the JetStream server and starts it again on the same
// store, as after a crash: the duplicate window is rebuilt from the
// messages that survived.
func (b *bundle) restart(t *testing.T) {
	t.Helper()
	b.srv.Shutdown()
	b.srv = jsbridgetest.StartJetStream(t, embedded.Config{Dir: b.dir})
	_, b.js = jsbridgetest.Connect(t, b.srv)
}

// drainAll forwards every event with the real drain and forwarder.
func (b *bundle) drainAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	fwd, err := forward.New(b.js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	d, err := drain.New(b.st, fwd, drain.Config{Owner: "test", Lease: 10 * time.Second, ClaimLimit: 100, FetchLimit: 1000})
	require.NoError(t, err)
	for range 100 {
		appended, forwarded, err := b.st.Totals(ctx)
		require.NoError(t, err)
		if appended == forwarded {
			return
		}
		_, err = d.Cycle(ctx)
		require.NoError(t, err)
	}
	t.Fatal("the drain did not forward every event in 100 cycles")
}

func (b *bundle) streams(t *testing.T) []audit.Stream { return b.streamsB(t) }

func (b *bundle) streamsB(t testing.TB) []audit.Stream {
	t.Helper()
	infos, err := b.st.Streams(context.Background(), store.StreamFilter{})
	require.NoError(t, err)
	var out []audit.Stream
	for _, i := range infos {
		out = append(out, audit.Stream{Name: i.Stream, Watermark: i.Watermark})
	}
	return out
}

// seqs maps stream/version to the JetStream sequences holding it, read by
// direct gets of every sequence.
func (b *bundle) seqs(t *testing.T) map[string][]uint64 {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	out := map[string][]uint64{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		k := m.Header.Get(wire.HeaderSubject) + "/" + m.Header.Get(wire.HeaderStreamVersion)
		out[k] = append(out[k], seq)
	}
	return out
}

type finding struct {
	Stream  string
	Version int64
	Kind    audit.Kind
	Tail    bool
}

func findings(r audit.Report) []finding {
	var out []finding
	for _, p := range r.Problems {
		out = append(out, finding{p.Stream, p.Version, p.Kind, p.Tail})
	}
	return out
}

func (b *bundle) append(t *testing.T, stream string, n int) []event.Event {
	t.Helper()
	var evs []store.NewEvent
	for i := range n {
		evs = append(evs, store.NewEvent{Name: "Happened", Data: fmt.Appendf(nil, `{"n": %d,  "s": "x"}`, i),
			Meta: event.Meta{Correlation: "c-" + stream}})
	}
	out, err := b.st.Append(context.Background(), stream, -2, evs...)
	require.NoError(t, err)
	return out
}

// TestVerifyFindsExactlyWhatWasLostAndRepairRestoresTheTail drains six
// streams with the real bridge, then loses and alters messages as a crash
// or a bad hand would, and checks that verify reports exactly those, that
// repair re-publishes the missing tails in order and nothing else, and
// that a second verify finds only what repair must leave.
func TestVerifyFindsExactlyWhatWasLostAndRepairRestoresTheTail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	evs := map[string][]event.Event{}
	for _, s := range []string{"hole-1", "tail-1", "purged-1", "altered-1", "copied-1", "clean-1"} {
		evs[s] = b.append(t, s, 5)
	}
	b.drainAll(t)
	// Appended after the drain: past the watermark, so not reported
	// though JetStream does not have it.
	b.append(t, "hole-1", 1)

	s, err := b.js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	seqs := b.seqs(t)
	require.NoError(t, s.DeleteMsg(ctx, seqs["hole-1/2"][0]))
	require.NoError(t, s.DeleteMsg(ctx, seqs["tail-1/3"][0]))
	require.NoError(t, s.DeleteMsg(ctx, seqs["tail-1/4"][0]))
	require.NoError(t, s.DeleteMsg(ctx, seqs["copied-1/1"][0]))
	require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSubject(wire.StreamFilter(wire.DefaultEventsPrefix, "purged-1"))))
	// Data changed in Postgres after it was published.
	_, err = jsbridgetest.Pool(t).Exec(ctx, fmt.Sprintf(`UPDATE %s SET data = '{"n": 1, "s": "changed"}' WHERE stream = 'altered-1' AND version = 1`, b.st.EventsTable()))
	require.NoError(t, err)

	b.restart(t)
	// copied-1: version 1 stored again after version 4 (out of order),
	// version 0 stored a second time (without Nats-Msg-Id, so the
	// duplicate window lets it in).
	_, err = b.js.PublishMsg(ctx, forward.Message(evs["copied-1"][1], forward.Config{}))
	require.NoError(t, err)
	dup := forward.Message(evs["copied-1"][0], forward.Config{})
	dup.Header.Del(wire.HeaderMsgID)
	_, err = b.js.PublishMsg(ctx, dup)
	require.NoError(t, err)

	src := b.st
	rep, err := audit.Verify(ctx, b.js, src, b.streams(t), true, audit.Config{})
	require.NoError(t, err)
	want := []finding{
		{"altered-1", 1, audit.ContentDiffers, false},
		{"copied-1", 0, audit.Duplicate, false},
		{"copied-1", 1, audit.OutOfOrder, false},
		{"hole-1", 2, audit.Missing, false},
		{"purged-1", 0, audit.Missing, true},
		{"purged-1", 1, audit.Missing, true},
		{"purged-1", 2, audit.Missing, true},
		{"purged-1", 3, audit.Missing, true},
		{"purged-1", 4, audit.Missing, true},
		{"tail-1", 3, audit.Missing, true},
		{"tail-1", 4, audit.Missing, true},
	}
	require.Equal(t, want, findings(rep))
	require.EqualValues(t, 30, rep.Events)
	require.Equal(t, 11, rep.Unresolved())

	fwd, err := forward.New(b.js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	require.NoError(t, audit.Repair(ctx, fwd, &rep))
	var repaired []finding
	for _, p := range rep.Problems {
		if p.Repaired {
			repaired = append(repaired, finding{p.Stream, p.Version, p.Kind, p.Tail})
		}
	}
	require.Equal(t, want[4:], repaired, "repair restores the missing tails, nothing else")
	require.Equal(t, 4, rep.Unresolved())

	// Restored in order, after everything else of their streams.
	seqs = b.seqs(t)
	for _, st := range []string{"purged-1", "tail-1"} {
		var got []uint64
		for v := range 5 {
			require.Len(t, seqs[fmt.Sprintf("%s/%d", st, v)], 1, "%s version %d stored once", st, v)
			got = append(got, seqs[fmt.Sprintf("%s/%d", st, v)][0])
		}
		require.True(t, sort.SliceIsSorted(got, func(i, j int) bool { return got[i] < got[j] }), "%s stored in version order: %v", st, got)
	}

	again, err := audit.Verify(ctx, b.js, src, b.streams(t), false, audit.Config{})
	require.NoError(t, err)
	require.Equal(t, want[:4], findings(again), "left: the hole, the altered event and the copies")
}

// TestVerifyOneStreamSince checks the filters: one stream's subjects only,
// and only events created since a time.
func TestVerifyOneStreamSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.append(t, "one-1", 3)
	b.append(t, "other-1", 3)
	b.drainAll(t)
	seqs := b.seqs(t)
	s, err := b.js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	require.NoError(t, s.DeleteMsg(ctx, seqs["one-1/0"][0]))
	require.NoError(t, s.DeleteMsg(ctx, seqs["other-1/0"][0]))

	var one []audit.Stream
	for _, st := range b.streams(t) {
		if st.Name == "one-1" {
			one = append(one, st)
		}
	}
	rep, err := audit.Verify(ctx, b.js, b.st, one, false, audit.Config{})
	require.NoError(t, err)
	require.Equal(t, []finding{{"one-1", 0, audit.Missing, false}}, findings(rep))
	require.EqualValues(t, 3, rep.Events)
	require.EqualValues(t, 2, rep.Messages, "only the stream's subjects are read")

	rep, err = audit.Verify(ctx, b.js, b.st, one, false, audit.Config{Since: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	require.EqualValues(t, 0, rep.Events)
}

// TestRepairLeavesWhatTheDuplicateWindowDrops: a message deleted while
// JetStream still remembers its id (no crash) cannot be stored again
// inside the duplicate window; repair says so and leaves it reported.
func TestRepairLeavesWhatTheDuplicateWindowDrops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.append(t, "win-1", 2)
	b.drainAll(t)
	s, err := b.js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	require.NoError(t, s.DeleteMsg(ctx, b.seqs(t)["win-1/1"][0]))

	rep, err := audit.Verify(ctx, b.js, b.st, b.streams(t), false, audit.Config{})
	require.NoError(t, err)
	require.Equal(t, []finding{{"win-1", 1, audit.Missing, true}}, findings(rep))
	fwd, err := forward.New(b.js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	require.NoError(t, audit.Repair(ctx, fwd, &rep))
	require.False(t, rep.Problems[0].Repaired)
	require.Contains(t, rep.Problems[0].Detail, "duplicate window")
	require.Equal(t, 1, rep.Unresolved())
}

// TestRepairSkipsWhatAnotherPublisherStoredMeanwhile: when another
// publisher stores the missing event between verify and repair, the
// repair's reconciliation (the forwarder's lookup of the stream's last
// message) finds it and does not store it twice.
func TestRepairSkipsWhatAnotherPublisherStoredMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	evs := b.append(t, "race-1", 3)
	b.drainAll(t)
	s, err := b.js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	require.NoError(t, s.DeleteMsg(ctx, b.seqs(t)["race-1/2"][0]))
	b.restart(t)
	rep, err := audit.Verify(ctx, b.js, b.st, b.streams(t), false, audit.Config{})
	require.NoError(t, err)
	require.Equal(t, []finding{{"race-1", 2, audit.Missing, true}}, findings(rep))

	// Another bridge stores version 2 meanwhile (say after a reset).
	_, err = b.js.PublishMsg(ctx, forward.Message(evs[2], forward.Config{}))
	require.NoError(t, err)
	fwd, err := forward.New(b.js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	require.NoError(t, audit.Repair(ctx, fwd, &rep))
	require.False(t, rep.Problems[0].Repaired)
	require.Contains(t, rep.Problems[0].Detail, "later version")
	require.Len(t, b.seqs(t)["race-1/2"], 1, "stored once, by the other publisher")
}
