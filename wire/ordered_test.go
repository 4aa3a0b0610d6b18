package wire_test

import (
	"testing"

	"github.com/jsbridge/jsbridge/wire"
)

func TestOrderedNames(t *testing.T) {
	t.Parallel()
	if got := wire.OrderedStream("EVENTS"); got != "EVENTS_ORDERED" {
		t.Errorf("OrderedStream = %q", got)
	}
	if got := wire.SourceSequence("EVENTS 1234 > >"); got != 1234 {
		t.Errorf("SourceSequence = %d", got)
	}
	if got := wire.SourceSequence("EVENTS"); got != 0 {
		t.Errorf("SourceSequence of a short value = %d", got)
	}
}

// Partition is fnv32a of the escaped stream token modulo the count: the
// same numbers as nats-server's {{partition(n,i)}} (deliver's tests check
// them against a server).
func TestPartitionIsFNV32aOfTheStreamToken(t *testing.T) {
	t.Parallel()
	// fnv32a("") = 0x811c9dc5, fnv32a("a") = 0xe40c292c.
	if got, want := wire.Partition("", 1000), int(uint32(0x811c9dc5)%1000); got != want {
		t.Errorf("Partition(\"\") = %d, want %d", got, want)
	}
	if got, want := wire.Partition("a", 7), int(uint32(0xe40c292c)%7); got != want {
		t.Errorf("Partition(\"a\") = %d, want %d", got, want)
	}
	if wire.StreamPartition("order 1", 16) != wire.Partition(wire.EscapeToken("order 1"), 16) {
		t.Error("StreamPartition does not hash the escaped token")
	}
	if wire.Partition("x", 0) != 0 {
		t.Error("Partition with no partitions is not 0")
	}
}

// SubjectPartition finds the stream token of a stored subject (after a
// prefix of any number of tokens, escaped as Subject escapes it) and
// gives StreamPartition's number; a subject of another shape has none.
func TestSubjectPartitionIsTheStreamsPartition(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ prefix, stream, name string }{
		{"events", "order-42", "OrderPlaced"},
		{"events", "order 1.x", "Order.Placed"},
		{"acme.events", "user-7", "UserJoined"},
		{"events", "ünïcode-1", "Happened"},
	} {
		subject := wire.Subject(c.prefix, c.stream, c.name)
		for _, n := range []int{1, 7, 16} {
			p, ok := wire.SubjectPartition(c.prefix, subject, n)
			if want := wire.StreamPartition(c.stream, n); !ok || p != want {
				t.Errorf("SubjectPartition(%q, %q, %d) = %d, %v; want %d (StreamPartition of %q)", c.prefix, subject, n, p, ok, want, c.stream)
			}
		}
	}
	for _, c := range []struct{ prefix, subject string }{
		{"events", "events.order.order-42"},
		{"events", "events.order.order-42.A.B"},
		{"events", "events..order-42.A"},
		{"events", "events.order..A"},
		{"events", "events.order.order-42."},
		{"events", "eventsx.order.order-42.A"},
		{"events", "dlq.order.order-42.A"},
		{"acme.events", "acme.order.order-42.A"},
	} {
		if p, ok := wire.SubjectPartition(c.prefix, c.subject, 16); ok || p != 0 {
			t.Errorf("SubjectPartition(%q, %q) = %d, %v; want none", c.prefix, c.subject, p, ok)
		}
	}
}

func BenchmarkSubjectPartition(b *testing.B) {
	subject := wire.Subject("events", "order-42", "OrderPlaced")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := wire.SubjectPartition("events", subject, 16); !ok {
			b.Fatal("no partition")
		}
	}
}

// The order gate's refusals are retried in place; its duplicate answer and
// anything unknown are not.
func TestOrderRetryInPlace(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		wire.OrderGap: true, wire.OrderInProgress: true, wire.OrderStaleEpoch: true,
		wire.OrderDuplicate: false, "": false, "Gap": false,
	} {
		if got := wire.OrderRetryInPlace(v); got != want {
			t.Errorf("OrderRetryInPlace(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestPreviousVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v    int64
		text string
	}{{-1, "none"}, {0, "0"}, {41, "41"}} {
		if got := wire.FormatPreviousVersion(c.v); got != c.text {
			t.Errorf("FormatPreviousVersion(%d) = %q, want %q", c.v, got, c.text)
		}
		if got, err := wire.ParsePreviousVersion(c.text); err != nil || got != c.v {
			t.Errorf("ParsePreviousVersion(%q) = %d, %v; want %d", c.text, got, err, c.v)
		}
	}
	for _, bad := range []string{"", "None", "-1", "+3", " 3", "03", "x"} {
		if _, err := wire.ParsePreviousVersion(bad); err == nil {
			t.Errorf("ParsePreviousVersion(%q) succeeded, want an error", bad)
		}
	}
}
