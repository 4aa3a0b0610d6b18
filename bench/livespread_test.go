package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The rows' spread puts at most 2 % of events on the hottest stream
// (issue 33), by its law and by a draw of 200,000 events, and is skewed:
// the hundred hottest of 10,000 streams get over 10 %.
func TestLiveSpreadHottestStreamAtMostTwoPercent(t *testing.T) {
	sp := newLiveSpread(10_000, liveZipfExponent, 1)
	if got := sp.share(0); got > 0.02 || got < 0.01 {
		t.Fatalf("hottest stream's share = %.4f, want in [0.01, 0.02]", got)
	}
	var top100 float64
	for k := range 100 {
		top100 += sp.share(k)
	}
	if top100 < 0.10 {
		t.Fatalf("the hundred hottest streams' share = %.3f, want over 0.10 (skewed)", top100)
	}
	ranks := make([]int, 200_000)
	for i := range ranks {
		ranks[i] = sp.next()
		if ranks[i] < 0 || ranks[i] >= 10_000 {
			t.Fatalf("draw %d = %d, out of [0, 10000)", i, ranks[i])
		}
	}
	share, hot := hottestShare(ranks)
	if hot != 0 || share > 0.02 || math.Abs(share-sp.share(0)) > 0.002 {
		t.Fatalf("drawn hottest: stream %d with %.4f, want stream 0 near %.4f and ≤ 0.02", hot, share, sp.share(0))
	}
}

func TestLiveSpreadUniformWithExponentZero(t *testing.T) {
	sp := newLiveSpread(1000, 0, 1)
	if got := sp.share(7); got != 0.001 {
		t.Fatalf("uniform share = %v, want 0.001", got)
	}
	ranks := make([]int, 100_000)
	for i := range ranks {
		ranks[i] = sp.next()
	}
	if share, _ := hottestShare(ranks); share > 0.003 {
		t.Fatalf("uniform draw's hottest share = %.4f, want near 0.001", share)
	}
}

func TestHottestShare(t *testing.T) {
	if share, hot := hottestShare(nil); share != 0 || hot != -1 {
		t.Fatalf("hottestShare(nil) = %v, %d", share, hot)
	}
	if share, hot := hottestShare([]int{3, 1, 3, 2}); share != 0.5 || hot != 3 {
		t.Fatalf("hottestShare = %v, %d; want 0.5, 3", share, hot)
	}
}

// A structured webhook's envelope carries the data compacted: the
// intended time reads back from it too.
func TestLiveIntendedCompacted(t *testing.T) {
	at := time.UnixMicro(1_764_331_200_123_456)
	compact := strings.Replace(string(liveData(at)), `{"t": `, `{"t":`, 1)
	if got, ok := liveIntended([]byte(compact)); !ok || !got.Equal(at) {
		t.Fatalf("liveIntended(compacted) = %v, %v", got, ok)
	}
}
