package reader_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// BenchmarkCursor reads, by a cursor of one category, the 200 events of
// that category among 20,000 over 100 categories, interleaved (the
// design's E5 without the partition in the subject), and by a cursor of
// every event the whole 20,000, and by a cursor of a category with none
// (what a cursor's end costs: ShortReads direct gets and a leader's
// message get; with ShortReads 1, one direct get and the leader's): wall
// time per run, and the process's CPU (server and
// client together, getrusage) per event read.
func BenchmarkCursor(b *testing.B) {
	bus := setup(b, true)
	ctx := b.Context()
	acks := make([]jetstream.PubAckFuture, 0, 20_000)
	for k := range 20_000 {
		f, err := bus.js.PublishAsync(wire.Subject(wire.DefaultEventsPrefix, fmt.Sprintf("m%d-%d", k%100, k/100%2), "Happened"),
			[]byte(`{"amount":1250,"currency":"EUR","customer":"c-1024","lines":[{"sku":"a-1","qty":2}]}`))
		require.NoError(b, err)
		acks = append(acks, f)
	}
	select {
	case <-bus.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged")
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name       string
		filter     string
		want       int
		shortReads int
	}{
		{"one-category", "events.m7.>", 200, 0}, {"every-event", "events.>", 20_000, 0},
		{"nothing", "events.none.>", 0, 0}, {"nothing-leader-at-once", "events.none.>", 0, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			var cpu time.Duration
			for b.Loop() {
				before := cpuTime()
				cur, err := reader.NewCursor(bus.js, reader.Config{ShortReads: c.shortReads}, []string{c.filter}, 1, 20_000)
				require.NoError(b, err)
				n := 0
				for {
					_, err := cur.Next(ctx)
					if errors.Is(err, reader.ErrCaughtUp) {
						break
					}
					require.NoError(b, err)
					n++
				}
				require.Equal(b, c.want, n)
				cpu += cpuTime() - before
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(max(c.want, 1)), "cpu-ns/event")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
