package consumer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// Without a ReplicaID, New chooses one name for the process, and the
// attempt records (consumer trace) and the partition records (consumer
// status) both use it: the two readers agree about one replica.
func TestAttemptRecordsAndLeasesNameTheReplicaAlike(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an ordered consumer and waits for its lease and records")
	}
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	srv, got := receiver(t, nil)
	c, err := consumer.New(b.js, consumer.Config{
		Subscriptions: []consumer.Subscription{sub("orders", srv.URL)},
		Attempts:      &consumer.AttemptsConfig{Record: consumer.AttemptsRecordAll}, // the 2xx at once too
		LeaseTTL:      time.Second,
	})
	require.NoError(t, err)
	id := c.Config().ReplicaID
	require.NotEmpty(t, id, "New fills the default replica id")
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(func() { _ = c.Stop(b.ctx) })

	b.publish(t, 1, "order-1")
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("event not delivered")
	}
	var tr consumer.EventTrace
	require.Eventually(t, func() bool {
		tr, err = consumer.TraceEvent(b.ctx, b.js, "1", consumer.TraceConfig{})
		return err == nil && len(tr.Attempts) > 0
	}, 20*time.Second, 20*time.Millisecond, "the attempt is recorded")
	require.Equal(t, id, tr.Attempts[0].Replica, "consumer trace names the replica by its id")

	// The partition records (consumer status) name their owner by the
	// same id once committed (within the record's linger).
	var owners []string
	require.Eventually(t, func() bool {
		parts, err := consumer.ReadSharedPositions(b.ctx, b.js)
		if err != nil {
			return false
		}
		owners = owners[:0]
		for _, p := range parts {
			if o := p.Record.Owner; o != "" && !slices.Contains(owners, o) {
				owners = append(owners, o)
			}
		}
		return slices.Contains(owners, id)
	}, 20*time.Second, 20*time.Millisecond, "consumer status names the replica %s", id)
	require.Equal(t, []string{id}, owners, "one replica, named alike by trace and status")
}
