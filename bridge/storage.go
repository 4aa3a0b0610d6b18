// Out of storage, said: JetStream refusing publishes for lack of space is
// an outage to the drain (no retry counted, nothing blocked, resumed by
// itself once space is freed); this makes it visible, once per outage.

package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jsbridge/jsbridge/forward"
)

// ErrStorageFull is wrapped by Ready while JetStream refuses the bridge's
// publishes for lack of storage (the server's or the account's storage
// limit reached, or a full disk): from the first refusal until a publish
// is stored again. The drain treats it as an outage (docs/retention.md,
// "Storage full").
var ErrStorageFull = errors.New("JetStream refuses publishes for lack of storage")

// ReasonStorage is the reason label of jsbridge_bus_unavailable while
// JetStream refuses publishes for lack of storage.
const ReasonStorage = "storage"

// storageWatch follows, from every publish outcome, whether JetStream
// refuses the bridge's publishes for lack of storage, and passes each
// outcome on to next. The state turns on at the first refusal and off at
// the first message stored again; each turn is logged once (not once per
// stream) and set on the gauge.
type storageWatch struct {
	next  forward.Observer             // the metrics; nil: none
	gauge func(reason string, on bool) // jsbridge_bus_unavailable; nil: none
	log   *slog.Logger

	mu    sync.Mutex
	since time.Time // first refusal of this outage; zero: none
	cause error     // the first refusal
	count int       // refusals this outage
}

// Published implements forward.Observer.
func (w *storageWatch) Published(o forward.Outcome, took time.Duration) {
	if w.next != nil {
		w.next.Published(o, took)
	}
	full := o.Status == forward.Failed && forward.IsStorageFull(o.Err)
	stored := o.Status == forward.Stored || o.Status == forward.Duplicate
	if !full && !stored {
		return // other failures say nothing of storage
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case full && w.since.IsZero():
		w.since, w.cause, w.count = time.Now(), o.Err, 1
		w.log.Error("JetStream refuses publishes for lack of storage: the bridge waits (no retry counted, no stream blocked) and resumes by itself once space is freed; "+
			"free space (purge or remove messages, raise max_file_store or the account's limit, add disk) or set retention (see docs/retention.md)",
			"reason", ReasonStorage, "error", o.Err)
		if w.gauge != nil {
			w.gauge(ReasonStorage, true)
		}
	case full:
		w.count++
	case stored && !w.since.IsZero():
		w.log.Info("JetStream stores the bridge's publishes again", "reason", ReasonStorage,
			"refused_for", time.Since(w.since).Round(time.Millisecond), "refusals", w.count)
		w.since, w.cause, w.count = time.Time{}, nil, 0
		if w.gauge != nil {
			w.gauge(ReasonStorage, false)
		}
	}
}

// err returns an error wrapping ErrStorageFull while publishes are
// refused for lack of storage, else nil.
func (w *storageWatch) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.since.IsZero() {
		return nil
	}
	return fmt.Errorf("%w since %s (%s, %d refusals): %v", ErrStorageFull, w.since.UTC().Format(time.RFC3339),
		time.Since(w.since).Round(time.Second), w.count, w.cause)
}
