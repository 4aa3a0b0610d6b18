package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// wallClock are the time package's functions that read or wait on the
// wall clock. The engine takes its time from its archetype's clock
// (internal/deliver/base), so that a test drives it with a fake one.
var wallClock = map[string]bool{
	"Now": true, "Sleep": true, "After": true, "NewTimer": true, "NewTicker": true,
	"Since": true, "Until": true, "AfterFunc": true, "Tick": true,
}

// clockRooms are the directories, from the module's root, whose non-test
// files may not use wallClock: the engine, the migration beside it and
// the consumer that makes its archetype. Test kits (a directory whose
// name ends in "test", such as migrate/migratetest) poll real servers and
// are not the engine.
var clockRooms = []string{"internal/deliver", "internal/migrate", "consumer"}

// wallClockUses returns "file:line: time.Name" for every use of
// wallClock (called or passed as a value) in the non-test Go files under
// the module's dirs, parsed with go/parser; the time package is followed
// under whatever name a file imports it.
func wallClockUses(t *testing.T, root string, dirs []string) []string {
	t.Helper()
	var uses []string
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != filepath.Join(root, dir) && strings.HasSuffix(d.Name(), "test") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			name := timeImport(f)
			if name == "" {
				return nil
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == name && wallClock[sel.Sel.Name] {
					pos := fset.Position(sel.Pos())
					rel, _ := filepath.Rel(root, pos.Filename)
					uses = append(uses, filepath.ToSlash(rel)+":"+strconv.Itoa(pos.Line)+": time."+sel.Sel.Name)
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", dir, err)
		}
	}
	return uses
}

// timeImport returns the name f knows the time package by ("" when f
// does not import it, or imports it blank or dotted).
func timeImport(f *ast.File) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p != "time" {
			continue
		}
		if imp.Name == nil {
			return "time"
		}
		if imp.Name.Name == "_" || imp.Name.Name == "." {
			return ""
		}
		return imp.Name.Name
	}
	return ""
}

// TestEngineTimeComesFromTheArchetype fails on every wall-clock call of
// the time package in the engine's non-test files: its time is the
// archetype's clock alone (base.Archetype.Clock: clock.Now(),
// clock.After(d), clock.NewTimer(d), clock.Since(t)), a fake one in
// tests.
func TestEngineTimeComesFromTheArchetype(t *testing.T) {
	t.Parallel()
	uses := wallClockUses(t, "../..", clockRooms)
	for _, u := range uses {
		t.Errorf("%s: the engine takes its time from its archetype's clock (internal/deliver/base), not the time package's", u)
	}
}

// The check finds what it looks for, under the import's own name,
// called or not, and nothing in test files: it would pass vacuously
// otherwise.
func TestWallClockUsesFindsThem(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(path, src string) {
		t.Helper()
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("eng/a.go", "package eng\n\nimport \"time\"\n\nfunc a() time.Time { return time.Now() }\n")
	write("eng/b.go", "package eng\n\nimport stdtime \"time\"\n\nvar now = stdtime.Now\n\nfunc b() { <-stdtime.After(stdtime.Second) }\n")
	write("eng/c.go", "package eng\n\nimport \"time\"\n\nfunc c(t time.Time) time.Duration { return t.Sub(t) + time.Second }\n")
	write("eng/a_test.go", "package eng\n\nimport \"time\"\n\nfunc d() { time.Sleep(0) }\n")
	write("eng/kittest/k.go", "package kittest\n\nimport \"time\"\n\nfunc k() { time.Sleep(0) }\n")
	got := wallClockUses(t, root, []string{"eng"})
	want := []string{"eng/a.go:5: time.Now", "eng/b.go:5: time.Now", "eng/b.go:7: time.After"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("wallClockUses = %q, want %q", got, want)
	}
}
