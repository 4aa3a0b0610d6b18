package deliver_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// A window needs Since, an Until after it, and at most one of Stream and
// Match; the error names the field and the value.
func TestWindowValidate(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	require.NoError(t, deliver.Window{Since: since}.Validate())
	require.NoError(t, deliver.Window{Since: since, Until: since.Add(time.Minute), Stream: "order-1"}.Validate())
	for name, tc := range map[string]struct {
		w    deliver.Window
		want string
	}{
		"no since":       {deliver.Window{}, "Since is required"},
		"until = since":  {deliver.Window{Since: since, Until: since}, "Until 2026-11-29T10:00:00Z is not after Since 2026-11-29T10:00:00Z"},
		"stream & match": {deliver.Window{Since: since, Stream: "order-1", Match: regexp.MustCompile("^order-")}, `Stream "order-1" and Match "^order-": give one`},
	} {
		err := tc.w.Validate()
		require.ErrorIs(t, err, deliver.ErrInvalidWindow, name)
		require.ErrorContains(t, err, tc.want, name)
	}
}

// A replay of one source stream narrows each of the subscription's
// filters to that stream's subjects, dropping those that cannot match it;
// without a stream the filters are the subscription's.
func TestWindowFilters(t *testing.T) {
	t.Parallel()
	subs := []string{"events.order.>", "events.*.*.Refunded", "events.invoice.>"}
	require.Equal(t, subs, deliver.WindowFilters(subs, "events", ""))
	require.Equal(t, []string{"events.order.order-42.>", "events.order.order-42.Refunded"}, deliver.WindowFilters(subs, "events", "order-42"))
	require.Empty(t, deliver.WindowFilters([]string{"events.invoice.>"}, "events", "order-42"), "the subscription selects nothing of the stream")
}

// A dead letter's replay names the predecessor its failed attempt named,
// as no partition's owner; a letter without the chain goes without it.
func TestReplayOrder(t *testing.T) {
	t.Parallel()
	h := nats.Header{}
	h.Set(wire.HeaderStreamVersion, "4")
	h.Set(wire.HeaderSubject, wire.EncodeHeaderValue("order-42"))
	require.Equal(t, &webhook.OrderFields{Stream: "order-42", Version: 4, Previous: 2, Partition: -1},
		deliver.ReplayOrder(deadletter.Stored{Header: h, PreviousVersion: wire.FormatPreviousVersion(2)}))
	require.Equal(t, &webhook.OrderFields{Stream: "order-42", Version: 4, Previous: -1, Partition: -1},
		deliver.ReplayOrder(deadletter.Stored{Header: h, PreviousVersion: wire.FormatPreviousVersion(-1)}), "the stream's first delivered")
	require.Nil(t, deliver.ReplayOrder(deadletter.Stored{Header: h}), "stored without the chain")
	require.Nil(t, deliver.ReplayOrder(deadletter.Stored{Header: h, PreviousVersion: "-3"}), "a predecessor that does not parse")
}
