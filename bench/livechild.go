package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/store"
)

// The live rows' child processes (live.go): the open-loop generator,
// which plays the application, and the bare reference bridge. Each runs in
// a process of its own so that its CPU is measured apart.

// liveWriters is how many connections the generator appends on: an append
// is a round trip and a durable commit (a WAL flush), so one connection
// could not hold 1,000 a second; sixteen give headroom for commit stalls.
const liveWriters = 16

// liveDataSize is the size of a live event's data as jsonb prints it.
const liveDataSize = 512

// liveData is a live event's data: its intended append time (Unix µs, the
// open-loop schedule's, not the append's: a stall of the generator or of
// Postgres shows as latency) and padding to liveDataSize bytes as jsonb
// prints it ({"t": …, "pad": "…"}).
func liveData(intended time.Time) []byte {
	head := fmt.Sprintf(`{"t": %d, "pad": "`, intended.UnixMicro())
	return []byte(head + strings.Repeat("x", max(liveDataSize-len(head)-len(`"}`), 0)) + `"}`)
}

// liveIntended reads back the intended time liveData wrote into data, as
// jsonb prints it or compacted (a structured webhook's envelope carries
// it so); ok is false for other data (the warm-up's events).
func liveIntended(data []byte) (time.Time, bool) {
	s, ok := strings.CutPrefix(string(data), `{"t":`)
	if !ok {
		return time.Time{}, false
	}
	s = strings.TrimLeft(s, " ")
	n, _, ok := strings.Cut(s, ",")
	us, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil {
		return time.Time{}, false
	}
	return time.UnixMicro(us), true
}

// liveStream is the name of the k-th of the live rows' streams.
func liveStream(k int) string { return fmt.Sprintf("live-%d", k) }

// liveGeneratorChild is the -live-generator-child mode. arg is "<database
// URL> <schema> <events/s> <duration> <streams> <out file> [<zipf
// exponent>]": it appends one event per transaction (store.Append, any
// version) to a stream drawn from liveSpread over streams (at least
// liveWriters; exponent 0 or absent: uniform), open loop (event i is due
// at start + i ÷ rate whatever became of the earlier ones; a late one
// goes at once), on liveWriters connections, for duration; then writes
// each event's id, stream rank and commit time (Unix µs, when its append
// returned) to "<out file>.commits", one line each, and the number of
// events appended and the largest lateness (µs) to the out file, and
// waits for SIGTERM with its sessions open (so that their backends' CPU
// can be read), closing them then. Rate 0 is the warm-up: one event on
// each stream, as fast as it goes, with data that names no intended
// time, and no commits file.
func liveGeneratorChild(ctx context.Context, arg string) error {
	f := strings.Fields(arg)
	if len(f) != 6 && len(f) != 7 {
		return fmt.Errorf("-live-generator-child %q: want \"<database URL> <schema> <events/s> <duration> <streams> <out file> [<zipf exponent>]\"", arg)
	}
	rate, err1 := strconv.Atoi(f[2])
	dur, err2 := time.ParseDuration(f[3])
	streams, err3 := strconv.Atoi(f[4])
	zipf := 0.0
	var err4 error
	if len(f) == 7 {
		zipf, err4 = strconv.ParseFloat(f[6], 64)
	}
	if err := errors.Join(err1, err2, err3, err4); err != nil || rate < 0 || streams < liveWriters || zipf < 0 {
		return fmt.Errorf("-live-generator-child %q: rate, duration, streams (at least %d) or zipf exponent (at least 0): %v", arg, liveWriters, err)
	}
	pcfg, err := pgxpool.ParseConfig(f[0])
	if err != nil {
		return err
	}
	pcfg.MaxConns = liveWriters
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := store.New(pool, store.WithSchema(f[1]))
	if err != nil {
		return err
	}
	total, period := int64(streams), time.Duration(0)
	if rate > 0 {
		total, period = int64(float64(rate)*dur.Seconds()), time.Second/time.Duration(rate)
	}
	// One dispatcher keeps the schedule and hands each event to the
	// writer of its stream: writer w appends to the streams k ≡ w (mod
	// liveWriters) alone, so two writers never append to one stream at
	// once, no append fails on the version race and leaves its id unused
	// (the bare reference reads ids in order and waits at a gap). A
	// writer behind its queue makes its events late, never the others'.
	type job struct {
		due    time.Time
		stream int
	}
	queues := make([]chan job, liveWriters)
	for w := range queues {
		queues[w] = make(chan job, total/liveWriters*2+1024)
	}
	spread := newLiveSpread(streams, zipf, uint64(time.Now().UnixNano()))
	start := time.Now()
	var appended atomic.Int64
	var lateMax atomic.Int64 // µs
	type commit struct{ id, stream, at int64 }
	commits := make([][]commit, liveWriters)
	var wg sync.WaitGroup
	errs := make(chan error, liveWriters)
	for w := range liveWriters {
		wg.Go(func() {
			for j := range queues[w] {
				if ctx.Err() != nil {
					return
				}
				if late := time.Since(j.due).Microseconds(); late > lateMax.Load() {
					lateMax.Store(late) // a race may keep a smaller one: a figure, not a check
				}
				ev := store.NewEvent{Name: "LiveEvent", Data: liveData(j.due)}
				if rate == 0 {
					ev.Data = payload
				}
				evs, err := st.Append(ctx, liveStream(j.stream), store.AnyVersion, ev)
				if err != nil {
					errs <- err
					return
				}
				if rate > 0 {
					commits[w] = append(commits[w], commit{evs[0].ID, int64(j.stream), time.Now().UnixMicro()})
				}
				appended.Add(1)
			}
		})
	}
	for i := range total {
		if ctx.Err() != nil {
			break
		}
		due := start.Add(time.Duration(i) * period)
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		k := int(i)
		if rate > 0 {
			k = spread.next()
		}
		queues[k%liveWriters] <- job{due, k}
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if rate > 0 {
		var b strings.Builder
		for _, cs := range commits {
			for _, c := range cs {
				fmt.Fprintf(&b, "%d %d %d\n", c.id, c.stream, c.at)
			}
		}
		if err := os.WriteFile(f[5]+".commits", []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	out := fmt.Sprintf("%d %d\n", appended.Load(), lateMax.Load())
	if err := os.WriteFile(f[5]+".tmp", []byte(out), 0o644); err != nil {
		return err
	}
	if err := os.Rename(f[5]+".tmp", f[5]); err != nil {
		return err
	}
	<-ctx.Done()
	return nil // the deferred pool.Close ends the sessions: their backends report their counts
}

// barePollInterval is how often the bare reference reads its table when
// the last read found nothing. It polls instead of listening: a NOTIFY in
// the appending transaction takes Postgres' notify lock at commit and
// holds it across the commit's WAL flush, so with fsync on the appends
// commit one at a time (the bare generator reached about 230 appends/s
// at 2,000/s offered with a notifying trigger), which made the bare
// pipeline's appends the bottleneck and flattered every ratio. An empty
// read costs an index probe; 200 of them a second are in its Postgres CPU.
const barePollInterval = 5 * time.Millisecond

// bareSetupSQL turns a migrated schema {schema} into the bare reference's:
// the events table keeps its layout and indexes (so an append costs the
// same insert), without a trigger (the bare bridge polls, see
// barePollInterval), and a one-row table holds the bare bridge's position.
const bareSetupSQL = `DROP TRIGGER jsbridge_events_inserted ON {schema}.events;
CREATE TABLE {schema}.bare_position (id bigint NOT NULL);
INSERT INTO {schema}.bare_position VALUES (0);`

// bareReadSQL reads the next batch past the position, in id order. Ids
// are drawn before commit, so a smaller one may commit after a larger:
// the bare bridge takes the run of ids that follow its position without a
// gap, and waits at a gap (the generator's appends never fail, so every
// id is used; a gap that lasts two reads a second apart is passed over).
const bareReadSQL = `SELECT id, stream, version, name, data::text, meta::text, created
FROM {schema}.events
WHERE id > $1
ORDER BY id
LIMIT 1000`

// bareBridgeChild is the -live-bare-child mode, the live rows'
// reference: the least a bridge must do, without our guarantees (no
// per-stream order under failure, no leases, no retry, one replica). arg
// is "<database URL> <schema> <nats URL>". On one connection it
// reads the rows past its position (bareReadSQL), publishes them with
// async publish and Nats-Msg-Id (the bridge's messages, forward.Message),
// waits for every PubAck, and moves its position with one UPDATE a
// batch; when a read finds nothing it reads again after
// barePollInterval. With a fourth field, a webhook URL, the same process also
// delivers EVENTS there (bareLiveDeliver): the bare reference pipeline.
// It runs until SIGTERM.
func bareBridgeChild(ctx context.Context, arg string) error {
	err := bareBridge(ctx, arg)
	if ctx.Err() != nil {
		return nil // SIGTERM: whatever it cut short
	}
	return err
}

func bareBridge(ctx context.Context, arg string) error {
	f := strings.Fields(arg)
	if len(f) != 3 && len(f) != 4 {
		return fmt.Errorf("-live-bare-child %q: want \"<database URL> <schema> <nats URL> [<webhook URL>]\"", arg)
	}
	schema := f[1]
	ccfg, err := pgx.ParseConfig(f[0])
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	nc, err := nats.Connect(f[2])
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	if len(f) == 4 {
		dctx, cancel := context.WithCancel(ctx)
		delivered := make(chan error, 1)
		go func() { delivered <- bareLiveDeliver(dctx, js, f[3]) }()
		defer func() {
			cancel()
			if err := <-delivered; err != nil {
				fmt.Fprintf(os.Stderr, "bench: bare delivery: %v\n", err)
			}
		}()
	}
	read := strings.ReplaceAll(bareReadSQL, "{schema}", schema)
	var pos int64
	if err := conn.QueryRow(ctx, "SELECT id FROM "+schema+".bare_position").Scan(&pos); err != nil {
		return err
	}
	evs := make([]event.Event, 0, 1000)
	gapAt, gapSeen := int64(-1), time.Time{} // a gap after the position, and since when
	for ctx.Err() == nil {
		rows, err := conn.Query(ctx, read, pos)
		if err != nil {
			return err
		}
		evs = evs[:0]
		for rows.Next() {
			var ev event.Event
			var data, meta string
			if err := rows.Scan(&ev.ID, &ev.Stream, &ev.Version, &ev.Name, &data, &meta, &ev.Created); err != nil {
				rows.Close()
				return err
			}
			ev.Data, ev.DataJSON = []byte(data), true
			if ev.Meta, err = event.ParseMeta([]byte(meta)); err != nil {
				rows.Close()
				return err
			}
			evs = append(evs, ev)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		// The run without a gap; a gap right after the position is
		// waited for, and passed over once it has lasted a second.
		next := pos + 1
		run := 0
		for run < len(evs) && evs[run].ID == next {
			run, next = run+1, next+1
		}
		if run == 0 && len(evs) > 0 {
			if gapAt != pos {
				gapAt, gapSeen = pos, time.Now()
			} else if time.Since(gapSeen) > time.Second {
				run = 1
				for run < len(evs) && evs[run].ID == evs[run-1].ID+1 {
					run++
				}
			}
		}
		evs = evs[:run]
		if len(evs) == 0 {
			select {
			case <-time.After(barePollInterval):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		futures := make([]jetstream.PubAckFuture, len(evs))
		for i := range evs {
			if futures[i], err = js.PublishMsgAsync(forward.Message(evs[i], forward.Config{})); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return nil
		}
		for _, fu := range futures {
			select {
			case err := <-fu.Err():
				return fmt.Errorf("publish: %w", err)
			default:
			}
		}
		pos = evs[len(evs)-1].ID
		if _, err := conn.Exec(ctx, "UPDATE "+schema+".bare_position SET id = $1", pos); err != nil {
			return err
		}
	}
	return nil
}
