package main

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// runtimeKit is an embedded JetStream with the events stream, a secrets
// key file, and a way to run `consumer subscriptions ...` commands.
type runtimeKit struct {
	srv     *embedded.Server
	js      jetstream.JetStream
	ctx     context.Context
	keyFile string
	dir     string
}

func newRuntimeKit(t *testing.T) *runtimeKit {
	t.Helper()
	return newRuntimeKitFor(t, 3*time.Minute)
}

// newRuntimeKitFor is newRuntimeKit whose context lasts d.
func newRuntimeKitFor(t *testing.T, d time.Duration) *runtimeKit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	// As the bridge creates it: AllowDirect, which the consumer reads with.
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	dir := t.TempDir()
	key, err := consumer.GenerateSecretsKey("k1")
	require.NoError(t, err)
	k := &runtimeKit{srv: srv, js: js, ctx: ctx, keyFile: filepath.Join(dir, "keys"), dir: dir}
	require.NoError(t, os.WriteFile(k.keyFile, []byte(key+"\n"), 0o600))
	return k
}

// secretFile writes a new whsec_ secret to a file and returns both.
func (k *runtimeKit) secretFile(t *testing.T, name string) (secret, path string) {
	t.Helper()
	secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("runtime-test-"+name+"-0123456789abcdef"))
	path = filepath.Join(k.dir, name)
	require.NoError(t, os.WriteFile(path, []byte(secret+"\n"), 0o600))
	return secret, path
}

// cli runs `consumer subscriptions <args>` as the binary does, against
// the kit's server and key file.
func (k *runtimeKit) cli(t *testing.T, args ...string) error {
	t.Helper()
	_, err := k.cliOut(t, args...)
	return err
}

// cliOut is cli, returning what the command printed.
func (k *runtimeKit) cliOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var cl cli
	parser, err := kong.New(&cl, kong.Name("consumer"), ops.WireVars(), kong.Exit(func(int) { t.Fatal("kong exit") }))
	require.NoError(t, err)
	full := []string{"subscriptions", args[0], "--nats-url", k.srv.ClientURL()}
	if args[0] != "keygen" && args[0] != "enable" && args[0] != "disable" {
		full = append(full, "--secrets-key-file", k.keyFile)
	}
	kctx, err := parser.Parse(append(full, args[1:]...))
	require.NoError(t, err)
	var out strings.Builder
	s := &cl.Subscriptions
	s.Add.out, s.Update.out, s.Get.out, s.List.out, s.Delete.out = &out, &out, &out, &out, &out
	s.Pause.out, s.Resume.out, s.Import.out, s.Export.out, s.Keygen.out, s.Reseal.out = &out, &out, &out, &out, &out, &out
	s.Enable.out, s.Disable.out = &out, &out
	kctx.BindTo(k.ctx, (*context.Context)(nil))
	err = kctx.Run(&cl.Globals)
	return out.String(), err
}

// replica starts a consumer replica on its own connection, its
// subscriptions from the bucket, and stops it at cleanup.
func (k *runtimeKit) replica(t *testing.T, id string) {
	t.Helper()
	_, js := jsbridgetest.Connect(t, k.srv)
	keys, err := os.ReadFile(k.keyFile)
	require.NoError(t, err)
	ring, err := consumer.ParseSecretsKeyring(string(keys))
	require.NoError(t, err)
	store, err := consumer.OpenSubscriptionStore(k.ctx, js, consumer.SubscriptionStoreConfig{Keys: ring})
	require.NoError(t, err)
	c, err := consumer.New(js, consumer.Config{
		SubscriptionStore: store, ReplicaID: id, LeaseTTL: 3 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(k.ctx))
	t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })
}

// publish publishes one event of stream as the bridge does (the parts
// the consumer reads) and returns its id.
func (k *runtimeKit) publish(t *testing.T, id int, stream string) string {
	t.Helper()
	sid := strconv.Itoa(id)
	_, err := k.js.PublishMsg(k.ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, stream, "OrderPlaced"),
		Header: nats.Header{wire.HeaderMsgID: []string{sid}, wire.HeaderType: []string{"OrderPlaced"}, wire.HeaderSubject: []string{stream}},
		Data:   []byte(`{"n":` + sid + `}`)})
	require.NoError(t, err)
	return sid
}

// got is one request the receiver took.
type got struct {
	id, replica string
	// signedWith is the index of the secret whose verifier accepted the
	// request, -1 for none.
	signedWith int
	at         time.Time
}

// recorder is an endpoint verifying each request with each of its
// secrets separately, so that the test sees which one signed it.
type recorder struct {
	mu        sync.Mutex
	got       []got
	verifiers []*webhook.Verifier
	srv       *httptest.Server
}

func newRecorder(t *testing.T, secrets ...string) *recorder {
	t.Helper()
	r := &recorder{}
	for _, s := range secrets {
		v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{s})
		require.NoError(t, err)
		r.verifiers = append(r.verifiers, v)
	}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		g := got{id: req.Header.Get(wire.HeaderIdempotencyKey), replica: req.Header.Get(wire.HeaderReplica), signedWith: -1, at: time.Now()}
		for i, v := range r.verifiers {
			if v.Verify(req.Header, body) == nil {
				g.signedWith = i
				break
			}
		}
		r.mu.Lock()
		r.got = append(r.got, g)
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) all() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.got...)
}

// first returns the first request of event id.
func (r *recorder) first(id string) (got, bool) {
	for _, g := range r.all() {
		if g.id == id {
			return g, true
		}
	}
	return got{}, false
}

// count returns how many requests carried event id.
func (r *recorder) count(id string) int {
	n := 0
	for _, g := range r.all() {
		if g.id == id {
			n++
		}
	}
	return n
}
