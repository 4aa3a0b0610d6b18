package forward_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

type bundle struct {
	srv *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	fwd *forward.Forwarder
}

type setupOpts struct {
	maxPayload int32                 // server max payload; 0 = default
	stream     *forward.StreamConfig // provisioned when non-nil
	cfg        forward.Config
}

// setup starts an embedded JetStream server, connects, provisions the
// default EVENTS stream (unless opts say otherwise) and builds a Forwarder.
func setup(t testing.TB, opts ...setupOpts) bundle {
	t.Helper()
	o := setupOpts{stream: &forward.StreamConfig{}}
	if len(opts) > 0 {
		o = opts[0]
	}
	srv := jsbridgetest.StartJetStream(t, embedded.Config{MaxPayload: o.maxPayload})
	nc, js := jsbridgetest.Connect(t, srv)
	if o.stream != nil {
		_, err := forward.Provision(t.Context(), js, *o.stream)
		require.NoError(t, err)
	}
	fwd, err := forward.New(js, o.cfg)
	require.NoError(t, err)
	return bundle{srv: srv, nc: nc, js: js, fwd: fwd}
}

// stored returns the messages of the EVENTS stream whose subject starts
// with subjPrefix, in stream order.
func (b bundle) stored(t *testing.T, subjPrefix string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := b.js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		require.NoError(t, err)
		if strings.HasPrefix(m.Subject, subjPrefix) {
			out = append(out, m)
		}
	}
	return out
}

// ids returns the ce-id headers of msgs.
func ids(msgs []*jetstream.RawStreamMsg) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Header.Get(wire.HeaderID)
	}
	return out
}

// events returns n events of stream with ids from firstID on and versions
// from 0 on.
func events(stream string, firstID int64, n int) []event.Event {
	out := make([]event.Event, n)
	for i := range out {
		out[i] = event.Event{
			ID:      firstID + int64(i),
			Stream:  stream,
			Version: int64(i),
			Name:    "Happened",
			Data:    []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		}
	}
	return out
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		cfg   forward.Config
		field string
	}{
		{forward.Config{Prefix: "a..b"}, "Config.Prefix"},
		{forward.Config{Prefix: "events.>"}, "Config.Prefix"},
		{forward.Config{Prefix: "my events"}, "Config.Prefix"},
		{forward.Config{MaxInFlight: -1}, "Config.MaxInFlight -1"},
		{forward.Config{PublishTimeout: -time.Second}, "Config.PublishTimeout -1s"},
	} {
		_, err := forward.New(b.js, tc.cfg)
		require.ErrorIs(t, err, forward.ErrInvalidConfig)
		require.ErrorContains(t, err, tc.field)
	}
	_, err := forward.New(nil, forward.Config{})
	require.ErrorIs(t, err, forward.ErrInvalidConfig)
}

func TestPublishDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := events("order-1", 10, 1)[0]

	first := b.fwd.Publish(t.Context(), []event.Event{e})
	require.Equal(t, forward.Stored, first[0].Status)
	require.NoError(t, first[0].Err)

	again := b.fwd.Publish(t.Context(), []event.Event{e})
	require.Equal(t, forward.Duplicate, again[0].Status)
	require.NoError(t, again[0].Err)
	require.Equal(t, first[0].Sequence, again[0].Sequence)

	require.Equal(t, []string{"10"}, ids(b.stored(t, "events.")))
}

func TestPublishEscapedSubjects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	names := []struct{ stream, name string }{
		{"a.b-1", "x.y"},
		{"*-2", "*"},
		{">-3", ">"},
		{"my stream-4", "Item Added"},
		{"bestellung-ä", "Bestätigt"},
		{"", ""},
		{"line\r\nbreak-7", "Evt\n"},
	}
	var evs []event.Event
	for i, n := range names {
		evs = append(evs, event.Event{ID: int64(i + 1), Stream: n.stream, Name: n.name, Data: []byte(`{}`)})
	}
	for i, o := range b.fwd.Publish(t.Context(), evs) {
		require.Equal(t, forward.Stored, o.Status, "event %d: %v", i, o.Err)
	}
	msgs := b.stored(t, "events.")
	require.Len(t, msgs, len(names))
	// Streams are published concurrently: match messages by event id.
	for _, m := range msgs {
		id, err := strconv.Atoi(m.Header.Get(wire.HeaderID))
		require.NoError(t, err)
		want := names[id-1]
		stream, name, err := wire.ParseSubject("events", m.Subject)
		require.NoError(t, err)
		require.Equal(t, want.stream, stream)
		require.Equal(t, want.name, name)
		// Header values are percent-encoded (CloudEvents HTTP binding), and
		// decode back to the names.
		require.Equal(t, wire.EncodeHeaderValue(want.stream), m.Header.Get(wire.HeaderSubject))
		gotStream, err := wire.DecodeHeaderValue(m.Header.Get(wire.HeaderSubject))
		require.NoError(t, err)
		require.Equal(t, want.stream, gotStream)
		gotName, err := wire.DecodeHeaderValue(m.Header.Get(wire.HeaderType))
		require.NoError(t, err)
		require.Equal(t, want.name, gotName)
	}

	// A consumer filtering by one weird stream sees exactly its event.
	cons, err := b.js.OrderedConsumer(t.Context(), wire.DefaultEventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.StreamFilter("events", "a.b-1")},
	})
	require.NoError(t, err)
	batch, err := cons.FetchNoWait(10)
	require.NoError(t, err)
	var got []string
	for m := range batch.Messages() {
		got = append(got, m.Headers().Get(wire.HeaderID))
	}
	require.NoError(t, batch.Error())
	require.Equal(t, []string{"1"}, got)
}

func TestMessageHeadersAndBody(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{}, cfg: forward.Config{Source: "urn:shop"}})
	data := []byte("{\"b\": 1,\n  \"a\" : [1, 2.50], \"s\":\"\\u00e4\"}")
	created := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("CET", 3600))
	e := event.Event{
		ID: 77, Stream: "order-42", Version: 5, Name: "OrderPlaced", Data: data,
		Meta:    event.Meta{Correlation: "corr-1", Causation: "cause-9"},
		Created: created,
	}
	out := b.fwd.Publish(t.Context(), []event.Event{e})
	require.Equal(t, forward.Stored, out[0].Status, "%v", out[0].Err)

	msgs := b.stored(t, "events.")
	require.Len(t, msgs, 1)
	m := msgs[0]
	require.Equal(t, "events.order.order-42.OrderPlaced", m.Subject)
	require.Equal(t, data, m.Data)
	want := map[string]string{
		"Nats-Msg-Id":            "77",
		wire.HeaderSpecVersion:   "1.0",
		wire.HeaderID:            "77",
		wire.HeaderType:          "OrderPlaced",
		wire.HeaderSource:        "urn:shop",
		wire.HeaderSubject:       "order-42",
		wire.HeaderTime:          "2026-03-04T04:06:07.123456789Z",
		wire.HeaderContentType:   "application/json",
		wire.HeaderStreamVersion: "5",
		wire.HeaderCorrelationID: "corr-1",
		wire.HeaderCausationID:   "cause-9",
	}
	for k, v := range want {
		require.Equal(t, []string{v}, m.Header.Values(k), "header %s", k)
	}
}

func TestMessageOmitsEmptyMetaAndDefaults(t *testing.T) {
	t.Parallel()
	m := forward.Message(event.Event{ID: 1, Stream: "s", Name: "N", Data: []byte(`1`)}, forward.Config{})
	require.Equal(t, "events.s.s.N", m.Subject)
	require.Equal(t, "jsbridge", m.Header.Get(wire.HeaderSource))
	require.NotContains(t, m.Header, wire.HeaderCorrelationID)
	require.NotContains(t, m.Header, wire.HeaderCausationID)
	// Header values do not share storage: adding to one leaves the next alone.
	m.Header.Add(wire.HeaderMsgID, "x")
	require.Equal(t, []string{"1.0"}, m.Header.Values(wire.HeaderSpecVersion))
}

func BenchmarkMessage(b *testing.B) {
	e := event.Event{
		ID: 123456, Stream: "order-42", Version: 7, Name: "OrderPlaced",
		Data:    []byte(`{"order":"42","total":1999}`),
		Meta:    event.Meta{Correlation: "c0ffee", Causation: "123455"},
		Created: time.Now(),
	}
	cfg := forward.Config{}
	b.ReportAllocs()
	for b.Loop() {
		_ = forward.Message(e, cfg)
	}
}

func TestHandleOrderUnderFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxPayload: 4096, stream: &forward.StreamConfig{}})
	a := events("order-1", 100, 5)
	a[2].Data = []byte(`{"big":"` + strings.Repeat("x", 5000) + `"}`)
	other := events("cart-9", 200, 3)

	res := b.fwd.Handle(t.Context(), []drain.Batch{
		{Stream: "order-1", Events: a},
		{Stream: "cart-9", Events: other},
	})
	require.Len(t, res, 2)

	require.Equal(t, 2, res[0].Done)
	require.Error(t, res[0].Err)
	require.True(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
	require.ErrorIs(t, res[0].Err, forward.ErrTooLarge)
	require.ErrorIs(t, res[0].Err, nats.ErrMaxPayload)
	require.ErrorContains(t, res[0].Err, "event 102")
	require.ErrorContains(t, res[0].Err, `"order-1"`)

	require.Equal(t, drain.Result{Done: 3}, res[1])

	require.Equal(t, []string{"100", "101"}, ids(b.stored(t, "events.order.")))
	require.Equal(t, []string{"200", "201", "202"}, ids(b.stored(t, "events.cart.")))
}

func TestHandleStreamMaxMsgSize(t *testing.T) {
	t.Parallel()
	// The server accepts 1 MiB, but the JetStream stream only 1 KiB: the
	// rejection comes back as a JetStream API error.
	b := setup(t, setupOpts{stream: &forward.StreamConfig{MaxMsgSize: 1024}})
	a := events("order-1", 1, 3)
	a[1].Data = []byte(`"` + strings.Repeat("y", 2000) + `"`)

	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: a}})
	require.Equal(t, 1, res[0].Done)
	require.True(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
	require.ErrorIs(t, res[0].Err, forward.ErrTooLarge)
	require.ErrorIs(t, res[0].Err, jetstream.ErrStreamMessageExceedsMaximum)
	require.ErrorContains(t, res[0].Err, "event 2")
	require.Equal(t, []string{"1"}, ids(b.stored(t, "events.")))
}

func TestHandleInvalidJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := events("order-1", 1, 3)
	a[1].Data = []byte(`{"unterminated":`)

	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: a}})
	require.Equal(t, 1, res[0].Done)
	require.True(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
	require.ErrorIs(t, res[0].Err, forward.ErrInvalidData)
	require.ErrorContains(t, res[0].Err, "event 2")
	require.Equal(t, []string{"1"}, ids(b.stored(t, "events.")))
}

// An event the store could not read (Err set) is refused, never sent,
// even in a run that could go as one fast batch.
func TestHandleRefusesUnreadableEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := events("order-1", 1, 4)
	unreadable := &event.ColumnError{Table: "app.events", Column: "meta", Err: errors.New("not valid JSON")}
	a[2].Err = unreadable

	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: a}})
	require.Equal(t, 2, res[0].Done)
	require.True(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
	require.ErrorIs(t, res[0].Err, unreadable)
	require.ErrorContains(t, res[0].Err, "event 3")
	require.ErrorContains(t, res[0].Err, "column meta of app.events")
	require.Equal(t, []string{"1", "2"}, ids(b.stored(t, "events.")))
}

func TestHandleWrongStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := events("order-1", 1, 2)
	a[1].Stream = "order-2"
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: a}})
	require.Equal(t, 1, res[0].Done)
	require.True(t, drain.IsNonRetryable(res[0].Err))
	require.ErrorIs(t, res[0].Err, forward.ErrWrongStream)
}

func TestHandleMissingJetStreamStreamIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: events("order-1", 1, 2)}})
	require.Equal(t, 0, res[0].Done)
	require.Error(t, res[0].Err)
	require.False(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
	require.True(t, drain.IsUnavailable(res[0].Err), "a missing JetStream stream is not the event stream's fault: %v", res[0].Err)
	require.ErrorIs(t, res[0].Err, jetstream.ErrStreamNotFound)
	require.ErrorContains(t, res[0].Err, `"order-1"`)
}

func TestHandleServerStoppedIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{}, cfg: forward.Config{PublishTimeout: 300 * time.Millisecond}})
	// Known position (no lookup needed) and unknown position (lookup first):
	// both fail as an outage.
	require.Equal(t, drain.Result{Done: 1}, b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: events("order-1", 1, 1)}})[0])
	b.srv.Shutdown()
	next := events("order-1", 1, 2)[1:]
	for _, bt := range []drain.Batch{{Stream: "order-1", Events: next}, {Stream: "cart-1", Events: events("cart-1", 5, 2)}} {
		res := b.fwd.Handle(t.Context(), []drain.Batch{bt})
		require.Equal(t, 0, res[0].Done)
		require.Error(t, res[0].Err)
		require.False(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
		require.True(t, drain.IsUnavailable(res[0].Err), "%v", res[0].Err)
		require.Contains(t, []string{forward.ClassTimeout, forward.ClassConnection, forward.ClassNoResponders}, forward.ErrorClass(res[0].Err))
	}
}

func TestPublishSkipsAfterFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := events("order-1", 1, 3)
	a[0].Data = []byte(`nope`)
	c := events("cart-1", 10, 2)
	// Interleaved streams: outcomes come back in input order.
	in := []event.Event{a[0], c[0], a[1], c[1], a[2]}
	out := b.fwd.Publish(t.Context(), in)
	require.Len(t, out, 5)

	require.Equal(t, forward.Failed, out[0].Status)
	require.False(t, out[0].Retryable)
	require.ErrorIs(t, out[0].Err, forward.ErrInvalidData)
	for _, i := range []int{2, 4} {
		require.Equal(t, forward.Failed, out[i].Status)
		require.True(t, out[i].Retryable)
		require.ErrorIs(t, out[i].Err, forward.ErrNotAttempted)
	}
	require.Equal(t, forward.Stored, out[1].Status)
	require.Equal(t, forward.Stored, out[3].Status)
	require.Less(t, out[1].Sequence, out[3].Sequence)
	require.Equal(t, []string{"10", "11"}, ids(b.stored(t, "events.")))
}

func TestHandleManyStreamsKeepsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{}, cfg: forward.Config{MaxInFlight: 4}})
	const streams, perStream = 20, 10
	batches := make([]drain.Batch, streams)
	for s := range batches {
		name := "acct-" + strconv.Itoa(s)
		batches[s] = drain.Batch{Stream: name, Events: events(name, int64(s*perStream+1), perStream)}
	}
	res := b.fwd.Handle(t.Context(), batches)
	for s, r := range res {
		require.Equal(t, drain.Result{Done: perStream}, r, "batch %d", s)
	}
	got := make(map[string][]string)
	for _, m := range b.stored(t, "events.") {
		stream := m.Header.Get(wire.HeaderSubject)
		got[stream] = append(got[stream], m.Header.Get(wire.HeaderID))
	}
	for _, bt := range batches {
		var want []string
		for _, e := range bt.Events {
			want = append(want, event.FormatID(e.ID))
		}
		require.Equal(t, want, got[bt.Stream], "stream %s", bt.Stream)
	}
}

func TestHandleSameStreamTwiceStopsAfterFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := events("order-1", 1, 2)
	first[1].Data = []byte(`{`)
	second := events("order-1", 3, 1)
	res := b.fwd.Handle(t.Context(), []drain.Batch{
		{Stream: "order-1", Events: first},
		{Stream: "order-1", Events: second},
	})
	require.Equal(t, 1, res[0].Done)
	require.Equal(t, 0, res[1].Done)
	require.ErrorIs(t, res[1].Err, forward.ErrNotAttempted)
	require.False(t, drain.IsNonRetryable(res[1].Err))
	require.Equal(t, []string{"1"}, ids(b.stored(t, "events.")))
}

func TestHandleCancelledContextIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	res := b.fwd.Handle(ctx, []drain.Batch{{Stream: "order-1", Events: events("order-1", 1, 2)}})
	require.Equal(t, 0, res[0].Done)
	require.True(t, errors.Is(res[0].Err, context.Canceled), "%v", res[0].Err)
	require.False(t, drain.IsNonRetryable(res[0].Err))
	require.True(t, drain.IsUnavailable(res[0].Err), "cut short, not the stream's fault: %v", res[0].Err)
	require.Equal(t, forward.ClassCanceled, forward.ErrorClass(res[0].Err))
}
