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
// requests and the floor's window under the fan-out; the claim's sender, the search by time
// and the replica's metrics under the replica.
var sharedFloors = [][]string{
	{"internal/deliver/position/record"},
	{"internal/deliver/position"},
	{"internal/deliver/fanout/member", "internal/deliver/fanout/cursor", "internal/deliver/fanout/unpark", "internal/deliver/fanout/floor"},
	{"internal/deliver/fanout"},
	{"internal/deliver/shared/sender", "internal/deliver/shared/seqtime", "internal/deliver/shared/metrics"},
	{"internal/deliver/shared"},
}

// TestSharedEngineRoomsImportDownward checks sharedFloors against the
// module's package graph, and that the positions' values need nothing
// beyond the standard library.
func TestSharedEngineRoomsImportDownward(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	floor := map[string]int{}
	for i, rooms := range sharedFloors {
		for _, r := range rooms {
			if _, ok := g[module+"/"+r]; !ok {
				t.Fatalf("package %s is not in the module (rename it in sharedFloors with it)", r)
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
	values := rule{pkg: "internal/deliver/position/record", only: []string{},
		why: "the positions' values, their rules and their encoding do no I/O: standard library only"}
	for dep, chain := range g.paths(module + "/" + values.pkg) {
		if bad := values.violation(g, dep); bad != "" {
			t.Errorf("%s imports %s (%s); the rule: %s\n\timport chain: %s", values.pkg, dep, bad, values.why, strings.Join(chain, " → "))
		}
	}
}
