package main

import (
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/wire"
)

// deliver hands s the event id as if replica had POSTed it.
func deliver(s *partSink, replica string, id int) {
	r := httptest.NewRequest("POST", "/hook", nil)
	r.Header.Set(wire.HeaderIdempotencyKey, strconv.Itoa(id))
	r.Header.Set(wire.HeaderReplica, replica)
	s.ServeHTTP(httptest.NewRecorder(), r)
}

// byPartition groups the ids 1..n by partition.
func byPartition(n int) map[int][]int {
	m := map[int][]int{}
	for id := 1; id <= n; id++ {
		m[eventPartition(id)] = append(m[eventPartition(id)], id)
	}
	return m
}

func newTestSink(n int) *partSink {
	s := &partSink{}
	s.reset(n)
	return s
}

// The case the issue saw: the replica to kill had delivered all of its
// partitions' events; nothing is left to hand over, and busiest says so
// instead of naming it.
func TestPartSinkBusiestIgnoresFinishedPartitions(t *testing.T) {
	n := 2 * orderedStreams
	parts := byPartition(n)
	s := newTestSink(n)
	for _, id := range parts[0] {
		deliver(s, "a", id) // partition 0: all delivered by a
	}
	if r, c := s.busiest(); c != 0 {
		t.Fatalf("busiest = %q with %d partitions; want none (partition 0 has no events left)", r, c)
	}
	deliver(s, "b", parts[1][0])
	deliver(s, "b", parts[2][0])
	deliver(s, "a", parts[3][0])
	if r, c := s.busiest(); r != "b" || c != 2 {
		t.Fatalf("busiest = %q, %d; want b, 2", r, c)
	}
}

func TestPartSinkHandoverDone(t *testing.T) {
	n := 2 * orderedStreams
	parts := byPartition(n)
	s := newTestSink(n)
	deliver(s, "a", parts[1][0])
	deliver(s, "a", parts[2][0])
	at := time.Now()
	s.kill("a")
	if _, v, r, st := s.handover(at, time.Now(), time.Minute); st != handoverWaiting || v != 2 || r != 0 {
		t.Fatalf("before the other replica delivers: state %d, %d victims, %d resumed; want waiting, 2, 0", st, v, r)
	}
	deliver(s, "b", parts[1][1])
	deliver(s, "b", parts[2][1])
	took, v, r, st := s.handover(at, time.Now(), time.Minute)
	if st != handoverDone || v != 2 || r != 2 || took <= 0 {
		t.Fatalf("after: state %d, %d victims, %d resumed, took %s; want done, 2, 2, > 0", st, v, r, took)
	}
}

// The victim delivers its partitions' last events between the kill being
// noted and its death; once every event is delivered and grace has passed
// the row ends, saying the condition cannot be met.
func TestPartSinkHandoverUnmeetable(t *testing.T) {
	n := 2 * orderedStreams
	parts := byPartition(n)
	s := newTestSink(n)
	deliver(s, "a", parts[1][0])
	at := time.Now()
	s.kill("a")
	for id := 1; id <= n; id++ {
		if eventPartition(id) == 1 {
			deliver(s, "a", id)
		} else {
			deliver(s, "b", id)
		}
	}
	if !s.allDelivered() {
		t.Fatal("allDelivered = false after every id was delivered")
	}
	grace := 10 * time.Second
	if _, _, _, st := s.handover(at, time.Now(), grace); st != handoverWaiting {
		t.Fatalf("within grace: state %d; want waiting (a redelivery may still come)", st)
	}
	if _, v, r, st := s.handover(at, time.Now().Add(grace), grace); st != handoverUnmeetable || v != 1 || r != 0 {
		t.Fatalf("after grace: state %d, %d victims, %d resumed; want unmeetable, 1, 0", st, v, r)
	}
	// With no victim partitions at all, there is nothing to wait for.
	s.reset(n)
	s.kill("a")
	if _, _, _, st := s.handover(at, time.Now(), grace); st != handoverUnmeetable {
		t.Fatalf("no victims: state %d; want unmeetable", st)
	}
}
