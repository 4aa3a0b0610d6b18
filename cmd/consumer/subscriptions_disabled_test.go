package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/wire"
)

// list and get show a subscription's disabled state, read from the
// endpoint health bucket: a DISABLED column (reason and since), a
// "disabled" object in --json (reason, since, status, last error) and a
// comment line in get; enable clears it.
func TestSubscriptionsListShowsDisabled(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	_, sFile := k.secretFile(t, "s")
	for _, name := range []string{"billing", "crm"} {
		require.NoError(t, k.cli(t, "add", name, "--url", "https://hooks.example.com/"+name, "--filter", "events.order.>", "--secret-file", sFile))
	}
	// Before the health bucket exists: nothing disabled.
	out, err := k.cliOut(t, "list")
	require.NoError(t, err)
	require.Contains(t, strings.Split(out, "\n")[0], " DISABLED ")
	require.Equal(t, "-", listColumn(t, out, "billing", "DISABLED"))

	// Disabled by an operator, through the CLI.
	before := time.Now().UTC().Truncate(time.Second)
	out, err = k.cliOut(t, "disable", "billing")
	require.NoError(t, err)
	require.Contains(t, out, "subscription billing disabled")
	out, err = k.cliOut(t, "list")
	require.NoError(t, err)
	col := listColumn(t, out, "billing", "DISABLED")
	require.True(t, strings.HasPrefix(col, "operator since "), col)
	since, err := time.Parse(time.RFC3339, strings.TrimPrefix(col, "operator since "))
	require.NoError(t, err)
	require.False(t, since.Before(before), "since %s, disabled at %s or later", since, before)
	require.Equal(t, "-", listColumn(t, out, "crm", "DISABLED"))

	// Disabled by a 410 (the record a replica writes): --json carries the
	// reason, since, status and last error.
	kv, err := k.js.KeyValue(k.ctx, wire.DefaultHealthBucket)
	require.NoError(t, err)
	at := time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)
	rec, err := json.Marshal(consumer.DisabledSubscription{Subscription: "crm", Reason: consumer.ReasonGone, Status: 410, LastError: "HTTP 410 Gone", At: at, Replica: "r1"})
	require.NoError(t, err)
	_, err = kv.Put(k.ctx, wire.DisabledKey("crm"), rec)
	require.NoError(t, err)
	out, err = k.cliOut(t, "list", "--json")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var got []listedSubscription
	for _, l := range lines {
		var v listedSubscription
		require.NoError(t, json.Unmarshal([]byte(l), &v))
		got = append(got, v)
	}
	require.Equal(t, "billing", got[0].Subscription.Name)
	require.NotNil(t, got[0].Disabled)
	require.Equal(t, consumer.ReasonOperator, got[0].Disabled.Reason)
	require.Equal(t, &disabledState{Reason: consumer.ReasonGone, Since: at, Status: 410, LastError: "HTTP 410 Gone", Replica: "r1"}, got[1].Disabled)
	require.Contains(t, lines[1], `"disabled":{"reason":"gone","since":"2026-11-26T04:00:00Z","status":410,"last_error":"HTTP 410 Gone","replica":"r1"}`)

	out, err = k.cliOut(t, "get", "crm")
	require.NoError(t, err)
	require.Contains(t, out, "# disabled (gone) since 2026-11-26T04:00:00Z, last error: HTTP 410 Gone: nothing is sent to its endpoint until consumer subscriptions enable crm\n")
	out, err = k.cliOut(t, "get", "crm", "--json")
	require.NoError(t, err)
	var one listedSubscription
	require.NoError(t, json.Unmarshal([]byte(out), &one))
	require.Equal(t, consumer.ReasonGone, one.Disabled.Reason)

	// Enabled: the state is gone from list, get and --json.
	out, err = k.cliOut(t, "enable", "crm")
	require.NoError(t, err)
	require.Contains(t, out, "subscription crm enabled")
	out, err = k.cliOut(t, "list")
	require.NoError(t, err)
	require.Equal(t, "-", listColumn(t, out, "crm", "DISABLED"))
	out, err = k.cliOut(t, "get", "crm")
	require.NoError(t, err)
	require.NotContains(t, out, "disabled")
	out, err = k.cliOut(t, "get", "crm", "--json")
	require.NoError(t, err)
	require.NotContains(t, out, `"disabled"`)
	_, err = kv.Get(k.ctx, wire.DisabledKey("crm"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
}

// listColumn returns the value in column col of name's row of list's
// table (columns start where their header does).
func listColumn(t *testing.T, table, name, col string) string {
	t.Helper()
	lines := strings.Split(table, "\n")
	start := strings.Index(lines[0], col)
	require.GreaterOrEqual(t, start, 0, "column %s in %q", col, lines[0])
	end := len(lines[0])
	if rest := strings.TrimLeft(lines[0][start+len(col):], " "); rest != "" {
		end = strings.Index(lines[0][start+len(col):], rest) + start + len(col)
	}
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, name+" ") {
			return strings.TrimSpace(l[start:min(end, len(l))])
		}
	}
	t.Fatalf("no row %s in %q", name, table)
	return ""
}
