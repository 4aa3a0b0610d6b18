package ops_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/ops"
)

var renamed = []ops.Renamed{
	{Old: "--replicas", New: "--stream-replicas", Also: "APP_STREAM_REPLICAS"},
	{Old: "APP_REPLICAS", New: "APP_STREAM_REPLICAS"},
	{Old: "APP_OPS_ADDR", New: "APP_BRIDGE_OPS_ADDR"},
}

func TestApplyRenames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		args     []string
		env      map[string]string
		wantArgs []string
		wantEnv  map[string]string
		warnings []string // each a substring of one warning, in order
	}{
		{name: "new names only", args: []string{"run", "--stream-replicas", "3"}, env: map[string]string{"APP_STREAM_REPLICAS": "3"},
			wantArgs: []string{"run", "--stream-replicas", "3"}, wantEnv: map[string]string{"APP_STREAM_REPLICAS": "3"}},
		{name: "old flag, separate value", args: []string{"run", "--replicas", "3"},
			wantArgs: []string{"run", "--stream-replicas", "3"}, wantEnv: map[string]string{},
			warnings: []string{"--replicas is deprecated and will be removed in the next release: use --stream-replicas (APP_STREAM_REPLICAS)"}},
		{name: "old flag with =", args: []string{"run", "--replicas=3", "--replicas-x"},
			wantArgs: []string{"run", "--stream-replicas=3", "--replicas-x"}, wantEnv: map[string]string{},
			warnings: []string{"use --stream-replicas"}},
		{name: "after -- is positional", args: []string{"append", "--", "--replicas"},
			wantArgs: []string{"append", "--", "--replicas"}, wantEnv: map[string]string{}},
		{name: "old variable copied", args: []string{"run"}, env: map[string]string{"APP_OPS_ADDR": ":1"},
			wantArgs: []string{"run"}, wantEnv: map[string]string{"APP_OPS_ADDR": ":1", "APP_BRIDGE_OPS_ADDR": ":1"},
			warnings: []string{"APP_OPS_ADDR is deprecated and will be removed in the next release: use APP_BRIDGE_OPS_ADDR (read as APP_BRIDGE_OPS_ADDR now)"}},
		{name: "both variables, the new one wins", args: []string{"run"}, env: map[string]string{"APP_OPS_ADDR": ":1", "APP_BRIDGE_OPS_ADDR": ":2"},
			wantArgs: []string{"run"}, wantEnv: map[string]string{"APP_OPS_ADDR": ":1", "APP_BRIDGE_OPS_ADDR": ":2"},
			warnings: []string{`APP_OPS_ADDR=":1" is ignored: APP_BRIDGE_OPS_ADDR=":2" is set`}},
		{name: "both variables, same value", args: []string{"run"}, env: map[string]string{"APP_REPLICAS": "3", "APP_STREAM_REPLICAS": "3"},
			wantArgs: []string{"run"}, wantEnv: map[string]string{"APP_REPLICAS": "3", "APP_STREAM_REPLICAS": "3"},
			warnings: []string{"APP_STREAM_REPLICAS is set to the same value; unset APP_REPLICAS"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range c.env {
				env[k] = v
			}
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			set := func(k, v string) error { env[k] = v; return nil }
			args, warnings, err := ops.ApplyRenames(renamed, c.args, lookup, set)
			require.NoError(t, err)
			require.Equal(t, c.wantArgs, args)
			require.Equal(t, c.wantEnv, env)
			require.Len(t, warnings, len(c.warnings), strings.Join(warnings, "\n"))
			for i, w := range c.warnings {
				require.Contains(t, warnings[i], w)
			}
			if len(c.args) > 0 {
				require.NotSame(t, &c.args[0], &args[0], "the caller's args are not rewritten in place")
			}
		})
	}
}

func TestApplyRenamesSetError(t *testing.T) {
	t.Parallel()
	lookup := func(k string) (string, bool) { return "x", k == "APP_REPLICAS" }
	_, _, err := ops.ApplyRenames(renamed, nil, lookup, func(string, string) error { return errors.New("read-only") })
	require.ErrorContains(t, err, "environment APP_STREAM_REPLICAS (from APP_REPLICAS): read-only")
}
