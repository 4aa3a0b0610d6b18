package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/wire"
)

// statusOut runs `consumer status <args>` as the binary does, against
// k's server, and returns what it printed.
func (k *runtimeKit) statusOut(t *testing.T, args ...string) string {
	t.Helper()
	var cl cli
	parser, err := kong.New(&cl, kong.Name("consumer"), ops.WireVars(), kong.Exit(func(int) { t.Fatal("kong exit") }))
	require.NoError(t, err)
	kctx, err := parser.Parse(append([]string{"status", "--nats-url", k.srv.ClientURL()}, args...))
	require.NoError(t, err)
	var out strings.Builder
	cl.Status.out = &out
	kctx.BindTo(k.ctx, (*context.Context)(nil))
	require.NoError(t, kctx.Run(&cl.Globals))
	return out.String()
}

// consumer status lists the stuck streams, as the park bucket holds them:
// an order-stuck stream (its park entry) and a stream set aside (its
// aside record; one set aside because it is parked is listed once, as
// parked), each with its partition, stream key, head (event id and
// version), since when and the receiver's last answer, and the command
// out; --json carries the same fields.
func TestStatusListsStuckStreams(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	kv, err := k.js.CreateKeyValue(k.ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	put := func(key string, v any) {
		t.Helper()
		b, err := json.Marshal(v)
		require.NoError(t, err)
		_, err = kv.Put(k.ctx, key, b)
		require.NoError(t, err)
	}
	parkedAt := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	parkedSubject := "events.order.order-7.OrderNoted"
	put(wire.ParkedKey("orders", wire.StreamKey(parkedSubject)), consumer.ParkedStream{
		Subscription: "orders", Stream: "order-7", Subject: parkedSubject, HeadEventID: "ev-7-3", HeadVersion: "3",
		Partition: 2, ParkedAt: parkedAt, OrderStuck: true,
		Reason: "order-stuck: the receiver's order gate refused the event (gap) for 5m0s, longer than --order-stuck-after 5m0s",
	})
	// The aside record as internal/deliver writes it (asideRecord).
	asideSubject := "ordered.events.1.order.order-9.OrderNoted"
	asideAt := time.Date(2026, 11, 28, 9, 30, 0, 0, time.UTC)
	put(wire.AsideKey("orders", 1, wire.StreamKey(asideSubject)), map[string]any{
		"subscription": "orders", "partition": 1, "subject": asideSubject, "start": 40, "head": 38, "from": 40,
		"set_aside_at": asideAt, "head_event_id": "ev-9-0", "head_version": "0", "answer": "HTTP 503 Service Unavailable",
	})
	put(wire.AsideKey("orders", 2, "ordered.events.2.order.order-7"), map[string]any{
		"subscription": "orders", "partition": 2, "subject": "ordered.events.2.order.order-7.OrderNoted", "start": 12, "from": 12,
		"set_aside_at": asideAt, "parked": true,
	})

	out := k.statusOut(t)
	require.Regexp(t, `(?m)^STUCK STREAM\s+SUBSCRIPTION\s+PARTITION\s+STATE\s+HEAD\s+SINCE\s+LAST ANSWER$`, out)
	require.Regexp(t, `(?m)^events\.order\.order-7\s+orders\s+2\s+order-stuck\s+ev-7-3 \(v3\)\s+2026-11-28T09:00:00Z\s+order-stuck: the receiver's order gate refused`, out)
	require.Regexp(t, `(?m)^ordered\.events\.1\.order\.order-9\s+orders\s+1\s+set-aside\s+ev-9-0 \(v0\)\s+2026-11-28T09:30:00Z\s+HTTP 503 Service Unavailable$`, out)
	require.NotContains(t, out, "ordered.events.2.order.order-7", "the parked stream set aside is listed once, as parked:\n%s", out)
	require.Contains(t, out, "events.order.order-7 (order-stuck): consumer dlq list -s orders names the head's seq N (event ev-7-3); then consumer dlq replay --seq N")
	require.Contains(t, out, "consumer dlq skip --seq N")
	require.Contains(t, out, "ordered.events.1.order.order-9 (set-aside): none needed while the head is retried")

	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(k.statusOut(t, "--json")), &st))
	require.Len(t, st.Stuck, 2)
	require.Equal(t, consumer.StuckStream{
		Subscription: "orders", Partition: 1, State: consumer.StateSetAside, StreamKey: "ordered.events.1.order.order-9",
		HeadEventID: "ev-9-0", HeadVersion: "0", Since: asideAt, LastAnswer: "HTTP 503 Service Unavailable", Next: st.Stuck[0].Next,
	}, st.Stuck[0])
	require.Equal(t, consumer.StateOrderStuck, st.Stuck[1].State)
	require.Equal(t, "order-7", st.Stuck[1].Stream)
	require.Equal(t, "3", st.Stuck[1].HeadVersion)
	require.Equal(t, parkedAt, st.Stuck[1].Since)
	require.Contains(t, st.Stuck[1].Next, "consumer dlq replay --seq N")
}

// consumer status shows nothing of the shared engine without its
// positions bucket; with records (consumer.ReadSharedPositions reads them,
// tested in package consumer) it prints a line a partition and each
// cursor, and --json carries them whole under shared_positions.
func TestStatusShowsSharedPositions(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	require.NotContains(t, k.statusOut(t), "SHARED PARTITION", "no positions bucket")
	var noBucket map[string]any
	require.NoError(t, json.Unmarshal([]byte(k.statusOut(t, "--json")), &noBucket))
	require.NotContains(t, noBucket, "shared_positions")

	const stored = `[{"partition": 5, "revision": 9, "updated": "2026-11-29T04:00:00Z",
	  "record": {"owner": "replica-a", "epoch": 4, "floor": 40,
	    "streams": {"user-7": {"seq": 41, "version": 2}},
	    "ahead": {"orders": {"order-42": {"seq": 44, "version": 3}}},
	    "members": {"orders": 0},
	    "asides": [{"subscription": "orders", "stream": "order-9", "from": 42, "state": "parked"}]},
	  "cursors": {"audit": {"state": "breaker", "floor": 40}}},
	 {"partition": 7, "revision": 0, "updated": "0001-01-01T00:00:00Z", "record": {"floor": 0},
	  "cursors": {"audit": {"state": "paused", "floor": 12}}}]`
	var shared []consumer.SharedPosition
	require.NoError(t, json.Unmarshal([]byte(stored), &shared))
	var out strings.Builder
	require.NoError(t, printShared(&out, shared))
	require.Regexp(t, `(?m)^5\s+replica-a\s+4\s+40\s+2\s+1\s+1\s+0\s+1\s+2026-11-29T04:00:00Z$`, out.String())
	require.Regexp(t, `(?m)^7\s+-\s+0\s+0\s+0\s+0\s+0\s+0\s+1\s+-$`, out.String())
	require.Contains(t, out.String(), "partition 5: audit has a cursor (breaker) from sequence 41")
	require.Contains(t, out.String(), "partition 7: audit has a cursor (paused) from sequence 13")

	raw, err := json.Marshal(statusJSON{Shared: shared})
	require.NoError(t, err)
	var round struct {
		Shared []consumer.SharedPosition `json:"shared_positions"`
	}
	require.NoError(t, json.Unmarshal(raw, &round))
	require.Equal(t, shared, round.Shared)
}
