package fanout

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

func names(ms []*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// The index matches an event's subject against every subscription's
// filters, each subscription once, and follows Put and Remove.
func TestTheMemberIndexFollowsPutAndRemove(t *testing.T) {
	t.Parallel()
	idx := NewMembers()
	require.NoError(t, idx.Put(Member{Name: "orders", Filters: []string{"events.order.>"}, Ordered: true}))
	require.NoError(t, idx.Put(Member{Name: "placed", Filters: []string{"events.*.*.Placed", "events.order.>"}}))
	require.NoError(t, idx.Put(Member{Name: "users", Filters: []string{"events.user.>"}}))
	subject := "events.order.order-1.Placed"
	require.ElementsMatch(t, []string{"orders", "placed"}, names(idx.match(subject, nil)), "two filters of one subscription match it once")

	require.NoError(t, idx.Put(Member{Name: "orders", Filters: []string{"events.invoice.>"}, MaxInFlight: 8}))
	require.Equal(t, []string{"placed"}, names(idx.match(subject, nil)), "a Put replaces the filters")
	m, ok := idx.Get("orders")
	require.True(t, ok)
	require.Equal(t, Member{Name: "orders", Filters: []string{"events.invoice.>"}, MaxInFlight: 8, MaxInHand: DefaultMaxInHand}, m)

	require.True(t, idx.Remove("placed"))
	require.False(t, idx.Remove("placed"))
	require.Empty(t, idx.match(subject, nil))
	require.Equal(t, []string{"users"}, names(idx.match("events.user.user-7.Joined", nil)))
}

// Bad members are refused naming the field and the value; nothing of
// them stays in the index.
func TestABadMemberIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	idx := NewMembers()
	for _, c := range []struct {
		m    Member
		want string
	}{
		{Member{Filters: []string{"events.>"}}, `Name ""`},
		{Member{Name: "a.b", Filters: []string{"events.>"}}, `Name "a.b"`},
		{Member{Name: "a"}, "Filters is empty"},
		{Member{Name: "a", Filters: []string{"events.>"}, MaxInFlight: -1}, "MaxInFlight -1"},
		{Member{Name: "a", Filters: []string{"events.>"}, MaxInFlight: 10, MaxInHand: 5}, "MaxInHand 5 is below MaxInFlight 10"},
		{Member{Name: "a", Filters: []string{"events.order.>", "events..x"}}, `filter "events..x"`},
	} {
		err := idx.Put(c.m)
		require.ErrorIs(t, err, ErrInvalidMember)
		require.ErrorContains(t, err, c.want)
	}
	require.Empty(t, idx.match("events.order.order-1.Placed", nil), "a refused filter list left nothing behind")
}

func TestMemberOfASubscription(t *testing.T) {
	t.Parallel()
	m := MemberOf(subscription.Subscription{Name: "s", FilterSubjects: []string{"events.>"}, Ordering: subscription.OrderingNone, MaxInFlight: 4, MaxAckPending: 100})
	require.Equal(t, Member{Name: "s", Filters: []string{"events.>"}, MaxInFlight: 4, MaxInHand: 100}, m)
	require.True(t, MemberOf(subscription.Subscription{Ordering: subscription.OrderingStream}).Ordered)
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"events.>", "events.order.order-1.Placed", true},
		{"events.order.>", "events.order.order-1.Placed", true},
		{"events.order.>", "events.order", false},
		{"events.*.*.Placed", "events.order.order-1.Placed", true},
		{"events.*.*.Placed", "events.order.order-1.Paid", false},
		{"events.*.*", "events.order.order-1.Placed", false},
		{"events.order.order-1.Placed", "events.order.order-1.Placed", true},
		{"events.order.order-1.Placed.x", "events.order.order-1.Placed", false},
	} {
		require.Equal(t, c.want, subjectMatches(c.filter, c.subject), "%s ~ %s", c.filter, c.subject)
	}
}

// nopPosition is a Position that writes nothing (the benchmark's: the
// dispatch's own cost, not the bucket's).
type nopPosition struct{}

func (nopPosition) Record() position.Record                            { return position.Record{} }
func (nopPosition) Cursors() map[string]position.Cursor                { return nil }
func (nopPosition) Settled(string, string, position.Entry)             {}
func (nopPosition) Wait(context.Context, string, string, uint64) error { return nil }
func (nopPosition) Edit(fn func(*position.Record)) {
	fn(&position.Record{Members: map[string]uint64{}})
}
func (nopPosition) EditCursor(string, func(*position.Cursor)) bool { return true }
func (nopPosition) Detach(string, string) bool                     { return true }
func (nopPosition) Start(string, string, uint64) bool              { return true }
func (nopPosition) Rejoin(string) bool                             { return true }
func (nopPosition) Drop(string) bool                               { return false }
func (nopPosition) Flush(context.Context) error                    { return nil }

// counter is a Sender that answers at once and counts.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) Attempt(context.Context, Delivery) Settlement {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return Settlement{Act: Delivered}
}

// cpuTime is the process's CPU time so far (user and system): on a
// shared machine, what the benchmark spent rather than what it waited.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDispatch is the cost of one (event, matching subscription):
// the match, the record's check, the push to a lane or a send, the send
// (an answer at once) and the settlement's bookkeeping, with 100
// subscriptions sharing a filter beside 10,000 of their own categories,
// 64 streams, every 256 events settled before the next (so that what is
// in hand stays what a subscription may hold). ns/delivery is wall time,
// cpu-ns/delivery the process's CPU time (the sends run beside the
// dispatch on other cores). The design's target: 2 µs.
func BenchmarkDispatch(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		b.Run(fmt.Sprintf("ordered=%t", ordered), func(b *testing.B) {
			idx := NewMembers()
			for i := range 10_000 {
				if err := idx.Put(Member{Name: fmt.Sprintf("c%d", i), Filters: []string{fmt.Sprintf("events.m%d.>", i)}}); err != nil {
					b.Fatal(err)
				}
			}
			const subs = 100
			for i := range subs {
				if err := idx.Put(Member{Name: fmt.Sprintf("s%d", i), Filters: []string{"events.order.>"}, Ordered: ordered, MaxInFlight: 64, MaxInHand: 1 << 30}); err != nil {
					b.Fatal(err)
				}
			}
			send := &counter{}
			f := New(Config{}, idx, nopPosition{}, send, nil, nil)
			evs := events(1, 4096, 64)
			seq := uint64(0)
			settle := func() { // every send settled
				for f.Floor() < seq {
					time.Sleep(20 * time.Microsecond)
				}
			}
			runtime.GC() // the index's garbage is not the dispatch's
			start, cpu := time.Now(), cpuTime()
			for b.Loop() {
				seq++
				e := evs[seq%uint64(len(evs))]
				e.Seq = seq
				f.Dispatch(e)
				if seq%256 == 0 { // in hand stays below 256 a subscription
					settle()
				}
			}
			settle()
			n := float64(seq * subs)
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/n, "ns/delivery")
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/n, "cpu-ns/delivery")
			f.Close()
			send.mu.Lock()
			defer send.mu.Unlock()
			if send.n != int(seq)*subs {
				b.Fatalf("%d sends for %d events × %d subscriptions", send.n, seq, subs)
			}
		})
	}
}
