package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		bi                      *debug.BuildInfo
		ldVer, ldCommit, ldDate string
		version, commit, date   string
	}{
		{
			name:    "go install of a tag records the version only",
			bi:      &debug.BuildInfo{Main: debug.Module{Path: "github.com/jsbridge/jsbridge", Version: "v0.3.0"}},
			version: "v0.3.0", commit: Unknown, date: Unknown,
		},
		{
			name:    "a pseudo-version names its commit and time",
			bi:      &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261125223000-0123456789ab"}},
			version: "v0.0.0-20261125223000-0123456789ab", commit: "0123456789ab", date: "2026-11-25T22:30:00Z",
		},
		{
			name:    "a pseudo-version after a tag",
			bi:      &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1-0.20261125223000-0123456789ab"}},
			version: "v0.3.1-0.20261125223000-0123456789ab", commit: "0123456789ab", date: "2026-11-25T22:30:00Z",
		},
		{
			name: "a checkout records vcs settings",
			bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "abcdef"}, {Key: "vcs.time", Value: "2026-11-25T20:00:00Z"}, {Key: "vcs.modified", Value: "true"},
			}},
			version: "(devel)", commit: "abcdef-dirty", date: "2026-11-25T20:00:00Z",
		},
		{
			name:  "the linker's values win",
			bi:    &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abcdef"}}},
			ldVer: "v0.4.0", ldCommit: "fedcba", ldDate: "2026-11-26T00:00:00Z",
			version: "v0.4.0", commit: "fedcba", date: "2026-11-26T00:00:00Z",
		},
		{
			name:    "no build info at all",
			version: Unknown, commit: Unknown, date: Unknown,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := fromBuildInfo(tt.bi, tt.ldVer, tt.ldCommit, tt.ldDate)
			require.Equal(t, tt.version, in.Version)
			require.Equal(t, tt.commit, in.Commit)
			require.Equal(t, tt.date, in.Date)
			require.Equal(t, "github.com/jsbridge/jsbridge", in.Module)
			require.NotEmpty(t, in.Go)
		})
	}
}

func TestLineAndLong(t *testing.T) {
	t.Parallel()
	in := Info{Module: "m", Version: "v1.2.3", Commit: "c0ffee", Date: "2026-11-25T22:30:00Z", Go: "go1.26.8 linux/amd64"}
	require.Equal(t, "bridge v1.2.3 (commit c0ffee, built 2026-11-25T22:30:00Z, go1.26.8 linux/amd64)", in.Line("bridge"))
	require.Contains(t, in.Long("consumer"), "version: v1.2.3\ncommit:  c0ffee\n")
}
