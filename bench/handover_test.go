package main

import (
	"strings"
	"testing"
	"time"
)

// The hand-over row is measured against the lease TTL, which is what
// moves a dead replica's partitions on the shared engine (AckWait plays
// no part): under 2 TTLs is met, 2 TTLs or more is not, and the row
// says so in its reference and target.
func TestHandoverRowIsInLeaseTTLs(t *testing.T) {
	met := handoverResult{took: orderedLeaseTTL * 3 / 2, victims: 3}.row()
	if !met.Met || met.Ratio != "1.50" {
		t.Fatalf("1.5 TTLs: met %v, ratio %s; want met, 1.50", met.Met, met.Ratio)
	}
	if !strings.Contains(met.Reference, "lease TTL") || !strings.Contains(met.Target, "lease TTLs") || strings.Contains(met.Name+met.Target, "AckWait") {
		t.Fatalf("row %+v: want the reference and target in lease TTLs, no AckWait", met)
	}
	late := handoverResult{took: 2*orderedLeaseTTL + time.Millisecond, victims: 3}.row()
	if late.Met {
		t.Fatalf("over 2 TTLs (%s): met; want not met", late.Ours)
	}
	unmet := handoverResult{unmet: "nothing to hand over"}.row()
	if unmet.Met || unmet.Ratio != "—" {
		t.Fatalf("not measured: met %v, ratio %s; want not met, —", unmet.Met, unmet.Ratio)
	}
}
