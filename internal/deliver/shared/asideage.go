package shared

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/jsapi"
)

// asideAgeWait bounds the reads of one scrape of the aside-age gauges:
// a scrape while JetStream is away answers without them after it.
const asideAgeWait = 2 * time.Second

// maxAgeFresh is how long a read of the events stream's MaxAge is used
// before the next scrape reads it again.
const maxAgeFresh = time.Minute

// asideAges keeps what the aside-age gauges read from the events
// stream: the stored time of every head they were asked for (it never
// changes) and the stream's MaxAge.
type asideAges struct {
	mu     sync.Mutex
	stored map[uint64]time.Time // a head's sequence → its stored time; zero: gone from the stream
	maxAge time.Duration
	read   time.Time // when maxAge was read (the replica's clock); zero: never
}

// asideAges returns, for each of the replica's subscriptions, the age in
// seconds of the oldest event a parked or set-aside stream of it holds
// back on the partitions the replica serves (0 when none does; +Inf when
// that event is no longer in the events stream: its limits removed it),
// and the events stream's MaxAge in seconds (0: none). ok is false when
// the events stream could not be read within asideAgeWait. A head's
// stored time is read once (from the stream's leader); MaxAge at most
// once a maxAgeFresh.
func (r *Replica) asideAges() (ages map[string]float64, maxAge float64, ok bool) {
	subs, asides := r.asides()
	oldest := make(map[string]uint64, len(subs))
	for _, a := range asides {
		if a.State != fanout.AsideParked && a.State != fanout.AsideStuck {
			continue
		}
		if s, ok := oldest[a.Sub]; !ok || a.From < s {
			oldest[a.Sub] = a.From
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), asideAgeWait)
	defer cancel()
	c := &r.ages
	c.mu.Lock()
	defer c.mu.Unlock()
	now := r.cfg.Clock.Now()
	if c.read.IsZero() || now.Sub(c.read) >= maxAgeFresh {
		s, err := r.js.Stream(ctx, r.cfg.Stream)
		if err != nil {
			return nil, 0, false
		}
		c.maxAge, c.read = s.CachedInfo().Config.MaxAge, now
	}
	keep := make(map[uint64]time.Time, len(oldest))
	ages = make(map[string]float64, len(subs))
	for _, sub := range subs {
		ages[sub] = 0
	}
	for sub, seq := range oldest {
		at, known := c.stored[seq]
		if !known {
			m, found, err := jsapi.LeaderGet(ctx, r.js, r.cfg.Stream, jsapi.GetRequest{Seq: seq})
			if err != nil {
				return nil, 0, false
			}
			if found {
				at = m.Time
			}
		}
		keep[seq] = at
		if at.IsZero() {
			ages[sub] = math.Inf(1)
			continue
		}
		ages[sub] = max(now.Sub(at).Seconds(), 0)
	}
	c.stored = keep
	return ages, c.maxAge.Seconds(), true
}
