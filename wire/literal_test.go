package wire_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/jsbridge/jsbridge/wire"
)

// spelledContract says which part of the bus contract a string literal
// spells again, or "" when it spells none: a subject under one of the
// default prefixes ("events.", "dlq.", "attempts."), a default stream name
// ("EVENTS", "DLQ", "JSBRIDGE_ATTEMPTS"), or one of our header names (ce-*,
// Nats-*, Jsbridge-*, Idempotency-Key, traceparent, tracestate; ce-*,
// Idempotency-Key and the trace headers in any case, as HTTP matches
// them, Nats-* and Jsbridge-* as written, as NATS does). Prose that merely
// mentions a subject mid-sentence does not start with it and passes.
func spelledContract(s string) string {
	for _, p := range []string{wire.DefaultEventsPrefix + ".", wire.DefaultDLQPrefix + ".", wire.DefaultAttemptsPrefix + "."} {
		if strings.HasPrefix(s, p) {
			return "subject prefix " + strconv.Quote(p)
		}
	}
	if s == wire.DefaultEventsStream || s == wire.DefaultDLQStream || s == wire.DefaultAttemptsStream {
		return "stream name " + strconv.Quote(s)
	}
	header := len(s) > 0 && !strings.ContainsAny(s, " \t:")
	if header && wire.IsCEHeader(s) {
		return "header name " + strconv.Quote(s)
	}
	// NATS matches header names exactly, so only the canonical case is ours
	// (Jsbridge-* covers the dead letters' Jsbridge-Dlq-* and the webhooks'
	// Jsbridge-Replica)
	// ("nats-port" is a flag, not a header).
	for _, p := range []string{wire.HeaderPrefixNATS, "Jsbridge-"} {
		if header && len(s) > len(p) && strings.HasPrefix(s, p) {
			return "header name " + strconv.Quote(s)
		}
	}
	if strings.EqualFold(s, wire.HeaderIdempotencyKey) || strings.EqualFold(s, wire.HeaderTraceParent) || strings.EqualFold(s, wire.HeaderTraceState) {
		return "header name " + strconv.Quote(s)
	}
	return ""
}

// literalProblems parses one Go file and reports every string literal that
// spells the contract: ordinary literals, and the default:"..." of struct
// tags (flag defaults take ${events_stream} and friends from wire).
func literalProblems(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	report := func(pos token.Pos, what, lit string) {
		out = append(out, fset.Position(pos).String()+": "+lit+" spells the "+what+"; use package wire")
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			if n.Tag != nil {
				tag, err := strconv.Unquote(n.Tag.Value)
				if err == nil {
					if what := spelledContract(reflect.StructTag(tag).Get("default")); what != "" {
						report(n.Tag.Pos(), what, "tag default")
					}
				}
				// The tag is done; its type and names hold no literals.
				ast.Inspect(n.Type, func(m ast.Node) bool { return m != n.Tag })
				return false
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			if what := spelledContract(s); what != "" {
				report(n.Pos(), what, n.Value)
			}
		}
		return true
	})
	return out, nil
}

// TestContractSpelledOnce walks the module's non-test Go files outside
// wire and fails on every literal that spells a subject prefix, a stream
// name or one of our header names: the contract has one home.
func TestContractSpelledOnce(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			base := d.Name()
			if path != root && (strings.HasPrefix(base, ".") || base == "testdata" || base == "vendor" || path == filepath.Join(root, "wire")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}

		files++
		probs, err := literalProblems(fset, path, nil)
		if err != nil {
			return err
		}
		for _, p := range probs {
			if path == filepath.Join(root, "event", "event.go") && (strings.Contains(p, strconv.Quote(wire.HeaderTraceParent)) || strings.Contains(p, strconv.Quote(wire.HeaderTraceState))) {
				// event depends on nothing, so it spells its meta keys
				// itself; its test checks they equal the header names.
				continue
			}
			t.Error(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have seen the module, or the test would pass vacuously.
	if files < 50 {
		t.Fatalf("walked %d non-test Go files under %s; expected the whole module", files, root)
	}
}

// TestContractCheckCatches proves the check can fail: each spelling it
// exists to catch is reported, and what must stay is not.
func TestContractCheckCatches(t *testing.T) {
	t.Parallel()
	src := `package p

type cli struct {
	Stream string ` + "`default:\"EVENTS\" help:\"events.x\"`" + `
	Prefix string ` + "`default:\"${events_prefix}\"`" + `
}

var (
	a = "events.>"
	b = "dlq." + "x"
	c = "ce-id"
	d = "Nats-Msg-Id"
	e = "Jsbridge-Dlq-Reason"
	e2 = "Jsbridge-Replica"
	f = "idempotency-key"
	g = "DLQ"
	h = ` + "`Ce-Type`" + `
	i = "Traceparent"
	j = "tracestate"
	k = "attempts.x.1"
	l = "JSBRIDGE_ATTEMPTS"
	ok1 = "list events.order.> of a stream"
	ok2 = "events"
	ok3 = "message has no Nats-Msg-Id or ce-id"
	ok4 = "dlq replay: done"
	ok5 = "nats-port"
	ok6 = "attempts"
)
`
	probs, err := literalProblems(token.NewFileSet(), "p.go", src)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`tag default`, `"events.>"`, `"dlq."`, `"ce-id"`, `"Nats-Msg-Id"`, `"Jsbridge-Dlq-Reason"`, `"Jsbridge-Replica"`, `"idempotency-key"`, `"DLQ"`, "`Ce-Type`", `"Traceparent"`, `"tracestate"`, `"attempts."`, `"JSBRIDGE_ATTEMPTS"`}
	if len(probs) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(probs), len(want), strings.Join(probs, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(probs[i], w) {
			t.Errorf("problem %d = %q, want it to name %s", i, probs[i], w)
		}
	}
}
