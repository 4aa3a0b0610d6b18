package main

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/store"
)

// The libraries name fields and options; only the binary names flags.
func TestFlagNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{bridge.Config{Lease: time.Microsecond}.Validate(), "--lease: invalid bridge config: Config.Lease 1µs is below 1ms"},
		{bridge.Config{ClaimLimit: -1}.Validate(), "--claim-limit: invalid bridge config: Config.ClaimLimit -1 is negative"},
		{bridge.Config{Schema: "Bad"}.Validate(), `--schema: invalid bridge config: Config.Schema "Bad"`},
		{bridge.Config{SubjectPrefix: "a.*"}.Validate(), `--subject-prefix: invalid bridge config: Config.SubjectPrefix "a.*"`},
		{store.WithEventsTable("nodot")(&store.Store{}), `--events-table: invalid store config: WithEventsTable "nodot"`},
	} {
		require.Error(t, c.err)
		got := flagNames(c.err)
		require.ErrorContains(t, got, c.want)
		require.True(t, errors.Is(got, bridge.ErrInvalidConfig) || errors.Is(got, store.ErrInvalidConfig), "the sentinel is kept")
	}
	other := errors.New("connection refused")
	require.Equal(t, other, flagNames(other))
}
