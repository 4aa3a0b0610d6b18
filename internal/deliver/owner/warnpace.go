package owner

import (
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// warnEvery is how often one failure that repeats (a lease write the
// store refuses) is logged at warn level.
const warnEvery = time.Minute

// WarnPace paces warnings that would otherwise repeat at every try: a
// lease bucket refusing writes (a full store, JetStream away) fails each
// partition's claim and renewal and the heartbeat several times a
// second, for as long as it lasts. Each key (a subscription and a
// message) is warned about once per warnEvery; the repeats in between go
// to debug level, and the next warning says how many there were.
type WarnPace struct {
	clock clockwork.Clock
	mu    sync.Mutex
	last  map[string]*paced
}

// paced is one key's last warning and the repeats since.
type paced struct {
	at      time.Time
	repeats int
}

// NewWarnPace returns a WarnPace on clock.
func NewWarnPace(clock clockwork.Clock) *WarnPace {
	return &WarnPace{clock: clock, last: map[string]*paced{}}
}

// Warn logs msg with attrs on log: at warn level when key was not warned
// about within warnEvery (with "repeats": the failures since the last
// warning, when any), else at debug level.
func (w *WarnPace) Warn(log *slog.Logger, key, msg string, attrs ...any) {
	now := w.clock.Now()
	w.mu.Lock()
	p := w.last[key+"\x00"+msg]
	if p != nil && now.Sub(p.at) < warnEvery {
		p.repeats++
		w.mu.Unlock()
		log.Debug(msg, attrs...)
		return
	}
	repeats := 0
	if p == nil {
		w.last[key+"\x00"+msg] = &paced{at: now}
	} else {
		repeats, p.at, p.repeats = p.repeats, now, 0
	}
	w.mu.Unlock()
	if repeats > 0 {
		attrs = append(attrs, slog.Int("repeats", repeats))
	}
	log.Warn(msg, attrs...)
}
