package fanout

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
)

// deepSender is a Sender whose attempts use stackKB of stack, as an
// attempt's way to its POST does (the body, the header map, the HTTP
// client: 8 KB and more), and answer at once.
type deepSender struct {
	counter
	stackKB int
}

func (d *deepSender) Attempt(ctx context.Context, dl Delivery) Settlement {
	if useStack(d.stackKB) == 255 {
		runtime.Gosched() // never: keeps the frames from being optimised out
	}
	return d.counter.Attempt(ctx, dl)
}

// useStack uses kb KB of stack, one KB a frame.
//
//go:noinline
func useStack(kb int) byte {
	var buf [1024]byte
	buf[kb%1024] = byte(kb)
	if kb <= 1 {
		return buf[0]
	}
	return useStack(kb-1) + buf[kb%1024]
}

// BenchmarkSendStack is the fan-out's cost of one (event, subscription)
// whose attempt needs 8 KB of stack: the live pipeline row's shape, one
// ordered and one unordered subscription of every event over 64
// streams, settled every 256 events. cpu-ns/delivery is the process's
// CPU time, the stack growth of each run's goroutine included
// (runtime.newstack; issue 33 tried workers that keep their stacks, and
// gained nothing here, then growStack: docs/performance.md).
func BenchmarkSendStack(b *testing.B) {
	idx := member.NewIndex()
	for _, m := range []member.Member{{Name: "ordered", Filters: []string{"events.>"}, Ordered: true, MaxInFlight: 64, MaxInHand: 1 << 30},
		{Name: "unordered", Filters: []string{"events.>"}, MaxInFlight: 64, MaxInHand: 1 << 30}} {
		if err := idx.Put(m); err != nil {
			b.Fatal(err)
		}
	}
	for _, kb := range []int{1, 8} {
		b.Run(fmt.Sprintf("stack=%dKB", kb), func(b *testing.B) {
			send := &deepSender{stackKB: kb}
			f := New(Config{}, idx, nopPosition{}, send, nil, nil)
			evs := events(1, 4096, 64)
			seq := uint64(0)
			settle := func() {
				for f.Floor() < seq {
					time.Sleep(20 * time.Microsecond)
				}
			}
			start, cpu := time.Now(), cpuTime()
			for b.Loop() {
				seq++
				e := evs[seq%uint64(len(evs))]
				e.Seq = seq
				f.Dispatch(e)
				if seq%256 == 0 {
					settle()
				}
			}
			settle()
			n := float64(seq * 2)
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/n, "ns/delivery")
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/n, "cpu-ns/delivery")
			f.Close()
		})
	}
}
