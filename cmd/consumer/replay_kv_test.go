package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/wire"
)

// `consumer replay --subscriptions-from kv` sends the window to the
// bucket's subscription: its full URL and its secrets, opened with the
// key file; without the key, or with a subscription the bucket does not
// hold, it says which flag is missing or which name is unknown.
func TestReplayFromTheSubscriptionsBucket(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	secret, sFile := k.secretFile(t, "s")
	rc := newRecorder(t, secret)
	// Paused: a replay reads the events stream itself and leaves the
	// subscription's delivery alone, so it may replay anyway.
	require.NoError(t, k.cli(t, "add", "billing", "--url", rc.srv.URL+"/in?token=t", "--filter", "events.order.>",
		"--secret-file", sFile, "--allow-private", "--paused"))
	events, err := k.js.Stream(k.ctx, wire.DefaultEventsStream)
	require.NoError(t, err)
	k.publish(t, 1, "order-1") // before the window
	first, err := events.Info(k.ctx)
	require.NoError(t, err)
	var in []string
	for i := 2; i <= 5; i++ {
		in = append(in, k.publish(t, i, fmt.Sprintf("order-%d", i%2)))
		k.publish(t, 100+i, "invoice-1") // not the subscription's filter
	}
	m, err := events.GetMsg(k.ctx, first.State.LastSeq+1)
	require.NoError(t, err)
	since := m.Time.Format(time.RFC3339Nano)

	run := func(args ...string) (string, error) {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse(append([]string{"replay", "--nats-url", k.srv.ClientURL(), "--subscriptions-from", "kv", "--since", since}, args...))
		require.NoError(t, err)
		var out, progress bytes.Buffer
		cl.Replay.out, cl.Replay.progress = &out, &progress
		err = cl.Replay.Run(k.ctx, &cl.Globals)
		return out.String(), err
	}

	out, err := run("--secrets-key-file", k.keyFile, "--subscription", "billing")
	require.NoError(t, err)
	require.Contains(t, out, "replay: 4 events of subscription billing from "+since)
	var ids []string
	for _, g := range rc.all() {
		require.Equal(t, 0, g.signedWith, "event %s signed with the bucket's secret", g.id)
		ids = append(ids, g.id)
	}
	require.Equal(t, in, ids, "the window's events, in stream order, once")
	_, err = k.js.Consumer(k.ctx, wire.DefaultEventsStream, "billing")
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "no durable consumer made")

	// The bucket's only subscription needs no --subscription; a dry run
	// counts.
	out, err = run("--secrets-key-file", k.keyFile, "--dry-run")
	require.NoError(t, err)
	require.Contains(t, out, "replay --dry-run: 4 events of subscription billing")
	require.Len(t, rc.all(), 4, "a dry run sends nothing")

	_, err = run("--secrets-key-file", k.keyFile, "--subscription", "crm")
	require.ErrorIs(t, err, consumer.ErrSubscriptionNotFound)
	require.ErrorContains(t, err, `--subscription "crm": no such subscription in bucket `+consumer.DefaultSubscriptionsBucket)
	_, err = run("--subscription", "billing")
	require.ErrorIs(t, err, consumer.ErrNoSecretsKey)
	require.ErrorContains(t, err, "--secrets-key-file")
	require.NoError(t, k.cli(t, "add", "crm", "--url", rc.srv.URL, "--filter", "events.order.>", "--secret-file", sFile, "--allow-private"))
	_, err = run("--secrets-key-file", k.keyFile)
	require.ErrorContains(t, err, `--subscription is required: bucket `+consumer.DefaultSubscriptionsBucket+` holds 2 subscriptions (["billing" "crm"])`)
}
