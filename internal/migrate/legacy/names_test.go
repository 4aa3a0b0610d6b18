package legacy_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// The old layout's names are spelled as the durables engine wrote them
// (moved here from wire with its tests).
func TestOldLayoutNames(t *testing.T) {
	t.Parallel()
	if got := legacy.CopyStream("EVENTS"); got != "EVENTS_ORDERED" {
		t.Errorf("CopyStream = %q", got)
	}
	src := legacy.CopySource("EVENTS", "events", 16)
	if src.Name != "EVENTS" || len(src.SubjectTransforms) != 1 {
		t.Fatalf("CopySource = %+v", src)
	}
	if tr := src.SubjectTransforms[0]; tr.Source != "events.*.*.*" || tr.Destination != "ordered.events.{{partition(16,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}" {
		t.Errorf("CopySource's transform = %q → %q", tr.Source, tr.Destination)
	}
	if got := legacy.PartitionFilter("events", 3); got != "ordered.events.3.>" {
		t.Errorf("PartitionFilter = %q", got)
	}
	if got := legacy.EventsSubject("events", "ordered.events.12.order.order-1.OrderPlaced"); got != "events.order.order-1.OrderPlaced" {
		t.Errorf("EventsSubject = %q", got)
	}
	for _, s := range []string{"events.order.order-1.OrderPlaced", "ordered.events", "ordered.other.1.a.b.c"} {
		if got := legacy.EventsSubject("events", s); got != s {
			t.Errorf("EventsSubject(%q) = %q, want it unchanged", s, got)
		}
	}
	if got := legacy.PartitionDurable("billing", 4); got != "billing_p4" {
		t.Errorf("PartitionDurable = %q", got)
	}
	if sub, p, ok := legacy.ParsePartitionDurable(legacy.PartitionDurable("billing_p2", 11)); !ok || sub != "billing_p2" || p != 11 {
		t.Errorf("ParsePartitionDurable(PartitionDurable) = %q, %d, %v", sub, p, ok)
	}
	for _, bad := range []string{"billing", "_p1", "billing_p", "billing_p01", "billing_p-1", "billing_px"} {
		if _, _, ok := legacy.ParsePartitionDurable(bad); ok {
			t.Errorf("ParsePartitionDurable(%q) ok, want not a partition consumer", bad)
		}
	}
	for got, want := range map[string]string{
		legacy.DeliveredKey("billing", 3):                                                "delivered.billing.3",
		legacy.AsideKey("billing", 3, "ordered.events.3.a"):                              "aside.billing.3.6f7264657265642e6576656e74732e332e61",
		legacy.ParkedKey("billing", "events.a"):                                          "billing.6576656e74732e61",
		legacy.AttemptsKey("billing", "id-1"):                                            "attempts.billing.69642d31",
		legacy.LeaseKey("billing", 3):                                                    "lease.billing.3",
		legacy.MemberKey("billing", "host-1"):                                            "member.billing.host-1",
		legacy.EventsPrefix(jetstream.StreamConfig{}):                                    wire.DefaultEventsPrefix,
		legacy.EventsPrefix(jetstream.StreamConfig{Subjects: []string{"acme.events.>"}}): "acme.events",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

// The names wire still has for the shared engine's users (the park
// bucket, the copy's name) are the same as the old layout's, as the event
// package's meta keys are checked against wire's header names: each is
// spelled twice on purpose.
func TestOldLayoutNamesAgreeWithWire(t *testing.T) {
	t.Parallel()
	for got, want := range map[string]string{
		legacy.ParkBucket:           wire.DefaultParkBucket,
		legacy.CopyStream("EVENTS"): wire.OrderedStream("EVENTS"),
	} {
		if got != want {
			t.Errorf("legacy has %q, wire %q", got, want)
		}
	}
}

// OldLeaseKey and OldParkKey tell the old engine's keys from the shared
// engine's and from other subscriptions': the cleanup deletes exactly
// those.
func TestOldKeysAreToldApart(t *testing.T) {
	t.Parallel()
	for k, want := range map[string][2]bool{
		legacy.LeaseKey("s", 3):     {true, false},
		legacy.MemberKey("s", "r1"): {true, true},
		"lease.p3":                  {false, false},
		"member.r1":                 {false, false},
		"lease.s.x":                 {false, false},
		"lease-epoch":               {false, false},
		"other.s.1":                 {false, false},
	} {
		if old, beat := legacy.OldLeaseKey(k); old != want[0] || beat != want[1] {
			t.Errorf("OldLeaseKey(%q) = %v, %v; want %v, %v", k, old, beat, want[0], want[1])
		}
	}
	for k, want := range map[string]bool{
		legacy.ParkedKey("s", "events.a"):        true,
		legacy.DeliveredKey("s", 0):              true,
		legacy.AsideKey("s", 0, "ordered.e.0.a"): true,
		legacy.AttemptsKey("s", "id"):            true,
		wire.SkippedKey("s", "events.a"):         true,
		legacy.ParkedKey("s2", "events.a"):       false,
		legacy.DeliveredKey("s2", 0):             false,
		wire.EpochKey:                            false,
		"delivered.s.":                           false,
	} {
		if got := legacy.OldParkKey(k, "s"); got != want {
			t.Errorf("OldParkKey(%q, s) = %v, want %v", k, got, want)
		}
	}
}

// A park entry's key is a valid KV key whatever the stream key holds
// (escaped tokens hold '%').
func TestParkedKeyIsAValidKVKey(t *testing.T) {
	t.Parallel()
	k := legacy.ParkedKey("sub", "ordered.events.3.order.order%2042")
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '/' || c == '=') {
			t.Fatalf("ParkedKey %q has %q, not a KV key character", k, c)
		}
	}
}
