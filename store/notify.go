package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pauses between attempts to re-establish a dropped LISTEN connection.
const (
	listenRetryMin = 250 * time.Millisecond
	listenRetryMax = 30 * time.Second
)

// Notifications listens on the store's channel (named after the schema; the
// events trigger notifies it at commit when an append gives a claim
// something to take and a drainer waits, see migrations 005 and 006, and
// Idle) on a
// connection of its own, taken from the pool and held until ctx is done (size
// the pool with one connection to spare). The returned channel receives
// a value after appends; notifications are coalesced (a full channel drops
// the new one) and never block the listener. If the connection drops it
// reconnects after a pause growing from 250ms to 30s and then sends a value,
// since appends may have been missed meanwhile. The channel is closed when
// ctx is done. The first LISTEN happens before Notifications returns: an
// error means it could not be set up. (It implements drain.Notifier.) The
// same connection holds the idle lock while the drainer waits (Idle, Busy);
// when it drops, the lock goes with its session.
//
// The channel also receives a value 1ms to 100ms after a Claim that took
// fewer streams than its limit and passed over a due stream whose row an
// uncommitted transaction held: an append to a stream already pending
// sends no notification, so the drain looks again once it has committed.
//
// With an external events table (WithEventsTable), which has no trigger of
// ours, there is nothing to listen to: Notifications instead runs Discover
// at once and then every discovery interval until ctx is done, sending a
// value when a stream's head moved. Discovery errors are logged (once per
// outage) and retried every interval.
func (s *Store) Notifications(ctx context.Context) (<-chan struct{}, error) {
	if s.External() {
		ch := make(chan struct{}, 1)
		go s.discoverLoop(ctx, ch)
		return ch, nil
	}
	conn, err := s.listen(ctx)
	if err != nil {
		return nil, err
	}
	l := newListener()
	s.notes.open(l.ch)
	s.listening.add(l)
	go s.notifyLoop(ctx, conn, l)
	return l.ch, nil
}

func (s *Store) listen(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: acquire connection: %w", s.schema, err)
	}
	// lock_timeout first, so that the LISTEN is the session's last
	// statement until the drainer is idle (what pg_stat_activity shows).
	// Only the idle lock's statements meet a lock on this session: see
	// idleLockWait.
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", idleLockWait.Milliseconds())); err != nil {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return nil, fmt.Errorf("listen on %s: %w", s.schema, err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+s.schema); err != nil {
		// The session state is unknown: do not hand it back to the pool.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return nil, fmt.Errorf("listen on %s: %w", s.schema, err)
	}
	return conn, nil
}

func (s *Store) notifyLoop(ctx context.Context, conn *pgxpool.Conn, l *listener) {
	defer s.notes.close(l.ch)
	defer func() {
		s.listening.remove(l)
		l.mu.Lock()
		l.interrupt, l.held = nil, false
		l.mu.Unlock()
		// Requests sent or still to come find done closed (ask).
		close(l.done)
	}()
	send := func() {
		select {
		case l.ch <- struct{}{}:
		default:
		}
	}
	pause := listenRetryMin
	for {
		if conn != nil {
			err := s.waitNotification(ctx, conn, l)
			if err == nil {
				pause = listenRetryMin
				send()
				continue
			}
			// Closing (rather than releasing) drops the LISTEN, and the
			// idle lock, with the session, so no pooled connection keeps
			// either.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			conn.Release()
			conn = nil
			l.setHeld(false)
			if ctx.Err() != nil {
				return
			}
		}
		// The drain's requests while there is no connection are answered
		// at once (it polls meanwhile), and do not put the reconnection
		// off.
		retry := time.NewTimer(pause)
	wait:
		for {
			select {
			case <-ctx.Done():
				retry.Stop()
				return
			case r := <-l.reqs:
				r.reply <- idleReply{err: ErrNotListening}
			case <-retry.C:
				break wait
			}
		}
		pause = min(2*pause, listenRetryMax)
		c, err := s.listen(ctx)
		if err != nil {
			continue
		}
		conn = c
		send()
	}
}

// waitNotification waits on conn until a notification arrives (nil),
// serving l's idle lock requests meanwhile; an error means conn is no
// longer usable, or ctx is done.
func (s *Store) waitNotification(ctx context.Context, conn *pgxpool.Conn, l *listener) error {
	for {
		// The interrupt first, then a look for a request: ask sends its
		// request before it interrupts, so a request either is seen here
		// or interrupts the wait.
		wait, cancel := context.WithCancel(ctx)
		l.mu.Lock()
		l.interrupt = cancel
		l.mu.Unlock()
		select {
		case r := <-l.reqs:
			l.mu.Lock()
			l.interrupt = nil
			l.mu.Unlock()
			cancel()
			if err := s.serveIdle(ctx, l, conn.Conn(), r); err != nil {
				return err
			}
			continue
		default:
		}
		_, err := conn.Conn().WaitForNotification(wait)
		l.mu.Lock()
		l.interrupt = nil
		l.mu.Unlock()
		interrupted := wait.Err() != nil
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !interrupted || conn.Conn().IsClosed() {
			return err
		}
		// Interrupted (a deadline on the socket: the session goes on) to
		// serve a request, which the loop takes next.
	}
}
