package fanout

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// nopPosition is a Position that writes nothing (the benchmark's: the
// dispatch's own cost, not the bucket's).
type nopPosition struct{}

func (nopPosition) Record() position.Record                            { return position.Record{} }
func (nopPosition) Cursors() map[string]position.Cursor                { return nil }
func (nopPosition) Settled(string, string, position.Entry)             {}
func (nopPosition) Wait(context.Context, string, string, uint64) error { return nil }
func (nopPosition) Edit(fn func(*position.Record)) {
	fn(&position.Record{Members: map[string]uint64{}})
}
func (nopPosition) EditCursor(string, func(*position.Cursor)) bool { return true }
func (nopPosition) Detach(string, string) bool                     { return true }
func (nopPosition) StartCursor(string, string, uint64) bool        { return true }
func (nopPosition) Rejoin(string) bool                             { return true }
func (nopPosition) Drop(string) bool                               { return false }
func (nopPosition) Flush(context.Context) error                    { return nil }

// counter is a Sender that answers at once and counts.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) Attempt(context.Context, Delivery) Settlement {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return Settlement{Act: Delivered}
}

// cpuTime is the process's CPU time so far (user and system): on a
// shared machine, what the benchmark spent rather than what it waited.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDispatch is the cost of one (event, matching subscription):
// the match, the record's check, the push to a lane or a send, the send
// (an answer at once) and the settlement's bookkeeping, with 100
// subscriptions sharing a filter beside 10,000 of their own categories,
// 64 streams, every 256 events settled before the next (so that what is
// in hand stays what a subscription may hold). ns/delivery is wall time,
// cpu-ns/delivery the process's CPU time (the sends run beside the
// dispatch on other cores). The design's target: 2 µs.
func BenchmarkDispatch(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		b.Run(fmt.Sprintf("ordered=%t", ordered), func(b *testing.B) {
			idx := member.NewIndex()
			for i := range 10_000 {
				if err := idx.Put(member.Member{Name: fmt.Sprintf("c%d", i), Filters: []string{fmt.Sprintf("events.m%d.>", i)}}); err != nil {
					b.Fatal(err)
				}
			}
			const subs = 100
			for i := range subs {
				if err := idx.Put(member.Member{Name: fmt.Sprintf("s%d", i), Filters: []string{"events.order.>"}, Ordered: ordered, MaxInFlight: 64, MaxInHand: 1 << 30}); err != nil {
					b.Fatal(err)
				}
			}
			send := &counter{}
			f := New(Config{}, idx, nopPosition{}, send, nil, nil)
			evs := events(1, 4096, 64)
			seq := uint64(0)
			settle := func() { // every send settled
				for f.Floor() < seq {
					time.Sleep(20 * time.Microsecond)
				}
			}
			runtime.GC() // the index's garbage is not the dispatch's
			start, cpu := time.Now(), cpuTime()
			for b.Loop() {
				seq++
				e := evs[seq%uint64(len(evs))]
				e.Seq = seq
				f.Dispatch(e)
				if seq%256 == 0 { // in hand stays below 256 a subscription
					settle()
				}
			}
			settle()
			n := float64(seq * subs)
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/n, "ns/delivery")
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/n, "cpu-ns/delivery")
			f.Close()
			send.mu.Lock()
			defer send.mu.Unlock()
			if send.n != int(seq)*subs {
				b.Fatalf("%d sends for %d events × %d subscriptions", send.n, seq, subs)
			}
		})
	}
}

// BenchmarkCatchUpIdle is the replica's dispatch loop's round of the
// cursors before each live event (shared's loop.next calls CatchUp on
// every partition it owns) when no subscription is behind, no stream set
// aside and no event to fetch again: 16 partitions, per event.
func BenchmarkCatchUpIdle(b *testing.B) {
	idx := member.NewIndex()
	for _, m := range []member.Member{{Name: "ordered", Filters: []string{"events.>"}, Ordered: true, MaxInFlight: 64},
		{Name: "unordered", Filters: []string{"events.>"}, MaxInFlight: 64}} {
		if err := idx.Put(m); err != nil {
			b.Fatal(err)
		}
	}
	fans := make([]*Partition, 16)
	for i := range fans {
		fans[i] = New(Config{Partition: i}, idx, nopPosition{}, &counter{}, nil, nil)
		b.Cleanup(fans[i].Close)
	}
	ctx := context.Background()
	for b.Loop() {
		for _, f := range fans {
			if n, err := f.CatchUp(ctx); n != 0 || err != nil {
				b.Fatalf("CatchUp: %d behind, %v", n, err)
			}
		}
	}
}
