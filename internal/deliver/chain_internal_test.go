package deliver

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/wire"
)

// chainMsg is a message of stream version v at copy sequence seq.
type chainMsg struct {
	jetstream.Msg
	v   string
	seq uint64
}

func (m chainMsg) Headers() nats.Header { return nats.Header{wire.HeaderStreamVersion: []string{m.v}} }
func (m chainMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}}, nil
}

func TestChainPreviousKnowsWhatItDeliveredAndLooksUpTheRest(t *testing.T) {
	t.Parallel()
	var lookups []uint64
	answer, fail := int64(6), error(nil)
	c := newChain(func(_ context.Context, key string, seq uint64) (int64, error) {
		require.Equal(t, "k", key)
		lookups = append(lookups, seq)
		return answer, fail
	})
	ctx := context.Background()

	p, err := c.previous(ctx, "k", chainMsg{v: "0", seq: 3})
	require.NoError(t, err)
	require.Equal(t, noPrevious, p, "nothing comes before a stream's version 0")
	require.Empty(t, lookups)

	p, err = c.previous(ctx, "k", chainMsg{v: "9", seq: 40})
	require.NoError(t, err)
	require.Equal(t, int64(6), p, "a stream's first event since taken: looked up")
	require.Equal(t, []uint64{40}, lookups)

	c.delivered("k", 9)
	p, err = c.previous(ctx, "k", chainMsg{v: "11", seq: 44})
	require.NoError(t, err)
	require.Equal(t, int64(9), p, "then what it delivered")
	require.Len(t, lookups, 1)

	c.forget("k")
	fail = errors.New("no JetStream")
	_, err = c.previous(ctx, "k", chainMsg{v: "11", seq: 44})
	require.ErrorIs(t, err, fail, "forgotten: looked up again, and its error is returned")
}

// TestChainRedeliveryIsLookedUp: JetStream redelivers a version the
// partition already delivered (its ack lost in a failover): its
// predecessor is looked up, never named as the version itself or a later
// one, and delivering it again does not move the chain back.
func TestChainRedeliveryIsLookedUp(t *testing.T) {
	t.Parallel()
	var lookups []uint64
	c := newChain(func(_ context.Context, _ string, seq uint64) (int64, error) {
		lookups = append(lookups, seq)
		return 8, nil
	})
	ctx := context.Background()
	c.delivered("k", 9)
	p, err := c.previous(ctx, "k", chainMsg{v: "9", seq: 40})
	require.NoError(t, err)
	require.Equal(t, int64(8), p, "a redelivered version 9 names its own predecessor")
	require.Equal(t, []uint64{40}, lookups)

	c.delivered("k", 10)
	c.delivered("k", 9) // the redelivery answered duplicate
	p, err = c.previous(ctx, "k", chainMsg{v: "11", seq: 50})
	require.NoError(t, err)
	require.Equal(t, int64(10), p, "the chain keeps the latest version delivered")
	require.Len(t, lookups, 1)
}

func TestChainNoLookupNamesNone(t *testing.T) {
	t.Parallel()
	p, err := newChain(nil).previous(context.Background(), "k", chainMsg{v: "5", seq: 9})
	require.NoError(t, err)
	require.Equal(t, noPrevious, p)
}

func TestChainStartSurvivesAConsumerMadeAgainFromItsFloor(t *testing.T) {
	t.Parallel()
	require.Zero(t, chainStart(jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}))
	first := jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 40}
	require.Equal(t, uint64(40), chainStart(first))
	// ensureConsumer's remake: keepStart, then the start after the floor.
	again := jetstream.ConsumerConfig{}
	keepStart(&again, first)
	recordChainFrom(&again, chainStart(first))
	again.OptStartSeq = 901
	require.Equal(t, uint64(40), chainStart(again), "the chain still starts where the subscription did")
	// An update of the remade consumer keeps it.
	upd := jetstream.ConsumerConfig{}
	keepStart(&upd, again)
	require.Equal(t, uint64(40), chainStart(upd))
}

// TestChainUnversionedMessageLooksNothingUp: a message without
// ce-streamversion (published to the events stream by another program)
// goes without the chain: no look-up, so nothing holds its stream (a
// look-up of its unversioned predecessor failed, and retried for ever).
func TestChainUnversionedMessageLooksNothingUp(t *testing.T) {
	t.Parallel()
	c := newChain(func(context.Context, string, uint64) (int64, error) {
		return 0, errors.New("looked up")
	})
	c.delivered("k", 3)
	for range 2 {
		p, err := c.previous(context.Background(), "k", chainMsg{v: "", seq: 9})
		require.NoError(t, err)
		require.Equal(t, noPrevious, p)
	}
}
