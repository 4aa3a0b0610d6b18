package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jsbridge/jsbridge/wire"
)

// partSink counts distinct Idempotency-Keys like sink and, for the
// hand-over row, notes per partition who delivered last, how many of its
// events were delivered, and when a partition of a killed replica was
// first delivered by another.
type partSink struct {
	mu   sync.Mutex
	seen map[string]bool
	n    atomic.Int64
	srv  *http.Server
	url  string

	total     map[int]int       // partition → events of the backlog in it
	delivered map[int]int       // partition → distinct events delivered
	last      map[int]string    // partition → replica of its last delivery
	killed    string            // the killed replica's id, "" before the kill
	victim    map[int]bool      // partitions with events left whose last delivery at the kill was the victim's
	resumed   map[int]time.Time // victim partitions → first delivery by another replica
	allAt     time.Time         // when the last of the backlog's events was first delivered
}

func newPartSink() (*partSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &partSink{url: "http://" + ln.Addr().String() + "/hook"}
	s.reset(0)
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// eventPartition is the partition of event id in backlog(n, orderedStreams):
// event id i is in stream bench-<(i-1) mod orderedStreams>.
func eventPartition(id int) int {
	return wire.StreamPartition(fmt.Sprintf("bench-%d", (id-1)%orderedStreams), orderedPartitions)
}

// reset forgets every delivery; the next run delivers backlog(n,
// orderedStreams).
func (s *partSink) reset(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen, s.delivered, s.last, s.killed, s.victim, s.resumed, s.allAt = map[string]bool{}, map[int]int{}, map[int]string{}, "", nil, map[int]time.Time{}, time.Time{}
	s.total = map[int]int{}
	for id := 1; id <= n; id++ {
		s.total[eventPartition(id)]++
	}
	s.n.Store(0)
}

func (s *partSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	replica := r.Header.Get(wire.HeaderReplica)
	id, _ := strconv.Atoi(key)
	p := eventPartition(id)
	s.mu.Lock()
	if !s.seen[key] {
		s.seen[key] = true
		s.delivered[p]++
		if n := s.n.Add(1); int(n) == s.totalLocked() {
			s.allAt = time.Now()
		}
	}
	s.last[p] = replica
	if s.killed != "" && replica != s.killed && s.victim[p] && s.resumed[p].IsZero() {
		s.resumed[p] = time.Now()
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *partSink) totalLocked() int {
	t := 0
	for _, n := range s.total {
		t += n
	}
	return t
}

// busiest returns the replica that was last to deliver the most partitions
// with events left, and how many; "" and 0 when no partition has events
// left that a replica delivered before (nothing left to hand over).
func (s *partSink) busiest() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	count := map[string]int{}
	for p, r := range s.last {
		if s.delivered[p] < s.total[p] {
			count[r]++
		}
	}
	best, most := "", 0
	for r, c := range count {
		if c > most || c == most && r < best {
			best, most = r, c
		}
	}
	return best, most
}

// kill notes that replica is being killed now: its victim partitions are
// those it was last to deliver that still have events left.
func (s *partSink) kill(replica string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killed, s.victim = replica, map[int]bool{}
	for p, r := range s.last {
		if r == replica && s.delivered[p] < s.total[p] {
			s.victim[p] = true
		}
	}
}

// handoverState is what a poll of the hand-over row finds.
type handoverState int

const (
	handoverWaiting    handoverState = iota // victim partitions not yet delivered by another replica; that can still happen
	handoverDone                            // every victim partition was delivered by another replica
	handoverUnmeetable                      // it can no longer happen: see handover
)

// handover reports, at now, on the victim partitions of a kill at at: the
// longest time until one was delivered by another replica, how many there
// are and how many were, and the state. The condition can no longer be met
// once every event of the backlog was delivered and grace has passed since:
// a victim partition still not delivered by another replica then had its
// last events delivered by the victim itself in its last moments, and no
// redelivery of an unacknowledged one came within grace either. With no
// victim partitions at all there is nothing to hand over. (Waiting
// any longer is what made the row hang for its whole timeout.)
func (s *partSink) handover(at, now time.Time, grace time.Duration) (longest time.Duration, victims, resumed int, st handoverState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	victims = len(s.victim)
	for p := range s.victim {
		if t := s.resumed[p]; !t.IsZero() {
			resumed++
			longest = max(longest, t.Sub(at))
		}
	}
	switch {
	case victims == 0:
		return 0, 0, 0, handoverUnmeetable
	case resumed == victims:
		return longest, victims, resumed, handoverDone
	case !s.allAt.IsZero() && now.Sub(s.allAt) >= grace:
		return longest, victims, resumed, handoverUnmeetable
	}
	return longest, victims, resumed, handoverWaiting
}

// allDelivered reports whether every event of the backlog was delivered.
func (s *partSink) allDelivered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.allAt.IsZero()
}
