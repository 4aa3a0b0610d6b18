package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The idle lock (migration 006): an append notifies only while a drainer
// waits for notifications, which a drainer says by holding the session
// advisory lock idleLockKey exclusively on its listening connection.

// idleLockKey is the text whose hashtextextended(…, 0) is the idle lock's
// key; the trigger of migration 006 spells the same text.
func idleLockKey(schema string) string { return "jsbridge idle " + schema }

// Pauses of Idle while appenders that sent no notification hold the idle
// lock shared (they have not committed yet): from 1ms, doubling, and after
// the one of idlePauseMax Idle gives up, so that the drain claims what the
// others committed meanwhile instead of waiting on a long application
// transaction.
const (
	idlePauseMin = time.Millisecond
	idlePauseMax = 16 * time.Millisecond
)

// idleOutcome is what one attempt to take the idle lock found.
type idleOutcome string

const (
	idleMine      idleOutcome = "mine"      // this drainer took it
	idleOther     idleOutcome = "other"     // another drainer holds it
	idleAppending idleOutcome = "appending" // appenders hold it shared
)

// idleReq is a request to the listening connection's goroutine: take the
// idle lock (busy false) or let go of it (busy true).
type idleReq struct {
	busy  bool
	reply chan idleReply
}

type idleReply struct {
	outcome idleOutcome
	err     error
}

// idleLock is the state of the idle lock on the store's listening
// connection, shared by that connection's goroutine (notifyLoop), which
// alone runs statements on it, and the drain's calls (Idle, Busy).
type idleLock struct {
	mu sync.Mutex
	// reqs carries Idle's and Busy's requests to notifyLoop; nil while no
	// listening connection is open.
	reqs chan idleReq
	// interrupt ends notifyLoop's current wait for a notification, so it
	// serves a request; nil while it does not wait.
	interrupt context.CancelFunc
	// held: this store's listening session holds the lock.
	held bool
}

// errNotListening is a request's error when the listening connection went
// away before serving it.
var errNotListening = errors.New("no listening connection")

// ask hands req to notifyLoop and waits for the answer.
func (l *idleLock) ask(ctx context.Context, busy bool) (idleOutcome, error) {
	l.mu.Lock()
	reqs := l.reqs
	l.mu.Unlock()
	if reqs == nil {
		return "", errNotListening
	}
	req := idleReq{busy: busy, reply: make(chan idleReply, 1)}
	select {
	case reqs <- req:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	l.mu.Lock()
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	select {
	case r := <-req.reply:
		return r.outcome, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Idle says that the drainer is about to wait for a notification after a
// claim found nothing (it implements drain.IdleNotifier). The bridge's own
// events table's trigger notifies only while some drainer waits (migration
// 006): Idle takes the idle lock on the listening connection for that.
//
// It returns ready true when the drainer may wait now: it held the lock
// already, or another drainer holds it (appends then notify every
// listener), or there is nothing to take it on (an external events table,
// whose new events are found by polling, or no open Notifications). It
// returns false when the drainer must claim once more first: it has just
// taken the lock, and appends committed before that sent no notification;
// or appenders that sent none still hold the lock shared after pauses of
// 1ms doubling to 16ms (31ms in all; a long application transaction), and
// the claim takes what the others committed meanwhile. An error means the
// statement failed; the drainer then waits for its poll interval.
func (s *Store) Idle(ctx context.Context) (ready bool, err error) {
	if s.External() {
		return true, nil
	}
	s.idle.mu.Lock()
	held := s.idle.held
	s.idle.mu.Unlock()
	if held {
		return true, nil
	}
	for pause := idlePauseMin; ; pause *= 2 {
		outcome, err := s.idle.ask(ctx, false)
		switch {
		case errors.Is(err, errNotListening):
			return true, nil
		case err != nil:
			return true, fmt.Errorf("take the idle lock of %s: %w", s.schema, err)
		case outcome == idleMine:
			return false, nil
		case outcome == idleOther:
			return true, nil
		case pause > idlePauseMax:
			return false, nil
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// Busy says that the drainer found work and will claim again without
// waiting for a notification (it implements drain.IdleNotifier): it lets go
// of the idle lock, so appends stop notifying until it is Idle again. It
// costs a round trip only when the lock was held.
func (s *Store) Busy(ctx context.Context) error {
	s.idle.mu.Lock()
	held := s.idle.held
	s.idle.mu.Unlock()
	if !held {
		return nil
	}
	if _, err := s.idle.ask(ctx, true); err != nil && !errors.Is(err, errNotListening) {
		return fmt.Errorf("let go of the idle lock of %s: %w", s.schema, err)
	}
	return nil
}
