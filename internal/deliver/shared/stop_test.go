package shared_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// holdingReceiver counts every request it gets, by path and webhook-id,
// at its arrival, and holds each one's answer (204) until release.
type holdingReceiver struct {
	srv     *httptest.Server
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	got     map[string]map[string]int // path → event id → requests
	held    int                       // requests waiting for release
}

func newHoldingReceiver(t *testing.T) *holdingReceiver {
	h := &holdingReceiver{release: make(chan struct{}), got: map[string]map[string]int{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		if h.got[r.URL.Path] == nil {
			h.got[r.URL.Path] = map[string]int{}
		}
		h.got[r.URL.Path][r.Header.Get("webhook-id")]++
		h.held++
		h.mu.Unlock()
		<-h.release
		h.mu.Lock()
		h.held--
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	t.Cleanup(h.open)
	return h
}

func (h *holdingReceiver) open() { h.once.Do(func() { close(h.release) }) }

func (h *holdingReceiver) holding() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// distinct returns how many events path got, and the requests beyond
// the first of each.
func (h *holdingReceiver) distinct(path string) (events, again int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.got[path] {
		events++
		again += n - 1
	}
	return events, again
}

// A replica stopped (SIGTERM) while its POSTs are at the receiver starts
// nothing more, lets the POSTs it started finish and commits their
// settlements before it lets its partitions go: the replica that takes
// them over sends none of those events again (docs/design/next-engine.md,
// "Faults": graceful release), for an ordered subscription and an
// unordered one, each alone (an unordered subscription's events settled
// above a floor that another subscription holds back are sent again by
// the next owner: the record keeps no per-event entries for it).
func TestAStoppedReplicaFinishesItsPOSTsAndTheNextSendsNoneOfThemAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas")
	}
	for _, name := range []string{"ordered", "unordered"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			// The lease deadline cuts a POST (and the next owner sends
			// its event again): give the POSTs a's release lets finish
			// more than the world's 2 s to answer on a loaded machine.
			w.opts = func(c *shared.Config, _ *shared.Deps) { c.LeaseTTL = 15 * time.Second }
			h := newHoldingReceiver(t)
			path := "/" + name
			for _, s := range w.subs {
				if s.Name == name {
					s.URL = h.srv.URL + path
					w.subs = []subscription.Subscription{s}
					break
				}
			}
			a := w.replica(t, "replica-a")
			w.publish(t, 200)
			// POSTs at the receiver: the ordered subscription's one per
			// stream, the unordered one's up to its in-flight limit.
			require.Eventually(t, func() bool { return h.holding() >= 50 }, 30*time.Second, 5*time.Millisecond,
				"POSTs held at the receiver")

			stopped := make(chan struct{})
			go func() { a.Stop(); close(stopped) }()
			// Once a releases its partitions, the POSTs it started answer.
			require.Eventually(t, func() bool { return len(a.Owned()) == 0 }, 10*time.Second, 5*time.Millisecond,
				"a releases its partitions")
			h.open()
			select {
			case <-stopped:
			case <-time.After(30 * time.Second):
				t.Fatal("a did not stop within 30 s of its POSTs answering")
			}

			w.replica(t, "replica-b")
			require.Eventually(t, func() bool { n, _ := h.distinct(path); return n == w.next }, 60*time.Second, 10*time.Millisecond,
				"every event delivered")
			_, again := h.distinct(path)
			require.Zero(t, again, "requests of events whose POST a had started, sent again by b")
		})
	}
}
