package ordertest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Secret is the Standard Webhooks secret the suite's chained webhooks are
// signed with (PostChained) and its verifying receivers hold.
const Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// Chained is one webhook of the version chain, as PostChained sends it in
// binary mode: the ordering fields and the edit, if any, a man in the
// middle makes after the sender signed.
type Chained struct {
	webhook.OrderFields
	// Edit, when set, changes the signed request's headers before it is
	// sent (an altered header, a removed signature).
	Edit func(h http.Header)
}

// Owner returns the ordering fields of version v of stream, after
// previous (-1 for none), sent by partition 0's owner at epoch.
func Owner(stream string, v, previous int64, epoch uint64) Chained {
	return Chained{OrderFields: webhook.OrderFields{Stream: stream, Version: v, Previous: previous, Partition: 0, Epoch: epoch}}
}

// Replay returns the ordering fields of version v of stream, after
// previous, sent by a replay path (no partition, no epoch).
func Replay(stream string, v, previous int64) Chained {
	return Chained{OrderFields: webhook.OrderFields{Stream: stream, Version: v, Previous: previous, Partition: -1}}
}

// PostChained sends c to url as a binary-mode webhook signed with Secret
// (body signature and order signature, Signer.SignOrder), and returns the
// answer, with Jsbridge-Order-Last in Answer.Last.
func PostChained(t testing.TB, url string, c Chained) Answer {
	t.Helper()
	signer, err := webhook.NewSigner(webhook.SchemeStandard, Secret)
	require.NoError(t, err)
	id := c.Stream + "@" + strconv.FormatInt(c.Version, 10)
	body := []byte(`{}`)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	h := req.Header
	h.Set(wire.HeaderSpecVersion, event.SpecVersion)
	h.Set(wire.HeaderID, id)
	h.Set(wire.HeaderSource, Source)
	h.Set(wire.HeaderType, "Happened")
	h.Set(wire.HeaderSubject, wire.EncodeHeaderValue(c.Stream))
	h.Set(wire.HeaderStreamVersion, strconv.FormatInt(c.Version, 10))
	h.Set(wire.HeaderContentType, event.ContentTypeJSON)
	h.Set(wire.HeaderIdempotencyKey, id)
	now := time.Now()
	signer.Sign(h, id, now, body)
	signer.SignOrder(h, id, now, c.OrderFields)
	if c.Edit != nil {
		c.Edit(h)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return Answer{Status: resp.StatusCode, Order: resp.Header.Get(wire.HeaderOrder), Last: resp.Header.Get(wire.HeaderOrderLast),
		RetryAfter: resp.Header.Get("Retry-After"), Body: string(bytes.TrimSpace(got))}
}

// runChain checks the gate's version chain over the store: every path a
// sender has (the partition's owner, dead-letter replay and replay by
// time, the event after a skip), and the order signature.
func runChain(t *testing.T, newStore NewStore) {
	verifier, err := webhook.NewVerifier(webhook.SchemeStandard, []string{Secret})
	require.NoError(t, err)
	verified := webhook.WithGateVerifier(verifier)
	processed := func(t *testing.T, a Answer) {
		t.Helper()
		require.Equal(t, http.StatusNoContent, a.Status, a.Body)
		require.Empty(t, a.Order, a.Body)
	}
	gap := func(t *testing.T, a Answer, last string) {
		t.Helper()
		require.Equal(t, http.StatusConflict, a.Status, a.Body)
		require.Equal(t, wire.OrderGap, a.Order)
		require.Equal(t, last, a.Last, "the gap names what the gate has")
		require.True(t, wire.OrderRetryInPlace(a.Order))
	}
	position := func(t *testing.T, store webhook.OrderStore, stream string) webhook.OrderPosition {
		t.Helper()
		pos, err := store.Position(context.Background(), webhook.OrderKey{Source: Source, Stream: stream})
		require.NoError(t, err)
		return pos
	}

	t.Run("ChainFilteredStream", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t), verified)
		gap(t, PostChained(t, rc.URL, Owner("order-1", 3, 0, 5)), "none")
		processed(t, PostChained(t, rc.URL, Owner("order-1", 0, -1, 5)))
		gap(t, PostChained(t, rc.URL, Owner("order-1", 7, 3, 5)), "0")
		processed(t, PostChained(t, rc.URL, Owner("order-1", 3, 0, 5)))
		processed(t, PostChained(t, rc.URL, Owner("order-1", 7, 3, 5)))
		gap(t, PostChained(t, rc.URL, Owner("order-1", 9, 8, 5)), "7")
		require.Equal(t, []int64{0, 3, 7}, rc.Processed("order-1"))
	})

	t.Run("ChainStartNew", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t), verified)
		processed(t, PostChained(t, rc.URL, Owner("order-1", 40, -1, 5)))
		processed(t, PostChained(t, rc.URL, Owner("order-1", 41, 40, 5)))
		a := PostChained(t, rc.URL, Owner("order-1", 12, 11, 5))
		require.Equal(t, wire.OrderDuplicate, a.Order, "versions before the first processed count as processed")
		require.Equal(t, []int64{40, 41}, rc.Processed("order-1"))
	})

	t.Run("ChainReplay", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		rc := NewReceiver(t, store, verified, webhook.WithGateRequireHeaders())
		for v := range int64(3) {
			processed(t, PostChained(t, rc.URL, Owner("order-1", v, v-1, 9)))
		}
		// v3 dead-lettered; its replay comes from no partition owner.
		gap(t, PostChained(t, rc.URL, Replay("order-1", 4, 3)), "2")
		processed(t, PostChained(t, rc.URL, Replay("order-1", 3, 2)))
		require.Equal(t, webhook.OrderPosition{Version: 3, Epoch: 9, Partition: 0}, position(t, store, "order-1"),
			"a replay keeps the stream's epoch and partition")
		a := PostChained(t, rc.URL, Replay("order-1", 3, 2))
		require.Equal(t, wire.OrderDuplicate, a.Order, "a second replay is a duplicate")
		require.Equal(t, wire.OrderStaleEpoch, PostChained(t, rc.URL, Owner("order-1", 4, 3, 8)).Order, "the stored epoch still refuses a zombie")
		processed(t, PostChained(t, rc.URL, Owner("order-1", 4, 3, 9)))
		require.Equal(t, []int64{0, 1, 2, 3, 4}, rc.Processed("order-1"))
	})

	t.Run("ChainSkip", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t), verified)
		for v := range int64(5) {
			processed(t, PostChained(t, rc.URL, Owner("order-1", v, v-1, 5)))
		}
		// v5 dead-lettered and skipped: v6 carries v5's own predecessor.
		processed(t, PostChained(t, rc.URL, Owner("order-1", 6, 4, 5)))
		require.Equal(t, wire.OrderDuplicate, PostChained(t, rc.URL, Replay("order-1", 5, 4)).Order, "a late replay of the skipped head")
		require.Equal(t, []int64{0, 1, 2, 3, 4, 6}, rc.Processed("order-1"))
	})

	t.Run("ChainLegacySender", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t))
		processed(t, Post(t, rc.URL, "order-1", 0, 5))
		a := Post(t, rc.URL, "order-1", 2, 5)
		require.Equal(t, wire.OrderGap, a.Order, "without a previous version the gate holds v to last+1")
		processed(t, Post(t, rc.URL, "order-1", 1, 5))
		processed(t, PostChained(t, rc.URL, Owner("order-1", 4, 1, 5))) // a chained sender goes on from there
		strict := NewReceiver(t, newStore(t), webhook.WithGateRequireHeaders())
		a = Post(t, strict.URL, "order-1", 0, 5)
		require.Equal(t, http.StatusBadRequest, a.Status)
		require.Equal(t, "missing-ordering-header", a.Body)
		require.Equal(t, []int64{0, 1, 4}, rc.Processed("order-1"))
		require.Empty(t, strict.Processed("order-1"))
	})

	t.Run("ChainAlteredHeaderRefused", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t), verified)
		processed(t, PostChained(t, rc.URL, Owner("order-1", 0, -1, 5)))
		next := Owner("order-1", 1, 0, 5)
		for name, edit := range map[string]func(h http.Header){
			"stream":    func(h http.Header) { h.Set(wire.HeaderSubject, "order-2") },
			"version":   func(h http.Header) { h.Set(wire.HeaderStreamVersion, "2") },
			"previous":  func(h http.Header) { h.Set(wire.HeaderPreviousVersion, wire.PreviousNone) },
			"partition": func(h http.Header) { h.Set(wire.HeaderPartition, "1") },
			"epoch":     func(h http.Header) { h.Set(wire.HeaderLeaseEpoch, "6") },
			"owner-dropped": func(h http.Header) {
				h.Del(wire.HeaderPartition)
				h.Del(wire.HeaderLeaseEpoch)
			},
		} {
			c := next
			c.Edit = edit
			a := PostChained(t, rc.URL, c)
			require.Equal(t, http.StatusUnauthorized, a.Status, name)
			require.Equal(t, "bad-order-signature", a.Body, name)
		}
		c := next
		c.Edit = func(h http.Header) { h.Del(wire.HeaderOrderSignature) }
		a := PostChained(t, rc.URL, c)
		require.Equal(t, http.StatusUnauthorized, a.Status)
		require.Equal(t, "missing-order-signature", a.Body)
		require.Equal(t, []int64{0}, rc.Processed("order-1"), "nothing altered is processed")
		require.Empty(t, rc.Processed("order-2"))
		processed(t, PostChained(t, rc.URL, next))
	})
}
