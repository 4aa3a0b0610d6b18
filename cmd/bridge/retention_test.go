package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// bridge retention shows the events stream's retention and the consumer's
// streams that follow it, says what --max-age would change without --yes
// and changes nothing, and with --yes changes the existing stream.
func TestRetentionCommandChangesAnExistingStreamOnlyWithYes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	for _, name := range []string{"EVENTS", "DLQ"} {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: 2 * time.Minute})
		require.NoError(t, err)
	}
	run := func(args ...string) (string, error) {
		var cl cli
		parser, err := kong.New(&cl, ops.WireVars())
		require.NoError(t, err)
		_, err = parser.Parse(append([]string{"retention", "--nats-url", srv.ClientURL()}, args...))
		require.NoError(t, err)
		var out bytes.Buffer
		cl.Retention.out = &out
		err = cl.Retention.run(ctx, js)
		return out.String(), err
	}
	have := func(name string) bridge.Retention {
		r, err := bridge.StreamRetention(context.Background(), js, name)
		require.NoError(t, err)
		return r
	}

	out, err := run()
	require.NoError(t, err)
	require.Equal(t, "EVENTS: max_age=none max_bytes=none max_msgs_per_subject=none\n"+
		"DLQ (the dead letters: twice MaxAge, no size limit): max_age=none max_bytes=none max_msgs_per_subject=none\n", out)

	out, err = run("--max-age", "168h", "--max-bytes", "1073741824")
	require.ErrorContains(t, err, "nothing changed; run again with --yes")
	require.Equal(t, "would change EVENTS: max_age=none max_bytes=none max_msgs_per_subject=none -> max_age=168h0m0s max_bytes=1073741824 max_msgs_per_subject=none\n", out)
	require.Equal(t, bridge.Retention{}, have("EVENTS"), "unchanged without --yes")

	out, err = run("--max-age", "168h", "--max-bytes", "1073741824", "--yes")
	require.NoError(t, err)
	require.Contains(t, out, "changed EVENTS: max_age=none max_bytes=none max_msgs_per_subject=none -> max_age=168h0m0s max_bytes=1073741824 max_msgs_per_subject=none\n")
	require.Contains(t, out, "DLQ (the dead letters: twice MaxAge, no size limit): max_age=none max_bytes=none max_msgs_per_subject=none; "+
		"the consumer creates it with max_age=336h0m0s max_bytes=none max_msgs_per_subject=none, it is left as it is: nats stream edit DLQ --max-age 336h0m0s\n")
	require.Equal(t, bridge.Retention{MaxAge: 168 * time.Hour, MaxBytes: 1 << 30}, have("EVENTS"))
	require.Equal(t, bridge.Retention{}, have("DLQ"), "the consumer's streams are the consumer's")

	_, err = run("--max-msgs-per-subject", "3", "--yes")
	require.NoError(t, err)
	require.Equal(t, bridge.Retention{MaxAge: 168 * time.Hour, MaxBytes: 1 << 30, MaxMsgsPerSubject: 3}, have("EVENTS"), "limits not given are kept")

	_, err = run("--max-age", "1m", "--yes")
	require.ErrorIs(t, err, bridge.ErrInvalidConfig)
	require.ErrorContains(t, err, "shorter than JetStream stream EVENTS's duplicate window 2m0s")
	_, err = run("--max-age", "soon")
	require.ErrorContains(t, err, `--max-age "soon": want a duration`)
	_, err = run("--jetstream-stream", "NOPE")
	require.ErrorIs(t, err, bridge.ErrStreamNotFound)
}
