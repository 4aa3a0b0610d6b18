package deliver

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// lanes runs the deliveries of one stream one after another, in the order
// they were submitted, while different streams run concurrently: an ordered
// partition's lanes (the unordered path has none). A lane's delivery retries
// its event in place (head of line), so the stream's later events wait.
type lanes struct {
	mu      sync.Mutex
	busy    map[string][]jetstream.Msg // key → messages waiting behind the running one
	workers pull.Workers
}

// queued returns the messages waiting behind a running delivery.
func (l *lanes) queued() []jetstream.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []jetstream.Msg
	for _, q := range l.busy {
		out = append(out, q...)
	}
	return out
}

// queuedOf returns how many messages of key wait behind its running one.
func (l *lanes) queuedOf(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.busy[key])
}

// takeQueued removes the messages of key waiting behind its running one
// and returns them, in the order they were submitted: the running one
// is then the lane's last.
func (l *lanes) takeQueued(key string) []jetstream.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	q, running := l.busy[key]
	if !running || len(q) == 0 {
		return nil
	}
	l.busy[key] = nil
	return q
}

// running reports whether key's lane runs.
func (l *lanes) running(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.busy[key]
	return ok
}

// submit runs fn(msg) on wg after the messages of the same key submitted
// before it, and at once when none is running. It reports whether msg was
// queued behind a running one (then the running lane's fn runs it, and the
// fn and done given here are not used). A lane that started calls done, if
// not nil, when its queue is empty and it ends.
func (l *lanes) submit(key string, msg jetstream.Msg, wg *sync.WaitGroup, fn func(jetstream.Msg), done func()) (queued bool) {
	l.mu.Lock()
	if l.busy == nil {
		l.busy = map[string][]jetstream.Msg{}
	}
	if q, running := l.busy[key]; running {
		l.busy[key] = append(q, msg)
		l.mu.Unlock()
		return true
	}
	l.busy[key] = nil
	l.mu.Unlock()
	wg.Add(1)
	l.workers.Run(func() {
		defer wg.Done()
		if done != nil {
			defer done()
		}
		for {
			fn(msg)
			l.mu.Lock()
			q := l.busy[key]
			if len(q) == 0 {
				delete(l.busy, key)
				l.mu.Unlock()
				return
			}
			msg, l.busy[key] = q[0], q[1:]
			l.mu.Unlock()
		}
	})
	return false
}

// keepHeldAlive sends InProgress every AckWait/2, until ctx ends, for the
// messages held() returns: received but not being delivered yet (queued
// behind their stream's running delivery, or, for an ordered partition,
// behind its fence), so JetStream does not redeliver them meanwhile.
func keepHeldAlive(ctx context.Context, clock clockwork.Clock, ackWait time.Duration, log *slog.Logger, held func() []jetstream.Msg) {
	t := clock.NewTicker(ackWait / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
			for _, m := range held() {
				if err := m.InProgress(); err != nil {
					log.Debug("in progress for a held message failed", slog.String("event_id", attempt.EventID(m)), slog.Any("error", err))
				}
			}
		}
	}
}
