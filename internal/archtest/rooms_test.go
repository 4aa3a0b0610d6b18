package archtest

import (
	"strings"
	"testing"
)

// sharedFloors are the shared engine's rooms by floor, lowest first: a
// room may import (directly or through others) only rooms of the floors
// below its own, never one of its floor (a sibling) or above. Each
// parent's rooms sit below it, and the parent below its users: the
// positions' values (record) under the bucket's reads and writes
// (position); the member index, a cursor's reads, the operator's
// requests and the floor's window under the fan-out; the attempts (the
// fan-out's Sender) above the fan-out and the webhook's body (payload); the search by time and the
// replica's metrics under the replica.
var sharedFloors = [][]string{
	{"internal/deliver/position/record"},
	{"internal/deliver/position"},
	{"internal/deliver/fanout/member", "internal/deliver/fanout/cursor", "internal/deliver/fanout/unpark", "internal/deliver/fanout/floor"},
	{"internal/deliver/fanout", "internal/deliver/payload"},
	{"internal/deliver/attempt"},
	{"internal/deliver/shared/seqtime", "internal/deliver/shared/metrics"},
	{"internal/deliver/shared"},
}

// migrateFloors are `consumer migrate`'s rooms by floor, with the same
// rule: the old layout's names and reads (legacy) and the keys the
// migration leaves in the positions bucket (mark) under the deletion of
// the old layout (cleanup), and all of them under the plan and its
// application (migrate).
var migrateFloors = [][]string{
	{"internal/migrate/legacy", "internal/migrate/mark"},
	{"internal/migrate/cleanup"},
	{"internal/migrate"},
}

// checkFloors checks floors against g: no room imports (directly or
// through others) a room of its own floor or above.
func checkFloors(t *testing.T, g graph, floors [][]string) {
	t.Helper()
	floor := map[string]int{}
	for i, rooms := range floors {
		for _, r := range rooms {
			if _, ok := g[module+"/"+r]; !ok {
				t.Fatalf("package %s is not in the module (rename it in its floors with it)", r)
			}
			floor[module+"/"+r] = i
		}
	}
	for from, i := range floor {
		for dep, chain := range g.paths(from) {
			if j, ok := floor[dep]; ok && j >= i {
				t.Errorf("%s (floor %d) imports %s (floor %d): a room imports only rooms below it\n\timport chain: %s",
					strings.TrimPrefix(from, module+"/"), i, strings.TrimPrefix(dep, module+"/"), j, strings.Join(chain, " → "))
			}
		}
	}
}

// TestMigrateRoomsImportDownward checks migrateFloors against the
// module's package graph, and that the engine never imports the
// migration beside it.
func TestMigrateRoomsImportDownward(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	checkFloors(t, g, migrateFloors)
	migrate := module + "/internal/migrate"
	for path := range g {
		if path != consumerEngine && !strings.HasPrefix(path, consumerEngine+"/") {
			continue
		}
		for dep, chain := range g.paths(path) {
			if dep == migrate || strings.HasPrefix(dep, migrate+"/") {
				t.Errorf("%s imports %s: the engine never imports consumer migrate's rooms\n\timport chain: %s",
					strings.TrimPrefix(path, module+"/"), strings.TrimPrefix(dep, module+"/"), strings.Join(chain, " → "))
			}
		}
	}
}

// TestSharedEngineRoomsImportDownward checks sharedFloors against the
// module's package graph, and that the positions' values need nothing
// beyond the standard library.
func TestSharedEngineRoomsImportDownward(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	checkFloors(t, g, sharedFloors)
	values := rule{pkg: "internal/deliver/position/record", only: []string{},
		why: "the positions' values, their rules and their encoding do no I/O: standard library only"}
	for dep, chain := range g.paths(module + "/" + values.pkg) {
		if bad := values.violation(g, dep); bad != "" {
			t.Errorf("%s imports %s (%s); the rule: %s\n\timport chain: %s", values.pkg, dep, bad, values.why, strings.Join(chain, " → "))
		}
	}
}
