package pull_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

func TestConsumerGone(t *testing.T) {
	t.Parallel()
	for _, err := range []error{pull.ErrConsumerGone, jetstream.ErrConsumerDeleted, jetstream.ErrConsumerNotFound,
		jetstream.ErrStreamNotFound, jetstream.ErrConsumerDoesNotExist, nats.ErrNoResponders} {
		require.True(t, pull.ConsumerGone(fmt.Errorf("pull: %w", err)), "%v", err)
	}
	for _, err := range []error{nats.ErrTimeout, jetstream.ErrNoHeartbeat, errors.New("other")} {
		require.False(t, pull.ConsumerGone(err), "%v", err)
	}
}

// Workers run every function, several at once: a function blocked does
// not keep the next from starting.
func TestWorkersRunConcurrently(t *testing.T) {
	t.Parallel()
	var w pull.Workers
	const n = 8
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	release := make(chan struct{})
	for range n {
		w.Run(func() {
			defer done.Done()
			started.Done()
			<-release
		})
	}
	started.Wait() // all n running at once
	close(release)
	done.Wait()
	// Idle workers take the next functions.
	done.Add(n)
	for range n {
		w.Run(done.Done)
	}
	done.Wait()
}
