package attempt_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/wire"
)

func TestOrderFieldsOfNeedsAVersionAndAStream(t *testing.T) {
	t.Parallel()
	h := nats.Header{wire.HeaderStreamVersion: []string{"4"}, wire.HeaderSubject: []string{wire.EncodeHeaderValue("order-1 a")}}
	f := attempt.OrderFieldsOf(h, 3, 2, 77)
	require.NotNil(t, f)
	require.Equal(t, "order-1 a", f.Stream, "decoded, as the gate reads it")
	require.Equal(t, int64(4), f.Version)
	require.Equal(t, int64(3), f.Previous)
	require.Equal(t, 2, f.Partition)
	require.Equal(t, uint64(77), f.Epoch)
	require.Nil(t, attempt.OrderFieldsOf(nats.Header{wire.HeaderSubject: []string{"order-1"}}, 3, 2, 77), "no version: no chain")
	require.Nil(t, attempt.OrderFieldsOf(nats.Header{wire.HeaderStreamVersion: []string{"4"}}, 3, 2, 77), "no stream: no chain")
}
