package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// `consumer trace` of an event whose endpoint failed twice and then took
// it shows three attempts, in order, in text and in JSON.
func TestTraceCommandShowsEveryAttempt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)

	var n atomic.Int32
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) <= 2 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)

	// What consumer run does: the attempts record, then the deliveries.
	c, err := consumer.New(js, consumer.Config{Attempts: &consumer.AttemptsConfig{Replica: "consumer-0"}, Subscriptions: []consumer.Subscription{{
		Name: "billing", FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: rc.URL,
		Secrets:      []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("trace-command-test-secret-01"))},
		BackOff:      []time.Duration{10 * time.Millisecond},
		AllowPrivate: true,
		Start:        consumer.Start{Policy: consumer.StartAll},
	}}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, "order-7", "OrderPlaced"),
		Header: nats.Header{wire.HeaderMsgID: []string{"42"}, wire.HeaderType: []string{"OrderPlaced"}, wire.HeaderSubject: []string{"order-7"}},
		Data:   []byte(`{}`)})
	require.NoError(t, err)

	run := func(args ...string) string {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse(append([]string{"trace", "--nats-url", srv.ClientURL()}, args...))
		require.NoError(t, err)
		var out bytes.Buffer
		cl.Trace.out = &out
		require.NoError(t, cl.Trace.Run(ctx, &cl.Globals))
		return out.String()
	}
	attemptRow := regexp.MustCompile(`(?m)^(\d+)\s+\S+\s+consumer-0\s+(\d+)\s+\S+\s+(retry|ack)\s+closed`)
	var text string
	require.Eventually(t, func() bool {
		text = run("42")
		return len(attemptRow.FindAllString(text, -1)) == 3
	}, 60*time.Second, 50*time.Millisecond, "three attempts in the output")
	rows := attemptRow.FindAllStringSubmatch(text, -1)
	require.Equal(t, []string{"1", "502", "retry"}, rows[0][1:])
	require.Equal(t, []string{"2", "502", "retry"}, rows[1][1:])
	require.Equal(t, []string{"3", "200", "ack"}, rows[2][1:])
	require.Contains(t, text, "event 42: order-7 v0 OrderPlaced, JetStream sequence 1")
	require.Contains(t, text, "subscription billing")
	require.Contains(t, text, "HTTP 502 Bad Gateway")

	var tr consumer.EventTrace
	require.NoError(t, json.Unmarshal([]byte(run("42", "--json")), &tr))
	require.Len(t, tr.Attempts, 3)
	require.Equal(t, []int{502, 502, 200}, []int{tr.Attempts[0].Status, tr.Attempts[1].Status, tr.Attempts[2].Status})

	none := run("43")
	require.True(t, strings.Contains(none, "event 43: not found") && strings.Contains(none, "no attempt records"), none)
	require.Contains(t, none, "next: `bridge streams --blocked` shows whether the bridge holds it back", "not found points to the bridge side")
	require.Contains(t, none, "`bridge verify` tells an event the events stream lost")
}

// `consumer trace` of a dead-lettered event names the commands out of it,
// with the dead letter's sequence.
func TestTraceCommandPointsFromADeadLetterToReplayAndSkip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity) // permanent: dead-lettered at once
	}))
	t.Cleanup(rc.Close)
	c, err := consumer.New(js, consumer.Config{Subscriptions: []consumer.Subscription{{
		Name: "billing", FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: rc.URL,
		Secrets:      []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("trace-command-test-secret-02"))},
		AllowPrivate: true,
		Start:        consumer.Start{Policy: consumer.StartAll},
	}}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, "order-9", "OrderPlaced"),
		Header: nats.Header{wire.HeaderMsgID: []string{"44"}, wire.HeaderType: []string{"OrderPlaced"}, wire.HeaderSubject: []string{"order-9"}},
		Data:   []byte(`{}`)})
	require.NoError(t, err)

	var text string
	require.Eventually(t, func() bool {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse([]string{"trace", "--nats-url", srv.ClientURL(), "44"})
		require.NoError(t, err)
		var out bytes.Buffer
		cl.Trace.out = &out
		require.NoError(t, cl.Trace.Run(ctx, &cl.Globals))
		text = out.String()
		return strings.Contains(text, "dead letter 1 (subscription billing)")
	}, 60*time.Second, 50*time.Millisecond, "the dead letter in trace's output")
	require.Contains(t, text, "next: once the endpoint takes it, `consumer dlq replay --seq 1` with the subscription's flags")
	require.Contains(t, text, "`consumer dlq skip --seq 1`")
	require.NotContains(t, text, "bridge streams --blocked", "the consumer had it: nothing to look for on the bridge side")
	t.Logf("consumer trace 44:\n%s", text)
}

// `consumer trace` of an event answered 2xx at once, which the default
// --attempts-record failures does not record, does not read as never
// delivered: without --source-stream it says why there is no record and
// how to look; with it, it reads from the positions bucket that the
// event was settled, by a 2xx on its first attempt.
func TestTraceCommandOnAFirstAttemptSuccess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	var posts atomic.Int32
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		posts.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	c, err := consumer.New(js, consumer.Config{Attempts: &consumer.AttemptsConfig{}, Subscriptions: []consumer.Subscription{{
		Name: "billing", FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: rc.URL,
		Secrets:      []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("trace-command-test-secret-03"))},
		AllowPrivate: true,
		Ordering:     consumer.OrderingNone,
		Start:        consumer.Start{Policy: consumer.StartAll},
	}}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, "order-8", "OrderPlaced"),
		Header: nats.Header{wire.HeaderMsgID: []string{"45"}, wire.HeaderType: []string{"OrderPlaced"}, wire.HeaderSubject: []string{"order-8"}},
		Data:   []byte(`{}`)})
	require.NoError(t, err)

	run := func(args ...string) string {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse(append([]string{"trace", "--nats-url", srv.ClientURL()}, args...))
		require.NoError(t, err)
		var out bytes.Buffer
		cl.Trace.out = &out
		require.NoError(t, cl.Trace.Run(ctx, &cl.Globals))
		return out.String()
	}
	settled := regexp.MustCompile(`(?m)^billing\s+pos\.p\d+\s+1\s+settled\s+settled, or not for it: covered by the partition's record \(floor \d+, owner [^)]+\); no attempt record and no dead letter: answered 2xx on its first attempt`)
	var text string
	require.Eventually(t, func() bool {
		text = run("45", "--source-stream", "order-8")
		return settled.MatchString(text)
	}, 60*time.Second, 50*time.Millisecond, "the subscription settled it, from the positions bucket")
	require.Equal(t, int32(1), posts.Load(), "one POST")
	require.Contains(t, text, "event 45: order-8 v0 OrderPlaced, JetStream sequence 1")
	require.Contains(t, text, "no attempt records: under --attempts-record failures (the default) a success on the first attempt leaves none")
	require.Contains(t, text, "where each subscription stands, from the positions bucket")
	require.NotContains(t, text, "bridge streams --blocked", "it was found and delivered: nothing to look for on the bridge side")
	t.Logf("consumer trace 45 --source-stream order-8:\n%s", text)

	var tr consumer.EventTrace
	require.NoError(t, json.Unmarshal([]byte(run("45", "--source-stream", "order-8", "--json")), &tr))
	require.Empty(t, tr.Attempts)
	require.Len(t, tr.Deliveries, 1)
	d := tr.Deliveries[0]
	require.Equal(t, "billing", d.Subscription)
	require.Equal(t, uint64(1), d.Sequence)
	require.Equal(t, consumer.DeliverySettled, d.State)
	require.Equal(t, fmt.Sprintf("pos.p%d", d.Partition), d.Key, "read from the partition's record")

	bare := run("45")
	require.Contains(t, bare, "event 45: not found on the events stream (give --source-stream to scan its stream)")
	require.Contains(t, bare, "no attempt records: under --attempts-record failures (the default) a success on the first attempt leaves none,"+
		" so this does not mean it was never delivered: give --source-stream STREAM")
	require.Contains(t, bare, "`consumer run --attempts-record all` records every attempt")
	require.Contains(t, bare, "if --source-stream does not find it either, next: `bridge streams --blocked`")
	t.Logf("consumer trace 45:\n%s", bare)
}
