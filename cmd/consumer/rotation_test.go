package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// rotatingReceiver is an endpoint verifying with package webhook whose
// secrets can be swapped while it runs, as a receiver's rolling deploy
// does; it counts what failed verification.
type rotatingReceiver struct {
	verifier atomic.Pointer[webhook.Verifier]
	failures atomic.Int64
	mu       sync.Mutex
	ids      map[string]bool
	// sigs is, per replica, how many signatures its last request carried.
	sigs map[string]int
	srv  *httptest.Server
}

func newRotatingReceiver(t *testing.T, secrets ...string) *rotatingReceiver {
	t.Helper()
	r := &rotatingReceiver{ids: map[string]bool{}, sigs: map[string]int{}}
	r.verify(t, secrets...)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := r.verifier.Load().Verify(req.Header, body); err != nil {
			r.failures.Add(1)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		r.mu.Lock()
		r.ids[req.Header.Get(wire.HeaderIdempotencyKey)] = true
		r.sigs[req.Header.Get(wire.HeaderReplica)] = len(strings.Fields(req.Header.Get("webhook-signature")))
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// verify makes the receiver accept signatures by secrets from now on.
func (r *rotatingReceiver) verify(t *testing.T, secrets ...string) {
	v, err := webhook.NewVerifier(webhook.SchemeStandard, secrets)
	require.NoError(t, err)
	r.verifier.Store(v)
}

// signing reports whether the last request of every replica carried n
// signatures.
func (r *rotatingReceiver) signing(n int, replicas ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range replicas {
		if r.sigs[id] != n {
			return false
		}
	}
	return true
}

func (r *rotatingReceiver) delivered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// The rotation procedure of docs/operations.md ("Rotating a signing
// secret"), step by step, while two replicas deliver a steady 100 events a
// second: the sender signs with the new and the old secret, the receiver
// adds the new one, the sender drops the old one, the receiver drops it
// too. No request fails verification and every event is delivered.
func TestSecretRotationUnderLoadHasNoSignatureFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two consumer replicas and delivers for seconds")
	}
	t.Parallel()
	k := newRuntimeKit(t)
	oldSecret, oldFile := k.secretFile(t, "old")
	newSecret, newFile := k.secretFile(t, "new")
	rc := newRotatingReceiver(t, oldSecret)
	k.replica(t, "r1")
	k.replica(t, "r2")
	require.NoError(t, k.cli(t, "add", "orders", "--url", rc.srv.URL, "--filter", "events.order.>", "--secret-file", oldFile, "--allow-private"))

	// The load: 100 events a second over 16 streams until stopped.
	var published atomic.Int64
	stop := make(chan struct{})
	loadDone := make(chan error, 1)
	go func() {
		versions := map[string]int{} // per stream, as the bridge numbers them
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stop:
				loadDone <- nil
				return
			case <-tick.C:
			}
			stream, id := fmt.Sprintf("order-%d", n%16), strconv.Itoa(n)
			version := versions[stream]
			versions[stream]++
			_, err := k.js.PublishMsg(k.ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, stream, "OrderPlaced"),
				Header: nats.Header{wire.HeaderMsgID: []string{id}, wire.HeaderType: []string{"OrderPlaced"}, wire.HeaderSubject: []string{stream},
					wire.HeaderStreamVersion: []string{strconv.Itoa(version)}},
				Data: []byte(`{}`)})
			if err != nil {
				loadDone <- err
				return
			}
			published.Add(1)
		}
	}()
	step := func(what string, cond func() bool) {
		t.Helper()
		began := time.Now()
		require.Eventually(t, cond, 30*time.Second, 5*time.Millisecond, what)
		t.Logf("%s: %s (%d published, %d delivered, %d signature failures)", what, time.Since(began).Round(time.Millisecond),
			published.Load(), rc.delivered(), rc.failures.Load())
	}
	step("both replicas deliver, signed with the old secret", func() bool { return rc.signing(1, "r1", "r2") })

	// 1. The sender signs with both, the new one first.
	require.NoError(t, k.cli(t, "update", "orders", "--secret-file", newFile, "--secret-file", oldFile))
	step("1. both replicas send two signatures", func() bool { return rc.signing(2, "r1", "r2") })
	// 2. The receiver accepts the new secret (and still the old one).
	rc.verify(t, newSecret, oldSecret)
	n := rc.delivered()
	step("2. the receiver verifies with both", func() bool { return rc.delivered() > n+50 })
	// 3. The sender drops the old secret.
	require.NoError(t, k.cli(t, "update", "orders", "--secret-file", newFile))
	step("3. both replicas send one signature, the new one", func() bool { return rc.signing(1, "r1", "r2") })
	// 4. The receiver drops the old secret.
	rc.verify(t, newSecret)
	n = rc.delivered()
	step("4. the receiver verifies with the new one alone", func() bool { return rc.delivered() > n+50 })

	close(stop)
	require.NoError(t, <-loadDone)
	step("every event delivered", func() bool { return rc.delivered() == int(published.Load()) })
	require.Zero(t, rc.failures.Load(), "no request failed verification")
}
