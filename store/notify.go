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
	ch := make(chan struct{}, 1)
	s.notes.open(ch)
	reqs := make(chan idleReq, 1)
	s.idle.mu.Lock()
	s.idle.reqs, s.idle.held = reqs, false
	s.idle.mu.Unlock()
	go s.notifyLoop(ctx, conn, ch, reqs)
	return ch, nil
}

func (s *Store) listen(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: acquire connection: %w", s.schema, err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+s.schema); err != nil {
		// The session state is unknown: do not hand it back to the pool.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return nil, fmt.Errorf("listen on %s: %w", s.schema, err)
	}
	return conn, nil
}

func (s *Store) notifyLoop(ctx context.Context, conn *pgxpool.Conn, ch chan struct{}, reqs chan idleReq) {
	defer s.notes.close(ch)
	defer func() {
		s.idle.mu.Lock()
		if s.idle.reqs == reqs {
			s.idle.reqs, s.idle.interrupt, s.idle.held = nil, nil, false
		}
		s.idle.mu.Unlock()
		// A request that came last finds no one to serve it.
		select {
		case r := <-reqs:
			r.reply <- idleReply{err: errNotListening}
		default:
		}
	}()
	send := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	pause := listenRetryMin
	for {
		if conn != nil {
			err := s.waitNotification(ctx, conn, reqs)
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
			s.idle.mu.Lock()
			s.idle.held = false
			s.idle.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case r := <-reqs:
			r.reply <- idleReply{err: errNotListening}
			continue
		case <-time.After(pause):
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
// serving the idle lock's requests (reqs) meanwhile; an error means conn
// is no longer usable, or ctx is done.
func (s *Store) waitNotification(ctx context.Context, conn *pgxpool.Conn, reqs chan idleReq) error {
	for {
		// The interrupt first, then a look for a request: ask sends its
		// request before it interrupts, so a request either is seen here
		// or interrupts the wait.
		wait, cancel := context.WithCancel(ctx)
		s.idle.mu.Lock()
		s.idle.interrupt = cancel
		s.idle.mu.Unlock()
		var err error
		select {
		case r := <-reqs:
			err = s.serveIdle(ctx, conn, r)
			s.idle.mu.Lock()
			s.idle.interrupt = nil
			s.idle.mu.Unlock()
			cancel()
			if err != nil {
				return err
			}
			continue
		default:
		}
		_, err = conn.Conn().WaitForNotification(wait)
		s.idle.mu.Lock()
		s.idle.interrupt = nil
		s.idle.mu.Unlock()
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

// serveIdle runs the idle lock's request r on conn and answers it; an
// error means conn is no longer usable.
func (s *Store) serveIdle(ctx context.Context, conn *pgxpool.Conn, r idleReq) error {
	key := idleLockKey(s.schema)
	var reply idleReply
	if r.busy {
		_, reply.err = conn.Exec(ctx, s.q.idleLetGo, key)
	} else {
		var outcome string
		reply.err = conn.QueryRow(ctx, s.q.idleTake, key).Scan(&outcome)
		reply.outcome = idleOutcome(outcome)
	}
	if reply.err == nil {
		s.idle.mu.Lock()
		s.idle.held = reply.outcome == idleMine
		s.idle.mu.Unlock()
	}
	r.reply <- reply
	if reply.err != nil && conn.Conn().IsClosed() {
		return reply.err
	}
	return nil
}
