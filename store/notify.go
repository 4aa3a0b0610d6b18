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
// something to take, see migration 005) on a
// connection of its own, taken from the pool and held until ctx is done (size
// the pool with one connection to spare). The returned channel receives
// a value after appends; notifications are coalesced (a full channel drops
// the new one) and never block the listener. If the connection drops it
// reconnects after a pause growing from 250ms to 30s and then sends a value,
// since appends may have been missed meanwhile. The channel is closed when
// ctx is done. The first LISTEN happens before Notifications returns: an
// error means it could not be set up. (It implements drain.Notifier.)
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
	go s.notifyLoop(ctx, conn, ch)
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

func (s *Store) notifyLoop(ctx context.Context, conn *pgxpool.Conn, ch chan struct{}) {
	defer s.notes.close(ch)
	send := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	pause := listenRetryMin
	for {
		if conn != nil {
			_, err := conn.Conn().WaitForNotification(ctx)
			if err == nil {
				pause = listenRetryMin
				send()
				continue
			}
			// Closing (rather than releasing) drops the LISTEN with the
			// session, so no pooled connection keeps listening.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			conn.Release()
			conn = nil
			if ctx.Err() != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
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
