// Package drain moves events out of the event store: it claims streams under
// lease, fetches the events past their watermarks, hands them to a Handler
// (in package bridge, the JetStream forwarder) and settles each stream: ack
// (advance the watermark), retry later with backoff, or block.
//
// It knows nothing of Postgres or NATS: the store is the Store interface
// (package store implements it) and the forwarding is the Handler. Its
// pauses and deadlines run on an injected clock (Config.Clock).
//
// It is the engine behind the bridge front door, not an application API:
// applications run the bridge through package bridge, which assembles
// store, drain and forward. This package keeps only the surface bridge,
// forward and store need, and may change between releases (see the
// API stability section of docs/embedding.md).
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Config defaults.
const (
	DefaultLease        = 30 * time.Second
	DefaultClaimLimit   = 100
	DefaultFetchLimit   = 500
	DefaultPollInterval = time.Second
	DefaultMaxRetries   = 10
	// DefaultShutdownGrace is how long a batch in flight may go on after
	// Run's context ends.
	DefaultShutdownGrace = 10 * time.Second
)

// busyAfter is how many cycles in a row that claimed something make Run
// tell its IdleNotifier that it is busy (appends then stop notifying it).
// Letting go of the idle lock and taking it back costs two statements and
// a claim; at 100 events/s over 1,000 streams short runs of two working
// cycles came every few events, and telling the notifier after each made
// the bridge's statements per event grow (the live row, bench/live.go).
const busyAfter = 4

// maxErrorPause caps the growing pause after store errors in Run.
const maxErrorPause = 30 * time.Second

// maxOutagePause caps the growing pause of Run while the bus is unavailable
// (see Run): the drain probes at least this often whether it is back.
const maxOutagePause = 10 * time.Second

// ErrInvalidConfig is wrapped by New's errors; the message names the field
// and the value.
var ErrInvalidConfig = errors.New("invalid drain config")

// Config configures a Drain. The zero value of every field means its
// default.
type Config struct {
	// Owner names this drainer in leases; unique per process. Default
	// "<hostname>-<pid>-<random hex>".
	Owner string
	// Lease is how long a claim holds a stream (database clock). A drainer
	// that dies holding a lease delays its streams by at most this. Default
	// 30s.
	Lease time.Duration
	// ClaimLimit is how many streams one cycle claims at most. Default 100.
	ClaimLimit int
	// FetchLimit is how many events per stream one cycle handles at most.
	// Default 500.
	FetchLimit int
	// PollInterval is how long Run waits after a cycle that found nothing
	// before looking again (sooner when the Notifier fires). It is also the
	// first pause after a store error, doubling up to 30s. Default 1s.
	PollInterval time.Duration
	// Linger is how long Run waits, after a cycle that forwarded events
	// without finding a backlog, before it claims again, so that the next
	// cycle carries the events appended meanwhile (over every stream it
	// claims) instead of a cycle of three statements starting for almost
	// each event. It trades latency for the bridge's Postgres work: an event
	// appended while the drain lingers waits up to Linger, one appended
	// while the drain is idle does not wait. With a store that is an
	// AckClaimer the wait comes before the cycle's acks, which then go
	// with the next claim in one transaction (one write a cycle, not
	// two); the cycle's streams stay leased meanwhile, and what is
	// appended to them that claim takes again. A wait that would end past
	// the cycle's handler deadline (HandlerTimeout after its claim) comes
	// after the acks instead. Default 0: claim again at once.
	Linger time.Duration
	// MaxRetries is how many failed attempts a stream may retry: the failure
	// that would make its retry count exceed MaxRetries blocks it instead.
	// Default 10 (0 means the default: to block on the first failure, return
	// a NonRetryableError); negative is invalid.
	MaxRetries int
	// Backoff gives the delay before the next attempt of a stream that has
	// failed retry times before (0 on its first failure). Default
	// 1s doubling to 5min, ±20% jitter.
	Backoff func(retry int) time.Duration
	// OutageBackoff gives the delay before the next attempt of a stream
	// whose attempt failed because the bus was unavailable (the handler
	// returned an UnavailableError), from the number of cycles in a row
	// before this one in which the drain met the outage (0 at its start).
	// Such failures count no retry and never block a stream, so the
	// stream's retry count cannot pace them; the drain's count of outage
	// cycles only grows while the outage lasts, so each stream's delays
	// grow at least as fast as if it were counted per stream. Default
	// 5s doubling to 30s, ±20% jitter: at most 5 attempts
	// in the first minute of an outage, at most 3 a minute after).
	OutageBackoff func(outages int) time.Duration
	// ShutdownGrace is how long the batch in flight may go on after the
	// context of Run or Cycle ends (shutdown): what it finishes is acked,
	// the rest is released without counting a retry. Default 10s; it never
	// runs past 80% of the lease.
	ShutdownGrace time.Duration
	// Observer is told about claims and settles (metrics). Optional.
	Observer Observer
	// Notifier wakes Run when events are appended. Optional: without it Run
	// polls every PollInterval.
	Notifier Notifier
	// Logger receives claimed/acked (debug), retried (warn) and blocked
	// (error) records with stream, event_id and attempt keys. Default
	// slog.Default().
	Logger *slog.Logger
	// Clock times the drain's own waits and deadlines: the idle poll, the
	// pauses after store errors and during an outage, the handler's
	// deadline (HandlerTimeout after the claim), ShutdownGrace, and the
	// staleness of a cycle claimed ahead. Leases themselves run on the
	// database's clock. Tests pass a clockwork.FakeClock to drive them.
	// Default: the real clock.
	Clock clockwork.Clock
}

// Stats counts what one Cycle did.
type Stats struct {
	// Claimed is the number of streams claimed.
	Claimed int
	// Forwarded is the number of events handled and settled (acked, or
	// kept as partial progress of a retried or blocked stream).
	Forwarded int
	// Acked, Retried, Blocked and Released count streams by how they were
	// settled (Released: given back at shutdown without counting a retry).
	Acked, Retried, Blocked, Released int
	// LeaseLost counts streams whose settling was fenced off because the
	// lease had expired; they are claimed again later.
	LeaseLost int
	// Unavailable counts the retried streams whose attempt failed because
	// the bus was unavailable (an UnavailableError); they are in Retried
	// too, but their retry count did not grow (Store.Postpone).
	Unavailable int
}

// Drain runs claim → fetch → handle → settle cycles against a Store.
type Drain struct {
	store Store
	h     Handler
	cfg   Config
	log   *slog.Logger

	mu   sync.Mutex
	held map[string]bool // streams claimed and not settled yet
	// lostTrack is set when a store call that claims or settles failed:
	// this drainer may hold leases it will not settle (a settle or claim
	// whose answer was lost). The next prepare ends them (takeBack).
	lostTrack bool

	// outage is set by a cycle that forwarded nothing because the bus was
	// unavailable, and cleared by one that got through: while set, cycles
	// claim a single stream (a probe) instead of ClaimLimit. Only Cycle's
	// goroutine touches it.
	outage bool
	// outages counts the cycles in a row, up to the last one, in which a
	// stream failed because the bus was unavailable; Config.OutageBackoff's
	// argument. Only Cycle's goroutine touches it.
	outages int
}

// Run drains until ctx is done, then returns nil. While a cycle that found
// a backlog (ClaimLimit streams claimed, or FetchLimit events of one) is
// handled, the next cycle's streams are claimed and fetched (up to
// ClaimLimit more leases held), so the store's round trips overlap the
// handler's. Any other cycle that did work, once its handler is done
// without the bus failing, has the next cycle claimed and fetched while it
// settles, so an event appended meanwhile waits for the handler, not for
// the settle too; when the store is an AckClaimer and every stream of
// such a cycle is acked, that next claim is made instead with the acks, in
// one round trip and one transaction (AckClaimer.AckClaim), and when it
// finds nothing Run goes idle without claiming again (unless an ack had to
// be made after it). A cycle claimed ahead is given back untried (no retry counted)
// when the run pauses or stops instead of going on, or when the cycle
// handled meanwhile took so long that less than half of the claimed-ahead
// cycle's HandlerTimeout is left (a fresh claim replaces it). After a cycle
// that did work it starts the next one at once (after Config.Linger when
// that cycle found no backlog: with an AckClaimer, Linger before the acks
// that go with the next claim); after an idle cycle it
// waits for a notification or PollInterval. With an IdleNotifier it says
// Idle before it waits (and claims once more first when Idle asks), and
// Busy when it goes on working without waiting (the fourth working cycle
// in a row, or one after which it lingers). Store errors (the database is down) are
// logged and followed by a pause growing from PollInterval to 30s; Run keeps
// going. A cycle that acked no stream and had streams fail because the bus
// was unavailable (UnavailableError) starts an outage: Run pauses, growing
// from PollInterval to 10 s (at least PollInterval), and each further cycle claims a
// single stream (a probe) until one gets through; so an outage costs the
// streams not yet tried nothing, and those tried follow Config.OutageBackoff. When
// ctx is done, the batch in flight is settled with a fresh
// context (the handler sees the cancellation: what it finished is acked, the
// rest is released without counting a retry) and any lease still held is
// released.
func (d *Drain) Run(ctx context.Context) error {
	notes := d.subscribe(ctx)
	idler, _ := d.cfg.Notifier.(IdleNotifier)
	// working counts the cycles in a row that claimed something: at the
	// busyAfter-th, or at the first after which Run lingers, an
	// IdleNotifier hears that it is busy.
	working := 0
	// idleFailing: the IdleNotifier's last Idle failed (Run polls); only
	// the first failure of a run of them is logged.
	idleFailing := false
	pause := d.cfg.PollInterval
	outagePause := d.cfg.PollInterval
	// ahead is the next cycle, claimed and fetched while the current one
	// is handled (nil when none is under way): the store's round trips
	// then overlap the bus's instead of adding to them.
	var ahead chan prepared
	// claimed is the next cycle, claimed with the last one's acks
	// (AckClaimer) and fetched; nil when none was.
	var claimed *cycle
	_, ackClaims := d.store.(AckClaimer)
	for ctx.Err() == nil {
		var c *cycle
		var err error
		if claimed != nil {
			c, claimed = claimed, nil
		} else if ahead != nil {
			p := <-ahead
			ahead = nil
			c, err = p.c, p.err
			if err == nil && c != nil && c.stale(d.cfg.Lease, d.cfg.Clock.Now()) {
				// The cycle handled meanwhile took long: this one's
				// handler would be cut short. Claim afresh instead.
				d.log.Debug("cycle claimed ahead is stale; giving it back", "streams", c.st.Claimed)
				d.giveBack(c.streams())
				c = nil
			}
		}
		if c == nil && err == nil {
			// Nothing ran ahead, or it found nothing while the last
			// cycle's streams were still leased: look now.
			limit := d.cfg.ClaimLimit
			if d.outage {
				limit = 1 // probe whether the bus is back
			}
			c, err = d.prepare(ctx, limit)
		}
		st := c.stats()
		// A light cycle that lingers after it claims nothing ahead: the
		// claim comes after the wait.
		linger := false
		// quiet: the claim made with the acks found nothing and needs no
		// follow-up: Run goes idle without claiming again.
		quiet := false
		// lingered: the cycle lingered before its acks, which went with
		// the next claim (one transaction for both).
		lingered := false
		if err == nil && c != nil {
			linger = d.cfg.Linger > 0 && !c.backlogged(d.cfg.ClaimLimit, d.cfg.FetchLimit)
			readAhead := func() {
				if ahead != nil || d.outage || ctx.Err() != nil {
					return
				}
				ahead = make(chan prepared, 1)
				go func() {
					next, err := d.prepare(ctx, d.cfg.ClaimLimit)
					ahead <- prepared{next, err}
				}()
			}
			if c.backlogged(d.cfg.ClaimLimit, d.cfg.FetchLimit) {
				readAhead() // overlaps the handler
			}
			st, err = d.finish(ctx, c, func(results []Result) bool {
				if anyUnavailable(results) {
					return false
				}
				// A linger that would end past the cycle's handler
				// deadline (a long one, or a slow cycle) waits after
				// the acks instead, so the leases cannot run out.
				lingerFirst := linger && d.cfg.Clock.Now().Add(d.cfg.Linger).Before(c.deadline(d.cfg.Lease))
				if ackClaims && ahead == nil && !d.outage && ctx.Err() == nil && c.allDone(results) && (!linger || lingerFirst) {
					if lingerFirst {
						// Linger before the acks rather than after
						// them: the acks and the claim that follows the
						// wait go in one transaction, not two. The
						// streams stay leased meanwhile; what is
						// appended to them the claim takes again.
						if idler != nil && notes != nil {
							if err := idler.Busy(ctx, notes); err != nil && ctx.Err() == nil {
								d.log.Warn("drain: notifier busy", "error", err)
							}
						}
						if !d.sleep(ctx, d.cfg.Linger) {
							return false // shutting down: settle plainly
						}
						lingered = true
					}
					// The next claim goes with the acks, in one round
					// trip; what the notifications so far announced,
					// it sees.
					select {
					case <-notes:
					default:
					}
					return true
				}
				if linger {
					return false // it lingers after the settle
				}
				readAhead() // overlaps the settle
				return false
			})
			if n := c.next; n != nil {
				switch {
				case n.err != nil:
					err = errors.Join(err, fmt.Errorf("drain: claim: %w", n.err))
				case len(n.claims) > 0 && (err != nil || ctx.Err() != nil):
					d.giveBack(streamsOf(n.claims))
				case len(n.claims) > 0:
					claimed, err = d.build(ctx, &cycle{start: n.start}, n.claims, n.events, n.fetched)
					if err != nil {
						claimed = nil
					}
				default:
					quiet = err == nil && !n.again
				}
			}
		}
		if claimed != nil && (err != nil || d.outage || ctx.Err() != nil) {
			d.giveBack(claimed.streams())
			claimed = nil
		}
		if ahead != nil && (err != nil || d.outage || ctx.Err() != nil) {
			// Not going on at once: give the cycle claimed ahead back
			// untried rather than hold it through a pause.
			p := <-ahead
			ahead = nil
			if p.c != nil && p.err == nil {
				d.giveBack(p.c.streams())
			}
		}
		if d.outage && st.Unavailable > 0 {
			if !d.sleep(ctx, outagePause) {
				break
			}
			outagePause = min(2*outagePause, max(maxOutagePause, d.cfg.PollInterval))
		} else if !d.outage {
			outagePause = d.cfg.PollInterval
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			d.log.Error("drain cycle failed; pausing", "pause", pause, "error", err)
			if !d.sleep(ctx, pause) {
				break
			}
			pause = min(2*pause, max(maxErrorPause, d.cfg.PollInterval))
			continue
		}
		pause = d.cfg.PollInterval
		if st.Claimed > 0 && !quiet {
			working++
			lingers := linger && !lingered && st.Forwarded > 0 && !d.outage
			if idler != nil && notes != nil && (working == busyAfter || (lingers && working == 1)) {
				if err := idler.Busy(ctx, notes); err != nil && ctx.Err() == nil {
					d.log.Warn("drain: notifier busy", "error", err)
				}
			}
			if lingers {
				if !d.sleep(ctx, d.cfg.Linger) {
					break
				}
				// What these announced, the next claim sees.
				select {
				case <-notes:
				default:
				}
			}
			continue
		}
		working = 0
		if notes == nil && d.cfg.Notifier != nil {
			notes = d.subscribe(ctx)
		}
		if idler != nil && notes != nil {
			ready, err := idler.Idle(ctx, notes)
			switch {
			case err != nil && ctx.Err() == nil:
				// Transient: poll until it answers again (a dropped
				// listening session sends a value when it is back).
				if !idleFailing {
					d.log.Warn("drain: notifier cannot say idle; polling every poll interval", "poll_interval", d.cfg.PollInterval, "error", err)
				}
				idleFailing = true
			case err == nil:
				if idleFailing {
					d.log.Info("drain: notifier idle again; waiting for notifications")
				}
				idleFailing = false
				if !ready {
					continue // the last claim before waiting
				}
			}
		}
		timer := d.cfg.Clock.NewTimer(d.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-timer.Chan():
		case _, ok := <-notes:
			if !ok {
				notes = nil
			}
		}
		timer.Stop()
	}
	if ahead != nil {
		if p := <-ahead; p.c != nil && p.err == nil {
			d.giveBack(p.c.streams())
		}
	}
	d.releaseHeld()
	return nil
}

// prepared is the outcome of a prepare run ahead.
type prepared struct {
	c   *cycle
	err error
}

// subscribe returns the Notifier's channel, or nil without a Notifier or
// when subscribing failed (Run then polls, and tries again when idle).
func (d *Drain) subscribe(ctx context.Context) <-chan struct{} {
	if d.cfg.Notifier == nil {
		return nil
	}
	ch, err := d.cfg.Notifier.Notifications(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("drain notifications unavailable; polling", "error", err)
		}
		return nil
	}
	return ch
}

// releaseHeld gives back, at shutdown, any lease still held: streams
// claimed and not settled are released, and those a failed settle or
// claim may have left leased are ended (takeBack).
func (d *Drain) releaseHeld() {
	ctx, cancel := d.settleContext()
	defer cancel()
	d.mu.Lock()
	streams := make([]string, 0, len(d.held))
	for s := range d.held {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	if len(streams) == 0 {
		d.takeBack(ctx)
		return
	}
	if err := d.store.Release(ctx, d.cfg.Owner, streams); err != nil {
		d.log.Warn("drain release leases at shutdown", "streams", streams, "error", err)
	}
	d.mu.Lock()
	for _, s := range streams {
		delete(d.held, s)
	}
	d.mu.Unlock()
	d.takeBack(ctx) // what failed settles left leased, for the next owner
}

// settleContext bounds settling, which must happen even when the run's
// context is done: by the lease (later, settling is fenced off anyway).
func (d *Drain) settleContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), min(d.cfg.Lease, 30*time.Second))
}

// sleep waits for pause on the drain's clock; false when ctx ended first.
func (d *Drain) sleep(ctx context.Context, pause time.Duration) bool {
	t := d.cfg.Clock.NewTimer(pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}
