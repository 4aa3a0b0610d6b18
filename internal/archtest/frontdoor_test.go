package archtest

import (
	"slices"
	"strings"
	"testing"
)

// directRule is what one package may not import itself (it may still
// reach it through a front door).
type directRule struct {
	pkg       string   // relative to the module
	forbidden []string // relative to the module
	why       string
}

var directRules = []directRule{
	{pkg: "cmd/bridge", forbidden: []string{"forward", "drain", "internal/audit"},
		why: "the bridge binary reaches the engine through the bridge front door only"},
}

// TestFrontDoors checks that the binaries import the front doors, not the
// engines behind them.
func TestFrontDoors(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	for _, r := range directRules {
		p, ok := g[module+"/"+r.pkg]
		if !ok {
			t.Fatalf("package %s is not in the module (rename the rule with it)", r.pkg)
		}
		if !slices.Contains(p.Imports, module+"/bridge") && r.pkg == "cmd/bridge" {
			t.Fatalf("%s does not import bridge: the graph is incomplete", r.pkg)
		}
		for _, imp := range p.Imports {
			for _, f := range r.forbidden {
				if imp == module+"/"+f || strings.HasPrefix(imp, module+"/"+f+"/") {
					t.Errorf("%s imports %s; the rule: %s", r.pkg, imp, r.why)
				}
			}
		}
	}
}

// TestInternalImportsNoFrontDoor checks that nothing under internal/
// imports a front door: public packages import internal ones, never the
// reverse.
func TestInternalImportsNoFrontDoor(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	doors := []string{"bridge", "consumer", "jsbridgetest"} // webhook is a library the engine signs with
	for path, p := range g {
		rel, ok := strings.CutPrefix(path, module+"/")
		if !ok || !(strings.HasPrefix(rel, "internal/") || strings.Contains(rel, "/internal/")) {
			continue
		}
		for _, imp := range p.Imports {
			for _, d := range doors {
				if imp == module+"/"+d {
					t.Errorf("%s imports the front door %s: internal packages serve the front doors, never the reverse", rel, d)
				}
			}
		}
	}
}
