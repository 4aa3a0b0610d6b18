package unordered

import (
	"context"
	"errors"
	"sync"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
)

// Census lists the durable consumers of the events stream, once per
// consumerCheckInterval, for a Fleet's unordered units (Deps.Census): a unit asks it
// whether its durable consumer still exists instead of asking JetStream
// for its consumer's info every consumerCheckInterval itself. With
// 10,000 subscriptions that was 1,000 API requests a second; a listing
// is one request per 1,024 names. A unit missing from a complete listing
// confirms with its own info request before it counts as gone, so a
// listing that raced with a creation costs one request, never a restart.
type Census struct {
	js     jetstream.JetStream
	stream string
	clock  clockwork.Clock

	mu       sync.Mutex
	names    map[string]bool // the last complete listing's; nil before one
	complete chan struct{}   // closed when the listing under way ends
}

// NewCensus returns the Census of stream's durable consumers.
func NewCensus(js jetstream.JetStream, stream string, clock clockwork.Clock) *Census {
	return &Census{js: js, stream: stream, clock: clock, complete: make(chan struct{})}
}

// Run lists the consumers every consumerCheckInterval (10 s) until ctx
// ends.
func (c *Census) Run(ctx context.Context) {
	t := c.clock.NewTicker(consumerCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		c.list(ctx)
	}
}

// list lists the consumers once and wakes the waiters; a listing that
// fails (other than for a missing stream) keeps the last one.
func (c *Census) list(ctx context.Context) {
	names := map[string]bool{}
	s, err := c.js.Stream(ctx, c.stream)
	if err == nil {
		l := s.ConsumerNames(ctx)
		for n := range l.Name() {
			names[n] = true
		}
		err = l.Err()
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = nil // none exists
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.names = names
	}
	close(c.complete)
	c.complete = make(chan struct{})
}

// listed returns a channel closed when the listing under way (or the
// next one) has ended.
func (c *Census) listed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.complete
}

// lacks reports whether the last complete listing lacks name.
func (c *Census) lacks(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.names != nil && !c.names[name]
}

// WatchGone waits, until ctx ends, for a listing that lacks durable
// after one that began after the call (the first may have begun before
// durable was created), then confirms with cons.Info: it returns true
// when JetStream says the consumer or its stream is not found, false
// when ctx ended.
func (c *Census) WatchGone(ctx context.Context, durable string, cons jetstream.Consumer) bool {
	skip := true
	for {
		ch := c.listed()
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
		if skip {
			skip = false
			continue
		}
		if !c.lacks(durable) {
			continue
		}
		if _, err := cons.Info(ctx); errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			return true
		}
	}
}
