package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// The many rows' throughput case (-many-throughput N, -many-webhooks W;
// issue 34: "delivery throughput with 1,000 subscriptions sharing one
// filter"): a consumer process delivers W webhooks to
// one subscription, then, from a fresh server, W webhooks to N
// subscriptions with that same filter (W/N events each), so both sides
// send the same number of POSTs. The events are a backlog in EVENTS
// before the consumer starts (256 B each, in one stream:
// manyThroughputStreams); the subscriptions start at the first event,
// ordering none, with their whole backlog in hand (MaxAckPending); the
// receiver is the live pipeline's (a process of its own: verifies each
// signature, answers 204 at once). The JetStream server is one node
// in a child process. Throughput and CPU are taken between the 10 % and
// the 90 % marks of the webhooks received (the receiver asked every
// 50 ms; the window opens only once every subscription has delivered),
// so the consumer's start and the last stragglers are left out:
// webhooks a second, and the CPU (user + system) of the consumer, the
// server and the receiver per webhook. The ratio is the CPU per webhook
// with one subscription ÷ with N (target ≥ 0.8: N subscriptions cost no
// more per webhook than the POST itself).

// manyThroughputInFlight is MaxInFlight of each of the N subscriptions;
// the single subscription keeps the default (64): both sides have
// enough POSTs in flight to be bound by CPU, not by the receiver's round
// trip, and about as many (64 against N).
const manyThroughputInFlight = 1

// manyThroughputStreams is the streams the backlog is spread over: one.
// The consumer sends up to MaxInFlight per subscription and
// partition: over the 16 partitions, 1,000 subscriptions at 1 were up
// to 16,000 POSTs at once to the one receiver, which did not answer
// them in time (the breakers of 993 of them opened, 2026-11-29); on one
// stream, and so one partition, both sides have about as many POSTs in
// flight.
const manyThroughputStreams = 1

// manyThroughputTimeout bounds one side's delivery of its webhooks.
const manyThroughputTimeout = 10 * time.Minute

// manyThroughputStall is how long no new webhook may arrive before the
// side is given up as stalled (events lost or held by the engine): its
// row says how many arrived, and the next case runs.
const manyThroughputStall = time.Minute

// throughputFigures are one side's measurements, in the window between
// the 10 % and the 90 % marks.
type throughputFigures struct {
	webhooks int // received in the window
	window   time.Duration
	// CPU (user + system) in the window.
	consumer, server, receiver time.Duration
	// delivering is from the consumer's start until every subscription's
	// first webhook; late is set when that came after 90 % (the window
	// then runs from there to the end).
	delivering time.Duration
	late       bool
	load       string // the 1-minute load average at the window's end
	// received of expected webhooks; fewer when the side stalled.
	received, expected int
}

// rate is the webhooks a second in the window.
func (f throughputFigures) rate() float64 {
	if f.window <= 0 {
		return 0
	}
	return float64(f.webhooks) / f.window.Seconds()
}

// per is d per webhook of the window, in µs.
func (f throughputFigures) per(d time.Duration) float64 {
	if f.webhooks == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(f.webhooks)
}

// String is the side's figures as a row prints them.
func (f throughputFigures) String() string {
	s := fmt.Sprintf("%.0f webhooks/s; CPU per webhook: consumer %.1f µs, server %.1f µs (receiver %.1f µs); load %s",
		f.rate(), f.per(f.consumer), f.per(f.server), f.per(f.receiver), f.load)
	if f.received < f.expected {
		s = fmt.Sprintf("only %d of %d webhooks received (none in the last %s); ", f.received, f.expected, manyThroughputStall) + s
	}
	if f.late {
		s += fmt.Sprintf("; every subscription delivering only after %s, past 90 %% (the window is the last 10 %%)", f.delivering.Round(100*time.Millisecond))
	}
	return s
}

// throughputRatios are the CPU per webhook with one subscription ÷ with
// many: the consumer's alone, and the consumer's and the server's
// together.
func throughputRatios(one, many throughputFigures) (consumer, withServer float64) {
	if many.per(many.consumer) == 0 || many.per(many.consumer+many.server) == 0 {
		return 0, 0
	}
	return one.per(one.consumer) / many.per(many.consumer), one.per(one.consumer+one.server) / many.per(many.consumer+many.server)
}

// manyThroughputRows runs the throughput case (none when
// -many-throughput is 0).
func (e *env) manyThroughputRows(ctx context.Context) ([]row, error) {
	n, w := e.cfg.ManyThroughput, e.cfg.ManyWebhooks
	if n == 0 {
		return nil, nil
	}
	fmt.Printf("bench: many: throughput, %d webhooks to 1 subscription (load %s)\n", w, loadAverage())
	one, err := e.manyThroughput(ctx, 1, w)
	if err != nil {
		return nil, fmt.Errorf("throughput, 1 subscription: %w", err)
	}
	fmt.Printf("bench: many: throughput, 1 subscription: %s\n", one)
	fmt.Printf("bench: many: throughput, %d webhooks to %d subscriptions (load %s)\n", w, n, loadAverage())
	many, err := e.manyThroughput(ctx, n, w)
	if err != nil {
		return nil, fmt.Errorf("throughput, %d subscriptions: %w", n, err)
	}
	fmt.Printf("bench: many: throughput, %d subscriptions: %s\n", n, many)
	cons, both := throughputRatios(one, many)
	return []row{{
		Name:      fmt.Sprintf("many subscriptions: throughput, %d sharing one filter against 1, %d webhooks each side, one server", n, w),
		Ours:      fmt.Sprintf("%d subscriptions: %s", n, many),
		Reference: "1 subscription: " + one.String(),
		Ratio:     fmt.Sprintf("%.2f (consumer + server %.2f)", cons, both),
		Target:    "≥ 0.8 (CPU per webhook with 1 ÷ with N, the consumer's and with the server's)",
		Met:       cons >= 0.8 && both >= 0.8 && one.received == one.expected && many.received == many.expected,
	}}, nil
}

// manyThroughput delivers webhooks webhooks to subs subscriptions sharing
// one filter (webhooks/subs events each) and returns the figures.
func (e *env) manyThroughput(ctx context.Context, subs, webhooks int) (throughputFigures, error) {
	var f throughputFigures
	events := webhooks / subs
	if events < 1 {
		return f, fmt.Errorf("%d webhooks for %d subscriptions: fewer than one event each", webhooks, subs)
	}
	total := events * subs
	dir, srvDir, err := manyTempDirs()
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	bus, err := e.startChildBus(ctx, srvDir, 1)
	if err != nil {
		return f, err
	}
	defer bus.stop(30 * time.Second)
	if _, err := publishAsyncTo(ctx, bus.js, backlog(events, min(events, manyThroughputStreams))); err != nil {
		return f, err
	}
	store, keyFile, err := manyBucket(ctx, dir, bus.js, 1)
	if err != nil {
		return f, err
	}
	secret, err := webhook.GenerateSecret()
	if err != nil {
		return f, err
	}
	recv, err := e.startLiveReceiver(ctx, secret, 0)
	if err != nil {
		return f, err
	}
	defer recv.p.Stop(10 * time.Second)
	inFlight := manyThroughputInFlight
	if subs == 1 {
		inFlight = consumer.DefaultMaxInFlight
	}
	// The whole backlog in hand: the consumer gives a subscription
	// holding MaxAckPending events a cursor, and a subscription catching
	// up through its cursor is not what this case measures (with the
	// default, 1,000, one subscription with 50,000 events in one stream
	// stopped at 42,039 and 26,935 of them, its partition's floor at
	// 50,000, 2026-11-29: docs/benchmarks.md).
	maxAckPending := max(events, consumer.DefaultMaxAckPending)
	if err := parallel(ctx, subs, 16, func(i int) error {
		name := fmt.Sprintf("t%05d", i)
		_, err := store.Create(ctx, consumer.Subscription{
			Name: name, FilterSubjects: []string{wire.CategoryFilter(wire.DefaultEventsPrefix, "bench")},
			URL: recv.hook(name), Secrets: []string{secret}, AllowPrivate: true, MaxInFlight: inFlight, MaxAckPending: maxAckPending,
			Ordering: consumer.OrderingNone, Start: consumer.Start{Policy: consumer.StartAll},
		}, false)
		return err
	}); err != nil {
		return f, err
	}

	args := manyConsumerArgs(bus.urls, keyFile, 1)
	ops := 0
	if e.cfg.ProfileDir != "" {
		if ops, err = proc.FreePort(); err != nil {
			return f, err
		}
		args = append(args, "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--pprof")
	}
	start := time.Now()
	p, err := e.procs.Start("consumer", e.cfg.Bin+"/consumer", args)
	if err != nil {
		return f, err
	}
	defer p.Stop(60 * time.Second)

	// The marks: the receiver asked every 50 ms; at each mark, the
	// processes' CPU.
	type mark struct {
		at                         time.Time
		got                        int
		consumer, server, receiver time.Duration
	}
	sample := func(got int) (mark, error) {
		m := mark{at: time.Now(), got: got}
		var err1, err2, err3 error
		m.consumer, err1 = processCPU(p.Pid())
		m.server, err2 = processCPU(bus.proc.Pid())
		m.receiver, err3 = processCPU(recv.p.Pid())
		return m, errors.Join(err1, err2, err3)
	}
	var marks []mark
	deadline := time.Now().Add(manyThroughputTimeout)
	got, reached := 0, 0
	f.expected = total
	last, lastAt := 0, time.Now()
	for got < total {
		if time.Now().After(deadline) {
			return f, fmt.Errorf("%d of %d webhooks received after %s (%d of %d subscriptions delivering)", got, total, manyThroughputTimeout, reached, subs)
		}
		if got > last {
			last, lastAt = got, time.Now()
		} else if time.Since(lastAt) > manyThroughputStall {
			fmt.Printf("bench: many: throughput: %d of %d webhooks received, none in the last %s: stalled\n", got, total, manyThroughputStall)
			break
		}
		if err := e.procs.AnyExited(); err != nil {
			return f, err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return f, err
		}
		if got, reached, err = recv.total(); err != nil {
			return f, err
		}
		if reached >= subs && f.delivering == 0 {
			f.delivering = time.Since(start)
		}
		// The window opens at 10 % once every subscription delivers
		// (at 90 % if they do not by then) and closes at 90 % (at the
		// end if it opened there).
		open := len(marks) == 0 && (got >= total/10 && reached >= subs || got >= total*9/10)
		if open || len(marks) == 1 && got >= total*9/10 {
			m, err := sample(got)
			if err != nil {
				return f, err
			}
			marks = append(marks, m)
			if open {
				f.late = reached < subs
				if ops != 0 {
					// The consumer's CPU profile (-profile-dir), from the
					// window's opening.
					e.profile(fmt.Sprintf("many-throughput-%d-consumer", subs), ops)
				}
			}
			continue
		}
	}
	f.received = got
	for len(marks) < 2 { // the last polls jumped past a mark, or it stalled
		m, err := sample(got)
		if err != nil {
			return f, err
		}
		marks = append(marks, m)
	}
	if n, err := recv.rejected(); err != nil || n > 0 {
		return f, fmt.Errorf("the receiver refused %d webhooks (%v)", n, err)
	}
	a, b := marks[0], marks[1]
	f.webhooks, f.window = b.got-a.got, b.at.Sub(a.at)
	f.consumer, f.server, f.receiver = b.consumer-a.consumer, b.server-a.server, b.receiver-a.receiver
	f.load = loadAverage()
	return f, nil
}
