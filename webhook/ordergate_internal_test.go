package webhook

import (
	"testing"

	"github.com/jsbridge/jsbridge/wire"
)

// TestDecideOrder is the gate's rule as a table: the stream's recorded
// position, whether the request holds the stream, the request, the mode.
func TestDecideOrder(t *testing.T) {
	t.Parallel()
	at := func(v int64, e uint64) OrderPosition { return OrderPosition{Version: v, Epoch: e, Partition: 0} }
	req := func(v int64, e uint64) orderRequest { return orderRequest{version: v, epoch: e} }
	for _, c := range []struct {
		name      string
		pos       OrderPosition
		held      bool
		req       orderRequest
		firstSeen bool
		want      string
	}{
		{"first version of a new stream", Unprocessed, true, req(0, 1), false, ""},
		{"new stream not at 0 (strict)", Unprocessed, true, req(3, 1), false, wire.OrderGap},
		{"new stream anywhere (first seen)", Unprocessed, true, req(3, 1), true, ""},
		{"new stream, first seen, held elsewhere", Unprocessed, false, req(3, 1), true, wire.OrderInProgress},
		{"next version", at(4, 7), true, req(5, 7), false, ""},
		{"next version, higher epoch", at(4, 7), true, req(5, 9), false, ""},
		{"next version held elsewhere", at(4, 7), false, req(5, 7), false, wire.OrderInProgress},
		{"gap", at(4, 7), true, req(6, 7), false, wire.OrderGap},
		{"predecessor being processed", at(4, 7), false, req(6, 7), false, wire.OrderGap},
		{"duplicate", at(4, 7), true, req(4, 7), false, wire.OrderDuplicate},
		{"older duplicate, held elsewhere", at(4, 7), false, req(2, 7), false, wire.OrderDuplicate},
		{"duplicate from a newer owner", at(4, 7), true, req(3, 9), false, wire.OrderDuplicate},
		{"stale epoch, next version", at(4, 7), true, req(5, 6), false, wire.OrderStaleEpoch},
		{"stale epoch, duplicate version", at(4, 7), true, req(4, 6), false, wire.OrderStaleEpoch},
		{"stale epoch, gap", at(4, 7), false, req(9, 6), true, wire.OrderStaleEpoch},
	} {
		if got := decideOrder(c.pos, c.held, c.req, c.firstSeen); got != c.want {
			t.Errorf("%s: decideOrder(%+v, held %v, %+v, firstSeen %v) = %q, want %q", c.name, c.pos, c.held, c.req, c.firstSeen, got, c.want)
		}
	}
}
