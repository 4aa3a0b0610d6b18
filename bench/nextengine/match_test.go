package nextengine

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server/gsl"
)

// BenchmarkMemberMatch is the dispatcher's first step in the design: which
// of the subscriptions sharing a partition's reader take an event. Eleven
// thousand subscriptions, each with its own category filter as the "many"
// bench gives them (events.m<i>.>), plus a thousand that share one filter,
// in nats-server's generic sublist; one match per event, on the logical
// four-token subject.
func BenchmarkMemberMatch(b *testing.B) {
	sl := gsl.NewSublist[int]()
	for i := range 11_000 {
		if err := sl.Insert(fmt.Sprintf("events.m%d.>", i), i); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 1_000 {
		if err := sl.Insert("events.shared.>", 11_000+i); err != nil {
			b.Fatal(err)
		}
	}
	subjects := make([]string, 1024)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("events.m%d.m%d-%d.Pinged", i*7%11_000, i, i)
	}
	b.Run("one subscription takes it", func(b *testing.B) {
		n := 0
		for i := 0; b.Loop(); i++ {
			sl.Match(subjects[i%len(subjects)], func(int) { n++ })
		}
		if n == 0 {
			b.Fatal("no match")
		}
	})
	b.Run("a thousand take it", func(b *testing.B) {
		n := 0
		for b.Loop() {
			sl.Match("events.shared.shared-1.Pinged", func(int) { n++ })
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/match")
	})
}
