package inspect

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// stateAt reads a message's place for a durable consumer from its ack
// floor, last delivered sequence and acks pending.
func TestStateAt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		seq, floor, delivered uint64
		ackPending            int
		start                 string
		state, why            string
	}{
		{"at the floor", 7, 7, 9, 2, "", DeliverySettled, "at or below the ack floor (7)"},
		{"below the floor, a later start", 3, 7, 9, 2, ", or before the subscription's start (new)", DeliverySettled,
			"at or below the ack floor (7), or before the subscription's start (new)"},
		{"not delivered yet", 10, 7, 9, 2, "", DeliveryPending, "not delivered yet (the consumer delivered up to 9)"},
		{"delivered, nothing pending", 8, 7, 9, 0, "", DeliverySettled, "delivered (up to 9) with no ack pending"},
		{"delivered, acks pending", 8, 7, 9, 2, "", DeliveryOutstanding,
			"delivered, above the ack floor (7) with 2 acks pending: in flight, waiting for a retry, or acked out of order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, why := stateAt(tc.seq, tc.floor, tc.delivered, tc.ackPending, tc.start)
			require.Equal(t, tc.state, state)
			require.Equal(t, tc.why, why)
		})
	}
}
