package position

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
)

// setup starts an embedded JetStream server and opens the positions
// bucket on it; everything stops at cleanup.
func setup(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := Bucket(context.Background(), js, "", 1)
	require.NoError(t, err)
	require.Equal(t, DefaultBucket, kv.Bucket())
	return js, kv
}

// claim claims partition 0 for owner under epoch, on clock.
func claim(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, owner string, epoch uint64, clock clockwork.Clock) *Partition {
	t.Helper()
	p, err := Claim(context.Background(), js, kv, Config{Owner: owner, Epoch: epoch, Archetype: base.New(clock, nil, "")})
	require.NoError(t, err)
	return p
}

// running is a Partition.Run in the background until cleanup.
type running struct {
	done chan struct{}
	err  error
}

func run(t *testing.T, p *Partition) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{done: make(chan struct{})}
	go func() { r.err = p.Run(ctx); close(r.done) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// stored reads partition 0's record from the bucket, and its revision.
func stored(t *testing.T, kv jetstream.KeyValue) (Record, uint64) {
	t.Helper()
	e, err := kv.Get(context.Background(), Key(0))
	require.NoError(t, err)
	r, err := decodeRecord(e.Value())
	require.NoError(t, err)
	return r, e.Revision()
}

// waitFor runs Wait in the background; its result comes on the channel.
// decodeRecord reads a record that names no members key.
func decodeRecord(b []byte) (Record, error) {
	r, ref, err := record.DecodeRecordRef(b)
	if err == nil && ref.Key != "" {
		err = fmt.Errorf("the record names members key %q", ref.Key)
	}
	return r, err
}

func waitFor(p *Partition, sub, stream string, seq uint64) <-chan error {
	c := make(chan error, 1)
	go func() { c <- p.Wait(context.Background(), sub, stream, seq) }()
	return c
}

// blockUntil waits (10 s at most) until something waits on clock.
func blockUntil(t *testing.T, clock *clockwork.FakeClock) error {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return clock.BlockUntilContext(ctx, 1)
}

func pending[T any](c <-chan T) bool {
	select {
	case <-c:
		return false
	default:
		return true
	}
}

// A former owner's commit fails with ErrLost once a new owner claimed
// the record, and its Run ends; the new owner read what it committed
// before. A claim under an epoch below the record's fails the same way.
func TestAFormerOwnersCommitFailsAfterANewClaim(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	first := claim(t, js, kv, "replica-a", 7, clock)
	firstRun := run(t, first)
	first.Settled("s1", "order-1", Entry{Seq: 10, Version: 3})
	require.NoError(t, first.Wait(ctx, "s1", "order-1", 10))

	second := claim(t, js, kv, "replica-b", 8, clock)
	taken := second.Record()
	require.True(t, taken.Covers("s1", "order-1", 10), "the new owner read what the former one committed")

	first.Settled("s1", "order-1", Entry{Seq: 11, Version: 4})
	err := first.Wait(ctx, "s1", "order-1", 11)
	require.ErrorIs(t, err, ErrLost)
	<-firstRun.done
	require.ErrorIs(t, firstRun.err, ErrLost, "its commit loop ends")
	require.ErrorIs(t, first.Wait(ctx, "s1", "order-1", 12), ErrLost, "and every later wait fails at once")
	rec, _ := stored(t, kv)
	require.Equal(t, "replica-b", rec.Owner)
	require.False(t, rec.Covers("s1", "order-1", 11), "nothing of the former owner was written after the claim")

	_, err = Claim(ctx, js, kv, Config{Owner: "replica-a", Epoch: 7})
	require.ErrorIs(t, err, ErrLost, "a claim under a lower epoch than the record's")
}

// answerLostKV is a bucket whose next Update writes and then loses its
// answer (a KV stream leader killed or starved between the two).
type answerLostKV struct {
	jetstream.KeyValue
	lose atomic.Bool
}

func (kv *answerLostKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, last)
	if err == nil && kv.lose.CompareAndSwap(true, false) {
		return 0, nats.ErrNoResponders
	}
	return rev, err
}

// A commit whose answer was lost but which landed is the owner's own: the
// next commit's compare-and-set is refused, the record read from the
// leader still carries the claim's token, and the commit goes again from
// its revision; the owner keeps the partition. The same replica claiming
// it anew is another claim, whose token stops the first.
func TestACommitWhoseAnswerWasLostIsNotTakenForANewOwners(t *testing.T) {
	t.Parallel()
	js, bucket := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	kv := &answerLostKV{KeyValue: bucket}
	p := claim(t, js, kv, "replica-a", 1, clock)
	pr := run(t, p)

	kv.lose.Store(true)
	p.Settled("s1", "order-1", Entry{Seq: 10, Version: 3})
	w := waitFor(p, "s1", "order-1", 10)
	require.Eventually(t, func() bool { r, _ := stored(t, bucket); return r.Covers("s1", "order-1", 10) }, 5*time.Second, 5*time.Millisecond,
		"the commit landed")
	// Its answer was lost: Run pauses (on the clock) and commits again.
	require.NoError(t, blockUntil(t, clock), "Run pauses on the clock")
	require.True(t, pending(w), "not released by a commit whose answer was lost")
	clock.Advance(time.Second)
	require.NoError(t, <-w, "released by the commit that went again from the landed revision")
	rec, _ := stored(t, bucket)
	require.Equal(t, "replica-a", rec.Owner)
	require.True(t, pending((<-chan struct{})(pr.done)), "the partition is still this owner's")

	again := claim(t, js, bucket, "replica-a", 1, clock)
	require.NotEqual(t, p.token, again.token)
	p.Settled("s1", "order-1", Entry{Seq: 11, Version: 4})
	require.ErrorIs(t, p.Wait(ctx, "s1", "order-1", 11), ErrLost, "another claim's token, even the same replica's")
}

// A waiter is released by a commit that covers its settlement, at once
// (without the linger), and by no commit that does not.
func TestAWaiterIsReleasedOnlyByACommitCoveringIt(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock() // never advanced: no commit lingers its way out
	p := claim(t, js, kv, "replica-a", 1, clock)
	run(t, p)

	p.Settled("s1", "order-1", Entry{Seq: 10, Version: 1})
	require.NoError(t, p.Wait(ctx, "s1", "order-1", 10), "a waiter makes the commit go at once")

	w := waitFor(p, "s1", "order-1", 11)
	require.Eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.waiters) == 1 }, 5*time.Second, time.Millisecond)
	p.Settled("s2", "order-1", Entry{Seq: 11, Version: 2}) // another subscription's settlement
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.stored.Covers("s2", "order-1", 11)
	}, 5*time.Second, 5*time.Millisecond, "a commit holding s2's settlement succeeded")
	require.True(t, pending(w), "that commit does not cover s1's version 2")
	r, _ := stored(t, kv)
	require.False(t, r.Covers("s1", "order-1", 11))

	p.Settled("s1", "order-1", Entry{Seq: 11, Version: 2})
	require.NoError(t, <-w)
	r, _ = stored(t, kv)
	require.True(t, r.Covers("s1", "order-1", 11), "released once the stored record held it")
}

// Settlements that nobody waits for linger: no commit before
// Config.Linger (on the clock) from the first of them, then one commit
// holding them all; an idle partition commits nothing.
func TestCommitsLingerAndCoalesce(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	clock := clockwork.NewFakeClock()
	p := claim(t, js, kv, "replica-a", 1, clock)
	run(t, p)
	_, claimed := stored(t, kv)

	p.Settled("s1", "order-1", Entry{Seq: 10, Version: 1})
	p.Settled("s1", "order-2", Entry{Seq: 11, Version: 5})
	p.Settled("s2", "order-1", Entry{Seq: 10, Version: 1})
	require.NoError(t, blockUntil(t, clock), "Run lingers on its timer")
	clock.Advance(DefaultLinger - time.Millisecond)
	_, rev := stored(t, kv)
	require.Equal(t, claimed, rev, "nothing committed before the linger ran out")

	clock.Advance(time.Millisecond)
	require.Eventually(t, func() bool { _, rev := stored(t, kv); return rev > claimed }, 5*time.Second, 5*time.Millisecond)
	r, rev := stored(t, kv)
	require.Equal(t, claimed+1, rev, "one commit")
	require.True(t, r.Covers("s1", "order-1", 10) && r.Covers("s1", "order-2", 11) && r.Covers("s2", "order-1", 10), "holding all three")

	require.Eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return !p.dirty && p.rev == rev }, 5*time.Second, 5*time.Millisecond)
	clock.Advance(10 * DefaultLinger)
	_, idle := stored(t, kv)
	require.Equal(t, rev, idle, "an idle partition writes nothing")
}

// The record's size cap: the subscription whose entries make it grow is
// given a cursor key (written before the commit that drops it), its
// waiters are released by that key, the others keep their entries in the
// record, and its later settlements move its cursor.
func TestTheSizeCapGivesTheGrowingSubscriptionACursor(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var detached []string
	p, err := Claim(ctx, js, kv, Config{Owner: "replica-a", Epoch: 1, MaxSize: 1024, Archetype: base.New(clockwork.NewFakeClock(), nil, ""),
		CursorMade: func(sub string) { mu.Lock(); detached = append(detached, sub); mu.Unlock() }})
	require.NoError(t, err)
	run(t, p)
	p.Edit(func(r *Record) { r.Members["small"], r.Members["big"] = 0, 0 })
	for k := range 20 {
		p.Settled("small", fmt.Sprintf("user-%d", k), Entry{Seq: 500 + uint64(k), Version: 1})
	}
	for k := range 200 {
		p.Settled("big", fmt.Sprintf("order-%03d", k), Entry{Seq: 1000 + uint64(k), Version: uint64(k)})
	}
	require.NoError(t, p.Wait(ctx, "big", "order-199", 1199))
	require.NoError(t, p.Wait(ctx, "small", "user-19", 519))

	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(detached) > 0 }, 5*time.Second, 5*time.Millisecond)
	mu.Lock()
	require.Equal(t, []string{"big"}, detached, "the owner is told")
	mu.Unlock()
	e, err := kv.Get(ctx, CursorKey("big", 0))
	require.NoError(t, err)
	require.Equal(t, "cur.big.p0", e.Key())
	c, err := record.DecodeCursor(e.Value())
	require.NoError(t, err)
	require.Equal(t, "behind", c.State)
	for k := range 200 {
		require.True(t, c.Covers(fmt.Sprintf("order-%03d", k), 1000+uint64(k)))
	}
	got, err := kv.Get(ctx, Key(0))
	require.NoError(t, err)
	require.LessOrEqual(t, len(got.Value()), 1024)
	r, err := decodeRecord(got.Value())
	require.NoError(t, err)
	require.NotContains(t, r.Ahead, "big")
	require.NotContains(t, r.Members, "big")
	require.Len(t, r.Ahead["small"], 20)
	require.Contains(t, p.Cursors(), "big")

	p.Settled("big", "order-000", Entry{Seq: 2000, Version: 200})
	require.NoError(t, p.Wait(ctx, "big", "order-000", 2000))
	e, err = kv.Get(ctx, CursorKey("big", 0))
	require.NoError(t, err)
	c, err = record.DecodeCursor(e.Value())
	require.NoError(t, err)
	require.Equal(t, Entry{Seq: 2000, Version: 200}, c.Streams["order-000"], "its cursor moved")
}

// A claim loads the partition's cursors, and drops a cursor key whose
// subscription the record lists as live (its commit never landed). A
// rejoined subscription is live from its cursor's floor with the
// cursor's entries, and its key is deleted after the commit listing it.
func TestACursorIsLoadedByTheClaimAndDeletedAfterItsRejoin(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	first := claim(t, js, kv, "replica-a", 1, clock)
	run(t, first)
	first.Edit(func(r *Record) { r.Floor, r.Members["live"], r.Members["slow"] = 100, 0, 0 })
	first.Detach("slow", "paused")
	first.Settled("slow", "order-1", Entry{Seq: 105, Version: 7})
	require.NoError(t, first.Wait(ctx, "slow", "order-1", 105))
	// A cursor key of a live subscription: written before a commit that
	// never landed.
	stale := Cursor{State: "behind", Floor: 100}
	_, err := kv.Create(ctx, CursorKey("live", 0), stale.Encode())
	require.NoError(t, err)

	second := claim(t, js, kv, "replica-b", 2, clock)
	run(t, second)
	cursors := second.Cursors()
	require.Equal(t, []string{"slow"}, keys(cursors))
	require.Equal(t, "paused", cursors["slow"].State)
	require.True(t, cursors["slow"].Covers("order-1", 105))
	_, err = kv.Get(ctx, CursorKey("live", 0))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the stale key was deleted")

	second.Edit(func(r *Record) { r.Floor = 140 })
	require.False(t, second.Rejoin("slow"), "not while its cursor is below the record's floor")
	require.True(t, second.EditCursor("slow", func(c *Cursor) { c.Floor = 150 }))
	require.True(t, second.Rejoin("slow"))
	require.False(t, second.Rejoin("slow"), "once")
	second.Settled("live", "order-2", Entry{Seq: 160, Version: 1})
	require.NoError(t, second.Wait(ctx, "live", "order-2", 160))
	r, _ := stored(t, kv)
	require.Equal(t, uint64(150), r.Members["slow"])
	require.True(t, r.Covers("slow", "order-9", 150), "live from its cursor's floor")
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, CursorKey("slow", 0))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 5*time.Second, 5*time.Millisecond, "its cursor key is deleted after the commit")
	require.Empty(t, second.Cursors())
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A commit is due when something changed and a waiter wants it, or the
// linger since the first change ran out; never when nothing changed.
func TestACommitIsDueWhenAWaiterComesOrTheLingerRanOut(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name           string
		now            time.Time
		dirty, waiting bool
		due            bool
		wait           time.Duration
	}{
		{"nothing changed, a waiter", t0.Add(time.Hour), false, true, false, 0},
		{"changed, lingering", t0.Add(50 * ms), true, false, false, 150 * ms},
		{"changed, a waiter", t0.Add(50 * ms), true, true, true, 0},
		{"changed, the linger ran out", t0.Add(200 * ms), true, false, true, 0},
		{"changed long ago", t0.Add(time.Hour), true, false, true, 0},
	} {
		got, wait := due(c.now, t0, c.dirty, c.waiting, 200*ms)
		require.Equal(t, c.due, got, c.name)
		require.Equal(t, c.wait, wait, c.name)
	}
}

// refuseOnceKV is a bucket whose next Update is refused as if the key
// had moved, without writing (the clustered server's "wrong last
// sequence" while an earlier write of the key is still being applied).
type refuseOnceKV struct {
	jetstream.KeyValue
	refuse atomic.Bool
}

func (kv *refuseOnceKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if kv.refuse.CompareAndSwap(true, false) {
		return 0, jetstream.ErrKeyExists
	}
	return kv.KeyValue.Update(ctx, key, value, last)
}

// A compare-and-set refused while the record is still at the revision
// this owner wrote is read from the leader, found to be the owner's, and
// written again: no ErrLost.
func TestASpuriousRefusalIsWrittenAgain(t *testing.T) {
	t.Parallel()
	js, bucket := setup(t)
	ctx := context.Background()
	kv := &refuseOnceKV{KeyValue: bucket}
	p := claim(t, js, kv, "replica-a", 1, clockwork.NewFakeClock())
	run(t, p)
	kv.refuse.Store(true)
	p.Settled("s1", "order-1", Entry{Seq: 10, Version: 3})
	require.NoError(t, p.Wait(ctx, "s1", "order-1", 10))
	require.False(t, kv.refuse.Load(), "the first write was refused")
	r, _ := stored(t, bucket)
	require.True(t, r.Covers("s1", "order-1", 10))
	require.Equal(t, p.token, r.Claim)
}

// A stored record that cannot be decoded stops the claim with
// ErrCorrupt naming the key; it is not taken for an empty one.
func TestAClaimOfACorruptRecordFails(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	_, err := kv.Put(ctx, Key(0), []byte(`{"floor":1048211}`))
	require.NoError(t, err)
	_, err = Claim(ctx, js, kv, Config{Owner: "replica-a", Epoch: 1})
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, `"pos.p0"`)
	e, err := kv.Get(ctx, Key(0))
	require.NoError(t, err)
	require.Equal(t, []byte(`{"floor":1048211}`), e.Value(), "left as it was")
}

// A bad Config is refused before anything is read, naming the field and
// the value.
func TestABadConfigIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Owner: "a", Partition: -1}, "Config.Partition -1 is negative"},
		{Config{}, "Config.Owner is empty"},
		{Config{Owner: "a", Linger: -time.Second}, "Config.Linger -1s is negative"},
		{Config{Owner: "a", MaxSize: 512}, "Config.MaxSize 512 is below 1024 bytes"},
	} {
		_, err := Claim(context.Background(), nil, nil, c.cfg)
		require.EqualError(t, err, "position: "+c.want)
	}
}

// Over the cap, the subscriptions with the most entries of their own are
// given cursors, one after another, until the record fits; each cursor
// holds what the record said it settled (from its member entry too).
// With nobody ahead, the record over the cap is not written.
func TestTheCapGivesCursorsUntilTheRecordFits(t *testing.T) {
	t.Parallel()
	st := state{cursors: map[string]*cursorKey{}}
	st.rec = Record{Floor: 100, Streams: map[string]Entry{"order-000": {Seq: 150, Version: 1}}, Ahead: map[string]map[string]Entry{}, Members: map[string]uint64{"big": 120, "mid": 0, "small": 0}}
	for sub, n := range map[string]int{"big": 200, "mid": 150, "small": 20} {
		st.rec.Ahead[sub] = map[string]Entry{}
		for k := range n {
			st.rec.Ahead[sub][fmt.Sprintf("order-%03d", k)] = Entry{Seq: 200 + uint64(k), Version: uint64(k)}
		}
	}
	f, err := st.fit(1024, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"big", "mid"}, f.detached)
	require.LessOrEqual(t, len(f.val), 1024)
	r, err := decodeRecord(f.val)
	require.NoError(t, err)
	require.Equal(t, []string{"small"}, keys(r.Ahead))
	require.Equal(t, map[string]uint64{"small": 0}, r.Members)
	big := st.cursors["big"].c
	require.Equal(t, uint64(120), big.Floor, "from its member entry, above the floor")
	require.True(t, big.Covers("order-000", 200), "its own entry")
	require.True(t, st.cursors["mid"].c.Covers("order-000", 150), "the shared entry")
	require.True(t, st.cursors["big"].dirty, "to be written before the record")

	st.rec = Record{Streams: map[string]Entry{}}
	for k := range 200 {
		st.rec.Streams[fmt.Sprintf("order-%03d", k)] = Entry{Seq: 1 + uint64(k)}
	}
	_, err = st.fit(1024, nil)
	require.ErrorIs(t, err, errTooLarge)
}

// A record of an events stream deleted and made again (another creation
// time: its sequences start again) is not read: the claim starts from an
// empty record and drops the partition's cursor keys. A claim that does
// not say the creation time keeps the record.
func TestARecordOfAnEventsStreamMadeAgainIsNotRead(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	before, after := time.Unix(1000, 0), time.Unix(2000, 0)
	p, err := Claim(ctx, js, kv, Config{Owner: "replica-a", Epoch: 1, Created: before})
	require.NoError(t, err)
	run(t, p)
	p.Edit(func(r *Record) { r.Floor = 500 })
	p.Detach("slow", "paused")
	p.Settled("s1", "order-1", Entry{Seq: 510, Version: 9})
	require.NoError(t, p.Wait(ctx, "s1", "order-1", 510))
	_, err = kv.Get(ctx, CursorKey("slow", 0))
	require.NoError(t, err)

	same, err := Claim(ctx, js, kv, Config{Owner: "replica-b", Epoch: 2})
	require.NoError(t, err)
	require.Equal(t, uint64(500), same.Record().Floor, "no creation time given: the record is read")
	require.Equal(t, before.UnixNano(), same.Record().Created)

	again, err := Claim(ctx, js, kv, Config{Owner: "replica-c", Epoch: 3, Created: after})
	require.NoError(t, err)
	r := again.Record()
	require.Zero(t, r.Floor)
	require.False(t, r.Covers("s1", "order-1", 510))
	require.Empty(t, again.Cursors())
	_, err = kv.Get(ctx, CursorKey("slow", 0))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the old stream's cursor key is dropped")
	got, _ := stored(t, kv)
	require.Equal(t, after.UnixNano(), got.Created)
	require.Equal(t, "replica-c", got.Owner)
}
