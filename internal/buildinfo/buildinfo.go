// Package buildinfo says which build of jsbridge is running: the module
// version, the commit and the build date, for `bridge version`,
// `consumer version` and --version.
//
// The values come from two places. A release build (goreleaser, `make
// build`) sets them with the linker:
//
//	-X github.com/jsbridge/jsbridge/internal/buildinfo.version=v0.3.0
//	-X github.com/jsbridge/jsbridge/internal/buildinfo.commit=<sha>
//	-X github.com/jsbridge/jsbridge/internal/buildinfo.date=<RFC 3339>
//
// Otherwise they come from the build info the Go toolchain embeds
// (runtime/debug.ReadBuildInfo): `go install …/cmd/bridge@v0.3.0` records
// the module version v0.3.0; a pseudo-version
// (v0.0.0-20261125223000-0123456789ab) names its commit and the commit's
// time; a build inside a git checkout records vcs.revision, vcs.time and
// vcs.modified (unless -buildvcs=false).
package buildinfo

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// Set by the linker (-X) in release builds; empty otherwise.
var (
	version string
	commit  string
	date    string
)

// Unknown is what Info holds for a value no source gave.
const Unknown = "unknown"

// Info is one build's identity. Every field is non-empty: a value no
// source gave is Unknown.
type Info struct {
	// Module is the main module's path, github.com/jsbridge/jsbridge.
	Module string
	// Version is the module version: a release tag (v0.3.0), a
	// pseudo-version, or "(devel)" for a build from a checkout.
	Version string
	// Commit is the git commit the build came from, with "-dirty" when the
	// work tree had uncommitted changes.
	Commit string
	// Date is when the binary was built (release builds) or, failing that,
	// the commit's time, in RFC 3339, UTC.
	Date string
	// Go is the toolchain and target, e.g. "go1.26.8 linux/amd64".
	Go string
}

// pseudo matches the tail of a Go pseudo-version: the commit's UTC time
// (yyyymmddhhmmss) and the first 12 hex digits of its hash.
var pseudo = regexp.MustCompile(`(?:^|[.-])(\d{14})-([0-9a-f]{12})(?:\+incompatible)?$`)

// Read returns the running binary's Info.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, version, commit, date)
}

// fromBuildInfo is Read with its sources as arguments: bi may be nil, and
// the linker's values win over the build info's.
func fromBuildInfo(bi *debug.BuildInfo, ldVersion, ldCommit, ldDate string) Info {
	in := Info{Module: "github.com/jsbridge/jsbridge", Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	var vcsRev, vcsTime string
	var dirty bool
	if bi != nil {
		if bi.Main.Path != "" {
			in.Module = bi.Main.Path
		}
		in.Version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				vcsRev = s.Value
			case "vcs.time":
				vcsTime = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if bi.GoVersion != "" {
			in.Go = bi.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
		}
	}
	if m := pseudo.FindStringSubmatch(in.Version); m != nil && vcsRev == "" {
		vcsRev = m[2]
		if t, err := time.Parse("20060102150405", m[1]); err == nil {
			vcsTime = t.UTC().Format(time.RFC3339)
		}
	}
	if vcsRev != "" && dirty {
		vcsRev += "-dirty"
	}
	in.Version = first(ldVersion, in.Version)
	in.Commit = first(ldCommit, vcsRev)
	in.Date = first(ldDate, vcsTime)
	return in
}

func first(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return Unknown
}

// Line is the one-line form --version prints:
// "bridge v0.3.0 (commit 0123abc, built 2026-11-25T22:30:00Z, go1.26.8 linux/amd64)".
func (in Info) Line(binary string) string {
	return fmt.Sprintf("%s %s (commit %s, built %s, %s)", binary, in.Version, in.Commit, in.Date, in.Go)
}

// Long is the form `version` prints: one "key: value" line per field.
func (in Info) Long(binary string) string {
	return fmt.Sprintf("%s\nversion: %s\ncommit:  %s\nbuilt:   %s\ngo:      %s\nmodule:  %s\n",
		binary, in.Version, in.Commit, in.Date, in.Go, in.Module)
}
