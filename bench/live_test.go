package main

import (
	"testing"
	"time"
)

// A live event's data is liveDataSize bytes as jsonb prints it (shorter
// keys first) and gives back its intended time; the warm-up's data names
// none.
func TestLiveDataCarriesTheIntendedTime(t *testing.T) {
	at := time.UnixMicro(1_764_331_200_123_456)
	d := liveData(at)
	if len(d) != liveDataSize {
		t.Fatalf("liveData is %d bytes, want %d", len(d), liveDataSize)
	}
	got, ok := liveIntended(d)
	if !ok || !got.Equal(at) {
		t.Fatalf("liveIntended(%.40s…) = %v, %v; want %v", d, got, ok, at)
	}
	if _, ok := liveIntended(payload); ok {
		t.Fatal("the warm-up's data names an intended time")
	}
}

func TestLiveRatesRejectsBadRates(t *testing.T) {
	if got, err := liveRates("100, 1000"); err != nil || len(got) != 2 || got[0] != 100 || got[1] != 1000 {
		t.Fatalf("liveRates(\"100, 1000\") = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "x", "100,-1"} {
		if _, err := liveRates(bad); err == nil {
			t.Errorf("liveRates(%q): no error", bad)
		}
	}
}
