package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// `consumer replay` of a subscription given by flags re-delivers exactly
// the window's events, signed, in stream order; --source-stream and
// --match narrow it, --dry-run counts, a failing POST stops it with the
// --since that resumes it.
func TestReplayCommandRedeliversTheWindow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	events, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)},
		AllowDirect: true}) // as the bridge makes it: replay under the shared engine reads with direct gets
	require.NoError(t, err)
	id := 0
	publish := func(stream string) (string, time.Time) {
		id++
		sid := strconv.Itoa(id)
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, stream, "Noted"),
			Header: nats.Header{wire.HeaderMsgID: []string{sid}, wire.HeaderType: []string{"Noted"}, wire.HeaderSubject: []string{stream}},
			Data:   []byte(`{}`)})
		require.NoError(t, err)
		m, err := events.GetMsg(ctx, ack.Sequence)
		require.NoError(t, err)
		return sid, m.Time
	}
	_, before := publish("order-1")
	var in, inOrder2 []string
	for _, s := range []string{"order-1", "order-2", "invoice-1", "order-2", "order-1"} {
		sid, _ := publish(s)
		switch s {
		case "order-2":
			inOrder2 = append(inOrder2, sid)
			in = append(in, sid)
		case "order-1":
			in = append(in, sid)
		}
	}
	_, after := publish("order-1")
	since, until := before.Add(time.Nanosecond).Format(time.RFC3339Nano), after.Format(time.RFC3339Nano)

	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("replay-command-test-secret-01"))
	var mu sync.Mutex
	var got []string
	fail := ""
	var onThird func() // called in the third request since got was last read
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		v, _ := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
		if v.Verify(r.Header, body.Bytes()) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		key := r.Header.Get(wire.HeaderIdempotencyKey)
		mu.Lock()
		got = append(got, key)
		refuse, third := key == fail, len(got) == 3 && onThird != nil
		hook := onThird
		mu.Unlock()
		if third {
			hook()
		}
		if refuse {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}

	run := func(args ...string) (string, error) {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse(append([]string{"replay", "--nats-url", srv.ClientURL(), "--name", "billing", "--url", rc.URL,
			"--secret", secret, "--allow-private", "--filter", "events.order.>", "--since", since, "--until", until}, args...))
		require.NoError(t, err)
		var out, progress bytes.Buffer
		cl.Replay.out, cl.Replay.progress = &out, &progress
		err = cl.Replay.Run(ctx, &cl.Globals)
		if err == nil || strings.Contains(err.Error(), "replay stopped") {
			require.Contains(t, progress.String(), "replay: subscription billing, JetStream stream EVENTS from "+since+" to "+until+"\n")
		}
		return out.String(), err
	}

	out, err := run()
	require.NoError(t, err)
	require.Equal(t, in, received(), "the window's order events, signed, in stream order")
	require.Contains(t, out, "replay: 4 events of subscription billing from "+since+" to "+until+" delivered")
	_, err = js.Consumer(ctx, wire.DefaultEventsStream, "billing")
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "no durable consumer made")

	_, err = run("--source-stream", "order-2")
	require.NoError(t, err)
	require.Equal(t, inOrder2, received())

	_, err = run("--match", "^order-[2-9]$")
	require.NoError(t, err)
	require.Equal(t, inOrder2, received())

	out, err = run("--dry-run")
	require.NoError(t, err)
	require.Empty(t, received(), "a dry run sends nothing")
	require.Contains(t, out, "replay --dry-run: 4 events of subscription billing")

	var res consumer.WindowResult
	out, err = run("--json", "--subscription", "billing")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, 4, res.Delivered)
	require.Equal(t, in[3], res.Last.EventID)
	received()

	mu.Lock()
	fail = in[2]
	mu.Unlock()
	out, err = run()
	require.Error(t, err)
	require.Equal(t, in[:3], received(), "stopped at the failing event")
	require.Contains(t, out, "2 events of subscription billing")
	require.Contains(t, err.Error(), "replay stopped at event "+in[2])
	require.Contains(t, err.Error(), "HTTP 503 Service Unavailable; resume with --since ")

	// Interrupted during the third POST: the error says where to resume.
	ictx, interrupt := context.WithCancel(ctx)
	hold := make(chan struct{})
	mu.Lock()
	fail, onThird = "", func() { interrupt(); <-hold }
	mu.Unlock()
	var cl cli
	parser, err := kong.New(&cl, ops.WireVars())
	require.NoError(t, err)
	_, err = parser.Parse([]string{"replay", "--nats-url", srv.ClientURL(), "--name", "billing", "--url", rc.URL,
		"--secret", secret, "--allow-private", "--filter", "events.order.>", "--since", since, "--until", until})
	require.NoError(t, err)
	cl.Replay.out, cl.Replay.progress = io.Discard, io.Discard
	err = cl.Replay.Run(ictx, &cl.Globals)
	close(hold)
	mu.Lock()
	onThird = nil
	mu.Unlock()
	require.Error(t, err)
	require.Regexp(t, `resume with --since `+regexp.QuoteMeta(since[:10]), err.Error(), "where to resume")
	received()

	_, err = run("--subscription", "orders")
	require.ErrorContains(t, err, `--subscription "orders": no such subscription`)
	parser, err = kong.New(&cli{}, ops.WireVars())
	require.NoError(t, err)
	_, err = parser.Parse([]string{"replay", "--since", "1h", "--source-stream", "order-1", "--match", "x"})
	require.ErrorContains(t, err, "--source-stream and --match can't be used together")
}

func TestParseWhen(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 26, 2, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-25T10:00:00Z":        time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC),
		"2026-11-25T10:00:00.5+01:00": time.Date(2026, 11, 25, 9, 0, 0, 500_000_000, time.UTC),
		"90m":                         now.Add(-90 * time.Minute),
		"1h30m":                       now.Add(-90 * time.Minute),
	} {
		got, err := parseWhen(in, now)
		require.NoError(t, err, in)
		require.True(t, want.Equal(got), "%s: %s, want %s", in, got, want)
	}
	for _, in := range []string{"", "yesterday", "-5m", "0s", "2026-11-25"} {
		_, err := parseWhen(in, now)
		require.Error(t, err, in)
	}
}
