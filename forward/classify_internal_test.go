package forward

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
)

// Which failures are an outage (drain.UnavailableError: the stream backs
// off without counting a retry and is never blocked) and under which
// metric class: every way JetStream can fail to answer in time is one.
func TestClassifyOutages(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("publish event 7 of stream %q: %w", "order-1", err) }
	for _, c := range []struct {
		name        string
		err         error
		class       string
		unavailable bool
	}{
		{"publish timeout", fmt.Errorf("no PubAck within 5s: %w", context.DeadlineExceeded), ClassTimeout, true},
		{"cut by the cycle's deadline", fmt.Errorf("no PubAck for the batch before the cycle's deadline: %w", context.DeadlineExceeded), ClassTimeout, true},
		{"cut at shutdown", fmt.Errorf("no PubAck before the cycle's deadline: %w", context.Canceled), ClassCanceled, true},
		{"request timeout", nats.ErrTimeout, ClassTimeout, true},
		{"async publish timeout", jetstream.ErrAsyncPublishTimeout, ClassTimeout, true},
		{"async publishes stalled", jetstream.ErrTooManyStalledMsgs, ClassTimeout, true},
		{"no responders", nats.ErrNoResponders, ClassNoResponders, true},
		{"no stream response", jetstream.ErrNoStreamResponse, ClassNoResponders, true},
		{"stream not found", jetstream.ErrStreamNotFound, ClassNoResponders, true},
		{"connection closed", nats.ErrConnectionClosed, ClassConnection, true},
		{"reconnecting", nats.ErrConnectionReconnecting, ClassConnection, true},
		{"disconnected", nats.ErrDisconnected, ClassConnection, true},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, ClassConnection, true},
		{"draining", nats.ErrConnectionDraining, ClassConnection, true},
		{"JetStream not enabled (503)", jetstream.ErrJetStreamNotEnabled, ClassOther, true},
		{"API 503", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, ClassOther, true},
		{"insufficient resources (503)", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}, ClassStorage, true},
		{"account storage limit (400)", &jetstream.APIError{Code: 400, ErrorCode: 10002, Description: "resource limits exceeded for account"}, ClassStorage, true},
		{"store refused the write", &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum bytes exceeded"}, ClassStorage, true},
		{"fast batch the server forgot", &jetstream.APIError{Code: 400, ErrorCode: 10208, Description: "batch publish ID unknown"}, ClassOther, true},
		{"wrong last sequence", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, ClassOther, false},
		{"message too large", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, ClassOther, false},
		{"anything else", errors.New("permission denied"), ClassOther, false},
	} {
		err := classify(wrap(c.err))
		require.Equal(t, c.unavailable, drain.IsUnavailable(err), c.name)
		require.ErrorIs(t, err, c.err, "%s: the cause stays visible", c.name)
		require.Equal(t, c.class, ErrorClass(err), c.name)
	}
	require.NoError(t, classify(nil))
	require.Empty(t, ErrorClass(nil))
}
