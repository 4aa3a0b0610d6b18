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
	// req is a request of a sender before the chain (partition and epoch
	// only); chain one of the version chain from a partition's owner, and
	// replay one from a replay path (no partition, no epoch).
	req := func(v int64, e uint64) orderRequest {
		return orderRequest{version: v, epoch: e, owner: true, previous: -1}
	}
	chain := func(v, p int64, e uint64) orderRequest {
		return orderRequest{version: v, previous: p, hasPrevious: true, epoch: e, owner: true}
	}
	replay := func(v, p int64) orderRequest {
		return orderRequest{version: v, previous: p, hasPrevious: true, partition: -1}
	}
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

		{"chain: first version of a new stream", Unprocessed, true, chain(0, -1, 1), false, ""},
		{"chain: start new, first request at v40", Unprocessed, true, chain(40, -1, 1), false, ""},
		{"chain: new stream, predecessor unknown", Unprocessed, true, chain(40, 39, 1), false, wire.OrderGap},
		{"chain: first seen starts anywhere", Unprocessed, true, chain(40, 39, 1), true, ""},
		{"chain: next", at(4, 7), true, chain(5, 4, 7), false, ""},
		{"chain: filtered, next match after a hole", at(3, 7), true, chain(7, 3, 7), false, ""},
		{"chain: filtered, held elsewhere", at(3, 7), false, chain(7, 3, 7), false, wire.OrderInProgress},
		{"chain: predecessor ahead", at(3, 7), true, chain(9, 7, 7), false, wire.OrderGap},
		{"chain: predecessor behind, version ahead", at(5, 7), true, chain(7, 3, 7), false, wire.OrderGap},
		{"chain: predecessor none, stream processed", at(5, 7), true, chain(7, -1, 7), false, wire.OrderGap},
		{"chain: skip carries the skipped head's predecessor", at(4, 7), true, chain(6, 4, 7), false, ""},
		{"chain: duplicate", at(5, 7), true, chain(5, 4, 7), false, wire.OrderDuplicate},
		{"chain: stale epoch", at(5, 7), true, chain(6, 5, 6), false, wire.OrderStaleEpoch},
		{"replay: next, lower epoch not compared", at(5, 7), true, replay(6, 5), false, ""},
		{"replay: wrong predecessor", at(5, 7), true, replay(7, 6), false, wire.OrderGap},
		{"replay: duplicate", at(5, 7), true, replay(5, 4), false, wire.OrderDuplicate},
		{"replay: new stream", Unprocessed, true, replay(0, -1), false, ""},
	} {
		if got := decideOrder(c.pos, c.held, c.req, c.firstSeen); got != c.want {
			t.Errorf("%s: decideOrder(%+v, held %v, %+v, firstSeen %v) = %q, want %q", c.name, c.pos, c.held, c.req, c.firstSeen, got, c.want)
		}
	}
}
