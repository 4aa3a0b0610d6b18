package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The idle lock (migration 006): an append notifies only while a drainer
// waits for notifications, which a drainer says by holding the session
// advisory lock idleLockKey exclusively on its listening connection. Each
// open Notifications channel has a listening connection and an idle claim
// of its own (a listener), so several drains on one Store each hold, or
// wait on, the lock for themselves.

// idleLockKey is the text whose hashtextextended(…, 0) is the idle lock's
// key; the trigger of migration 006 spells the same text.
func idleLockKey(schema string) string { return "jsbridge idle " + schema }

// idleLockWait is how long Idle waits in the lock's queue for appenders
// that sent no notification (they hold the lock shared until they commit)
// before it gives up and has the drain claim what the others committed
// meanwhile instead of waiting on a long application transaction. While it
// waits, appends notify: Postgres makes a new shared request that
// conflicts with a queued exclusive one fail, as the trigger's try does.
// It is the listening session's lock_timeout, which only the idle lock's
// statements meet there.
const idleLockWait = 50 * time.Millisecond

// ErrNotListening is returned by Idle when the drainer's Notifications
// channel has no listening session now: its connection dropped and is
// being re-established (after a pause growing from 250ms to 30s), or its
// context ended, or the channel is not one Notifications returned. The
// drainer then polls; when the session is back, the channel receives a
// value.
var ErrNotListening = errors.New("no listening session")

// idleOutcome is what one attempt to take the idle lock found.
type idleOutcome string

const (
	idleMine      idleOutcome = "mine"      // this listener took it
	idleOther     idleOutcome = "other"     // another listener holds it
	idleAppending idleOutcome = "appending" // appenders hold it shared
)

// idleReq is a request to a listener's goroutine: take the idle lock
// (busy false) or let go of it (busy true).
type idleReq struct {
	busy  bool
	reply chan idleReply
}

type idleReply struct {
	outcome idleOutcome
	err     error
}

// listener is one open Notifications channel: its goroutine (notifyLoop)
// alone runs statements on its listening connection, and serves the
// drainer's Idle and Busy through reqs.
type listener struct {
	ch chan struct{}
	// reqs carries Idle's and Busy's requests to notifyLoop.
	reqs chan idleReq
	// done is closed when notifyLoop has ended: no request is served
	// after that.
	done chan struct{}

	mu sync.Mutex
	// interrupt ends notifyLoop's current wait for a notification, so it
	// serves a request; nil while it does not wait.
	interrupt context.CancelFunc
	// held: this listener's session holds the lock.
	held bool
}

func newListener() *listener {
	return &listener{ch: make(chan struct{}, 1), reqs: make(chan idleReq, 1), done: make(chan struct{})}
}

func (l *listener) isHeld() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

func (l *listener) setHeld(held bool) {
	l.mu.Lock()
	l.held = held
	l.mu.Unlock()
}

// ask hands req to notifyLoop and waits for the answer. It returns
// ErrNotListening once notifyLoop has ended, whether before or after it
// took the request.
func (l *listener) ask(ctx context.Context, busy bool) (idleOutcome, error) {
	req := idleReq{busy: busy, reply: make(chan idleReply, 1)}
	select {
	case l.reqs <- req:
	case <-l.done:
		return "", ErrNotListening
	case <-ctx.Done():
		return "", ctx.Err()
	}
	// Sent first, then the interrupt: notifyLoop sets its interrupt
	// before it looks for a request, so either it sees this one or the
	// interrupt ends its wait.
	l.mu.Lock()
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	select {
	case r := <-req.reply:
		return r.outcome, r.err
	case <-l.done:
		return "", ErrNotListening
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// listeners are a Store's open Notifications channels.
type listeners struct {
	mu sync.Mutex
	m  map[<-chan struct{}]*listener
}

func (ls *listeners) add(l *listener) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.m == nil {
		ls.m = make(map[<-chan struct{}]*listener)
	}
	ls.m[l.ch] = l
}

func (ls *listeners) remove(l *listener) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(ls.m, l.ch)
}

func (ls *listeners) get(notes <-chan struct{}) *listener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[notes]
}

// Idle says that the drainer that reads notes (a channel Notifications
// returned) is about to wait for a notification after a claim found
// nothing (it implements drain.IdleNotifier). The bridge's own events
// table's trigger notifies only while some drainer waits (migration 006):
// Idle takes the idle lock on notes' listening session for that.
//
// It returns ready true when the drainer may wait now: that session held
// the lock already, or another drainer's holds it (appends then notify
// every listener), or the events table is external (its new events are
// found by discovery). It returns false when the drainer must claim once
// more first: it has just taken the lock, and appends committed before
// that sent no notification; or appenders that sent none still held the
// lock shared after Idle waited 50ms in its queue (a long application
// transaction), and the claim takes what the others committed meanwhile.
// Errors: ErrNotListening (wrapped) when notes has no listening session
// now (reconnecting, or ended); a statement's error otherwise. On an
// error the drainer should poll: appends may notify nobody.
func (s *Store) Idle(ctx context.Context, notes <-chan struct{}) (ready bool, err error) {
	if s.External() {
		return true, nil
	}
	l := s.listening.get(notes)
	if l == nil {
		return false, fmt.Errorf("take the idle lock of %s: %w", s.schema, ErrNotListening)
	}
	if l.isHeld() {
		return true, nil
	}
	outcome, err := l.ask(ctx, false)
	if err != nil {
		return false, fmt.Errorf("take the idle lock of %s: %w", s.schema, err)
	}
	return outcome == idleOther, nil
}

// Busy says that the drainer that reads notes found work and will claim
// again without waiting for a notification (it implements
// drain.IdleNotifier): its listening session lets go of the idle lock, so
// appends stop notifying until it is Idle again. It costs a round trip
// only when the lock was held; without a listening session there is no
// lock to let go of (it went with the session), and Busy returns nil.
func (s *Store) Busy(ctx context.Context, notes <-chan struct{}) error {
	l := s.listening.get(notes)
	if l == nil || !l.isHeld() {
		return nil
	}
	if _, err := l.ask(ctx, true); err != nil && !errors.Is(err, ErrNotListening) {
		return fmt.Errorf("let go of the idle lock of %s: %w", s.schema, err)
	}
	return nil
}

// serveIdle runs the idle lock's request r on conn, l's listening
// connection, and answers it; an error means conn is no longer usable.
func (s *Store) serveIdle(ctx context.Context, l *listener, conn *pgx.Conn, r idleReq) error {
	key := idleLockKey(s.schema)
	var reply idleReply
	if r.busy {
		_, reply.err = conn.Exec(ctx, s.q.idleLetGo, key)
		if reply.err == nil {
			l.setHeld(false)
		}
	} else {
		reply.outcome, reply.err = s.takeIdle(ctx, conn, key)
		if reply.err == nil {
			l.setHeld(reply.outcome == idleMine)
		}
	}
	r.reply <- reply
	if reply.err != nil && conn.IsClosed() {
		return reply.err
	}
	return nil
}

// takeIdle tries to take the idle lock on conn. When appenders that sent
// no notification hold it shared, it waits in the lock's queue for them to
// commit, idleLockWait at most (conn's lock_timeout, set by listen), and
// reports idleAppending if they have not by then.
func (s *Store) takeIdle(ctx context.Context, conn *pgx.Conn, key string) (idleOutcome, error) {
	var outcome string
	if err := conn.QueryRow(ctx, s.q.idleTake, key).Scan(&outcome); err != nil {
		return "", err
	}
	if idleOutcome(outcome) != idleAppending {
		return idleOutcome(outcome), nil
	}
	_, err := conn.Exec(ctx, s.q.idleWait, key)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateLockNotAvailable:
		return idleAppending, nil
	case err != nil:
		return "", err
	}
	return idleMine, nil
}
