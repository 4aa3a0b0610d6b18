package jsapi_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// LeaderGet returns the message a request names with its own headers,
// found false when none matches, and JetStream's error as an APIError.
func TestLeaderGet(t *testing.T) {
	t.Parallel()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true})
	require.NoError(t, err)
	for _, subject := range []string{"s.a", "s.b", "s.a"} {
		_, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Data: []byte(subject), Header: nats.Header{"K": []string{subject}}})
		require.NoError(t, err)
	}

	m, found, err := jsapi.LeaderGet(t.Context(), js, "S", jsapi.GetRequest{LastFor: "s.a"})
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, uint64(3), m.Seq)
	require.Equal(t, "s.a", m.Subject)
	require.Equal(t, "s.a", m.Header.Get("K"))
	require.Equal(t, []byte("s.a"), m.Data)
	require.False(t, m.Time.IsZero())

	m, found, err = jsapi.LeaderGet(t.Context(), js, "S", jsapi.GetRequest{Seq: 2, NextFor: "s.*"})
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, uint64(2), m.Seq)

	_, found, err = jsapi.LeaderGet(t.Context(), js, "S", jsapi.GetRequest{Seq: 4, NextFor: ">"})
	require.NoError(t, err)
	require.False(t, found, "nothing at or after 4")

	_, _, err = jsapi.LeaderGet(t.Context(), js, "MISSING", jsapi.GetRequest{Seq: 1})
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}
