package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// frontDoors are the public packages an application imports to run a side
// of jsbridge (or to test with it): internal packages sit behind them and
// never import them back.
var frontDoors = []string{"consumer", "bridge", "jsbridgetest"}

// consumerEngine is the import path prefix of the consumer's engine: every
// package under it is reached through the consumer front door.
const consumerEngine = module + "/internal/deliver"

// engineImporters are the packages, besides the engine's own, that may
// import the consumer's engine directly (their tests included): the front
// door itself, the end-to-end tests and benchmarks that drive the
// engine with parts the front door builds itself (a shared breaker set),
// and `consumer migrate`'s rooms, which write the positions bucket
// through the engine's position. cmd/consumer is not among them: the
// binary reaches the engine only through consumer.
var engineImporters = []string{"consumer", "integration", "bench",
	"internal/migrate", "internal/migrate/cleanup", "internal/migrate/migratetest"}

// TestInternalNeverImportsAFrontDoor: the public packages import internal
// ones, never the reverse, so an engine cannot grow a dependency on the API
// wrapped around it.
func TestInternalNeverImportsAFrontDoor(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	n := 0
	for path := range g {
		if !strings.HasPrefix(path, module+"/internal/") {
			continue
		}
		n++
		for dep, chain := range g.paths(path) {
			for _, door := range frontDoors {
				if dep == module+"/"+door {
					t.Errorf("%s imports the front door %s; internal packages sit behind the public ones\n\timport chain: %s",
						path, door, strings.Join(chain, " → "))
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no internal package in the go list graph; the graph is incomplete")
	}
}

// TestConsumerEngineImporters: only engineImporters (and the engine's own
// packages) import the consumer's engine, tests included.
func TestConsumerEngineImporters(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	found := false
	for {
		var p struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		rel := strings.TrimPrefix(p.ImportPath, module+"/")
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if imp != consumerEngine && !strings.HasPrefix(imp, consumerEngine+"/") {
				continue
			}
			found = true
			if p.ImportPath == consumerEngine || strings.HasPrefix(p.ImportPath, consumerEngine+"/") || slices.Contains(engineImporters, rel) {
				continue
			}
			t.Errorf("%s imports the consumer's engine %s; only %s may (import consumer instead)", rel, imp, strings.Join(engineImporters, ", "))
		}
	}
	if !found {
		t.Fatalf("nothing imports %s; the rule is vacuous (rename consumerEngine with the engine)", consumerEngine)
	}
}

// roomsNotYetBelow are the engine's rooms that still import its root,
// with why; the list only shrinks (TestEngineRoomsBelowTheRoot fails
// for an entry that no longer does).
var roomsNotYetBelow = map[string]string{}

// TestEngineRoomsBelowTheRoot: the engine's rooms (the packages under
// internal/deliver/) sit below its root: none imports internal/deliver
// itself, directly or through another package, so the root composes the
// rooms and a room's dependencies are the interfaces it owns.
func TestEngineRoomsBelowTheRoot(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	// The root must reach its rooms, or the rule would pass vacuously.
	if _, ok := g.paths(consumerEngine)[consumerEngine+"/attempt"]; !ok {
		t.Fatalf("%s does not import %s/attempt; the graph is incomplete (rename the rule with the room)", consumerEngine, consumerEngine)
	}
	n := 0
	for path := range g {
		if !strings.HasPrefix(path, consumerEngine+"/") {
			continue
		}
		n++
		chain, ok := g.paths(path)[consumerEngine]
		if why, known := roomsNotYetBelow[path]; known {
			if !ok {
				t.Errorf("%s no longer imports %s: delete it from roomsNotYetBelow (%s)", path, consumerEngine, why)
			}
			continue
		}
		if ok {
			t.Errorf("%s imports the engine's root %s; a room sits below the root (take what it needs as an interface it owns)\n\timport chain: %s",
				path, consumerEngine, strings.Join(chain, " → "))
		}
	}
	if n < 2 {
		t.Fatalf("only %d rooms under %s in the go list graph; the graph is incomplete", n, consumerEngine)
	}
}

// engineLayers are the engine's rooms (relative to internal/deliver, ""
// its root) from the top down: a room imports only rooms of a lower
// layer. shared composes the rooms into a replica; inspect reads what
// it wrote;
// attempt makes the POSTs of a claim (the fan-out's Sender); fanout
// hands a partition's events to the subscriptions; below them the rooms
// that know no other (but subscription's egress). A room not listed is not checked (a room being added or
// removed); TestEngineLayersNameRealRooms keeps the list from naming
// rooms that are gone.
var engineLayers = [][]string{
	{"", "shared"},
	{"inspect"},
	{"attempt"},
	{"fanout", "payload"},
	{"reader", "position", "owner", "health", "deadletter", "attemptlog", "subkv", "throttle"},
	{"subscription"},
	{"egress"},
}

// layerOf returns the layer of the engine's package path, and whether
// engineLayers lists it.
func layerOf(path string) (int, bool) {
	if path != consumerEngine && !strings.HasPrefix(path, consumerEngine+"/") {
		return 0, false
	}
	room := strings.TrimPrefix(strings.TrimPrefix(path, consumerEngine), "/")
	for i, layer := range engineLayers {
		if slices.Contains(layer, room) {
			return i, true
		}
	}
	return 0, false
}

// TestEngineRoomsImportOnlyLowerLayers: no room of the engine imports a
// room of its own layer or one above it (engineLayers), so the rooms stay
// a stack a reader can walk down.
func TestEngineRoomsImportOnlyLowerLayers(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	checked := 0
	for path, p := range g {
		from, ok := layerOf(path)
		if !ok {
			continue
		}
		for _, imp := range p.Imports {
			to, ok := layerOf(imp)
			if !ok {
				continue
			}
			checked++
			if to <= from {
				t.Errorf("%s (layer %d) imports %s (layer %d); a room imports only rooms below it (engineLayers)", path, from, imp, to)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d imports between the engine's rooms checked; the graph or engineLayers is incomplete", checked)
	}
}

// TestEngineLayersNameRealRooms: every room engineLayers names is in the
// module, so a deleted or renamed room is taken out of the list.
func TestEngineLayersNameRealRooms(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	for _, layer := range engineLayers {
		for _, room := range layer {
			path := consumerEngine
			if room != "" {
				path += "/" + room
			}
			if _, ok := g[path]; !ok {
				t.Errorf("engineLayers names %s, which the module does not have: take it out", path)
			}
		}
	}
}
