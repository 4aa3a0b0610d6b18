package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
)

// ClaimFetch over markers (migration 009) claims, of the streams appended
// to since the last claim, those the claim would take without markers:
// one appended to while caught up and free, or whose lease ran out (named
// as the previous holder); never one another owner holds, one in backoff
// or a blocked one. Those keep their state, and their markers' events are
// claimed when they become claimable; a stream under another owner's live
// lease keeps its markers too, folded once that owner settled it.
func TestClaimFetchOverMarkersClaimsOnlyClaimableStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimAll := func(owner string) ([]event.Claim, []event.Event) {
		t.Helper()
		claims, events, err := b.store.ClaimFetch(b.ctx, owner, 10, time.Minute, 10)
		require.NoError(t, err)
		return claims, events
	}
	for _, s := range []string{"held-1", "later-1", "bad-1", "ended-1"} {
		b.appendN(t, s, 1)
	}
	claims, events := claimAll("x")
	require.Len(t, claims, 4)
	byStream := map[string]event.Event{}
	for _, e := range events {
		byStream[e.Stream] = e
	}
	// held-1 stays leased by x; later-1 goes into backoff, bad-1 is
	// blocked and ended-1's lease ends with it caught up.
	later, bad, ended := byStream["later-1"], byStream["bad-1"], byStream["ended-1"]
	require.NoError(t, b.store.Retry(b.ctx, "x", "later-1", later.Version, later.ID, time.Hour, "receiver down"))
	require.NoError(t, b.store.Block(b.ctx, "x", "bad-1", bad.Version, bad.ID, "poison"))
	require.NoError(t, b.store.Postpone(b.ctx, "x", "ended-1", ended.Version, ended.ID, 0, "shutting down"))

	for _, s := range []string{"held-1", "later-1", "bad-1", "ended-1", "new-1"} {
		b.appendN(t, s, 1)
	}
	require.Equal(t, 5, b.markers(t))
	claims, events = claimAll("a")
	require.Equal(t, 1, b.markers(t), "every marker folded but held-1's: x's live lease keeps it for a fold after x settles")
	var heldHead int64
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT head FROM "+b.store.Schema()+".streams WHERE stream = 'held-1'").Scan(&heldHead))
	require.Equal(t, int64(0), heldHead, "a row under another's live lease is not written by the claim's fold")
	require.ElementsMatch(t, []string{"ended-1", "new-1"}, claimedNames(claims))
	for _, c := range claims {
		switch c.Stream {
		case "ended-1":
			require.Equal(t, "x", c.PreviousHolder, "the holder whose lease ended")
			require.Equal(t, int64(0), c.Watermark)
		case "new-1":
			require.Empty(t, c.PreviousHolder)
			require.Equal(t, int64(-1), c.Watermark)
		}
		require.Equal(t, 0, c.Retry)
		require.True(t, c.LeasedUntil.After(time.Now().Add(30*time.Second)), "leased for the claim's lease")
	}
	require.Len(t, events, 2)
	for _, e := range events {
		want := int64(0)
		if e.Stream == "ended-1" {
			want = 1
		}
		require.Equal(t, want, e.Version, "%s: the events past the watermark", e.Stream)
	}

	held := b.info(t, "held-1")
	require.Equal(t, "x", held.LeasedBy, "another owner's live lease is kept")
	require.Equal(t, int64(1), held.Head, "the readers' fold (Streams) counts every committed event")
	require.Equal(t, 1, b.info(t, "later-1").Retry)
	require.True(t, b.info(t, "bad-1").Blocked)
	require.Equal(t, int64(1), b.info(t, "bad-1").Head)
	require.Equal(t, int64(1), b.info(t, "later-1").Head)

	// x's lease still fences: its ack takes, a's claim did not touch it.
	require.NoError(t, b.store.Ack(b.ctx, "x", "held-1", 0, byStream["held-1"].ID))
	claims, events = claimAll("a")
	require.Equal(t, []string{"held-1"}, claimedNames(claims), "pending again after x's ack")
	require.Len(t, events, 1)
	require.Equal(t, int64(1), events[0].Version)
}

// Under a backlog ClaimFetch over markers takes the oldest due streams, a
// stream with a marker among them (a hot stream is never passed over for
// being appended to again); a stream the fold makes pending waits its
// turn by age.
func TestClaimFetchOverMarkersUnderABacklogKeepsOldestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "old-1", 1)
	b.appendN(t, "old-2", 1)
	b.appendN(t, "old-3", 1)
	_, _, err := b.store.Totals(b.ctx) // folds: the three are pending
	require.NoError(t, err)
	b.appendN(t, "new-1", 1)
	b.appendN(t, "old-1", 1)

	claims, events, err := b.store.ClaimFetch(b.ctx, "a", 2, time.Minute, 10)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"old-1", "old-2"}, claimedNames(claims))
	require.Len(t, events, 3, "old-1's two events and old-2's")
	require.Zero(t, b.markers(t))
	require.Equal(t, int64(1), b.info(t, "new-1").Lag, "pending, not leased")
	require.Empty(t, b.info(t, "new-1").LeasedBy)

	claims, _, err = b.store.ClaimFetch(b.ctx, "b", 2, time.Minute, 10)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"old-3", "new-1"}, claimedNames(claims))
}
