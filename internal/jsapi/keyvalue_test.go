package jsapi_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// KeyValue creates a missing bucket with the configuration given, and
// opens an existing one as it is, whatever configuration is given.
func TestKeyValueCreatesWhenMissingAndTakesAnExistingOneAsItIs(t *testing.T) {
	t.Parallel()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	ctx := t.Context()

	kv, err := jsapi.KeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "things", History: 5})
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), st.History(), "created with the configuration given")
	_, err = kv.Put(ctx, "a", []byte("1"))
	require.NoError(t, err)

	again, err := jsapi.KeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "things", History: 1})
	require.NoError(t, err)
	st, err = again.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), st.History(), "an existing bucket is not changed")
	e, err := again.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "1", string(e.Value()))
}
