package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// The many rows' receiver (pathSink) and helpers.

// pathSink is a receiver recording when each path (a subscription's
// name) got its first request.
type pathSink struct {
	srv   *http.Server
	url   string
	since time.Time

	mu    sync.Mutex
	first map[string]time.Duration // since since
	n     map[string]int           // requests by path
	last  time.Duration            // since since, the latest first request
	got   chan struct{}            // closed and renewed on each request
}

func newPathSink() (*pathSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &pathSink{url: "http://" + ln.Addr().String(), since: time.Now(), first: map[string]time.Duration{}, n: map[string]int{}, got: make(chan struct{})}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *pathSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	name := strings.TrimPrefix(r.URL.Path, "/")
	s.mu.Lock()
	if _, ok := s.first[name]; !ok {
		s.last = time.Since(s.since)
		s.first[name] = s.last
	}
	s.n[name]++
	close(s.got)
	s.got = make(chan struct{})
	s.mu.Unlock()
}

// requests returns how many requests name got.
func (s *pathSink) requests(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[name]
}

// waitMore returns when name got more than n requests (the time since
// s.since), or an error after timeout.
func (s *pathSink) waitMore(ctx context.Context, name string, n int, timeout time.Duration) (time.Duration, error) {
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		more := s.n[name] > n
		at := time.Since(s.since)
		ch := s.got
		s.mu.Unlock()
		if more {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-deadline:
			return 0, fmt.Errorf("%s: no new request after %s", name, timeout)
		case <-ch:
		}
	}
}

// waitPaths returns when n paths got a request, or after timeout: the
// time since s.since of the latest first request, and how many paths got
// one.
func (s *pathSink) waitPaths(ctx context.Context, n int, timeout time.Duration) (time.Duration, int, error) {
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		got, last, ch := len(s.first), s.last, s.got
		s.mu.Unlock()
		if got >= n {
			return last, got, nil
		}
		select {
		case <-ctx.Done():
			return last, got, ctx.Err()
		case <-deadline:
			return last, got, nil
		case <-ch:
		}
	}
}

// publishMany publishes one event of stream m<i>-1 (subscription i's).
func publishMany(ctx context.Context, js jetstream.JetStream, i int) error {
	stream := fmt.Sprintf("m%d-1", i)
	id := fmt.Sprintf("many-%d-%d", i, time.Now().UnixNano())
	_, err := js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, stream, "Pinged"),
		Header: nats.Header{wire.HeaderMsgID: []string{id}, wire.HeaderType: []string{"Pinged"}, wire.HeaderSubject: []string{stream}},
		Data:   []byte(`{}`)})
	return err
}

// parallel runs fn(0..n-1) on workers goroutines; the first error stops it.
func parallel(ctx context.Context, n, workers int, fn func(int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					cancel(err)
				}
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
