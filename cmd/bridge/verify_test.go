package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/internal/bridgemetrics"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// Every flag of bridge verify is in docs/operations.md's verify table (the
// connection flags in docs/cli.md).
func TestOperationsDocListsEveryVerifyFlag(t *testing.T) {
	t.Parallel()
	var c cli
	k, err := kong.New(&c, kong.Name("bridge"), ops.WireVars())
	require.NoError(t, err)
	readme, err := os.ReadFile("../../docs/cli.md")
	require.NoError(t, err)
	ops, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	sec := string(ops)
	i := strings.Index(sec, "\n### bridge verify")
	require.GreaterOrEqual(t, i, 0, "docs/operations.md has a bridge verify section")
	sec = sec[i+1:]
	if end := strings.Index(sec, "\n## "); end >= 0 {
		sec = sec[:end]
	}
	if end := strings.Index(sec[4:], "\n### "); end >= 0 {
		sec = sec[:end+4]
	}
	var found bool
	for _, node := range k.Model.Children {
		if node.Name != "verify" {
			continue
		}
		found = true
		require.Greater(t, len(node.Flags), 10, "verify's own flags")
		for _, f := range node.Flags {
			if f.Group != nil || strings.HasPrefix(f.Name, "nats-") && f.Name != "nats-url" || f.Name == "context" {
				// natsconn's connection flags: their own table.
				require.Contains(t, string(readme), "`--"+f.Name+"`", "docs/cli.md lacks --%s", f.Name)
				continue
			}
			require.Contains(t, sec, "| `--"+f.Name+"` |", "docs/operations.md's verify table lacks --%s", f.Name)
		}
	}
	require.True(t, found, "verify subcommand exists")
}

func TestVerifySince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		since string
		want  time.Time
		bad   bool
	}{
		{since: "", want: time.Time{}},
		{since: "24h", want: now.Add(-24 * time.Hour)},
		{since: "2026-11-22T08:30:00Z", want: time.Date(2026, 11, 22, 8, 30, 0, 0, time.UTC)},
		{since: "-1h", bad: true},
		{since: "yesterday", bad: true},
	} {
		v := verifyCmd{NatsURL: "nats://x", PageSize: 1, Since: tt.since}
		got, err := v.check(now)
		if tt.bad {
			require.ErrorContains(t, err, "--since", tt.since)
			continue
		}
		require.NoError(t, err, tt.since)
		require.True(t, tt.want.Equal(got), "%s: got %s", tt.since, got)
	}
}

// auditRound counts the problems a round left, by kind: a repaired
// missing event counts as repaired, not missing.
func TestAuditRoundCountsWhatIsLeft(t *testing.T) {
	t.Parallel()
	end := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rep := bridge.Report{Events: 40, Elapsed: 2 * time.Second, Problems: []bridge.Problem{
		{Kind: bridge.ProblemMissing, Repaired: true}, {Kind: bridge.ProblemMissing, Repaired: true}, {Kind: bridge.ProblemMissing},
		{Kind: bridge.ProblemDuplicate}, {Kind: bridge.ProblemOutOfOrder}, {Kind: bridge.ProblemOutOfOrder}, {Kind: bridge.ProblemContentDiffers},
	}}
	require.Equal(t, bridgemetrics.AuditRound{Events: 40, Missing: 1, Duplicates: 1, OutOfOrder: 2, ContentDiffers: 1, Repaired: 2,
		Duration: 2 * time.Second, End: end}, auditRound(rep, end))
	require.Equal(t, bridgemetrics.AuditRound{End: end}, auditRound(bridge.Report{}, end))
}
