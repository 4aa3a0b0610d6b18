package member

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

func names(es []*Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name)
	}
	return out
}

// The index matches an event's subject against every subscription's
// filters, each subscription once, and follows Put and Remove.
func TestTheMemberIndexFollowsPutAndRemove(t *testing.T) {
	t.Parallel()
	idx := NewIndex()
	require.NoError(t, idx.Put(Member{Name: "orders", Filters: []string{"events.order.>"}, Ordered: true}))
	require.NoError(t, idx.Put(Member{Name: "placed", Filters: []string{"events.*.*.Placed", "events.order.>"}}))
	require.NoError(t, idx.Put(Member{Name: "users", Filters: []string{"events.user.>"}}))
	subject := "events.order.order-1.Placed"
	require.ElementsMatch(t, []string{"orders", "placed"}, names(idx.Match(subject, nil)), "two filters of one subscription match it once")

	require.NoError(t, idx.Put(Member{Name: "orders", Filters: []string{"events.invoice.>"}, MaxInFlight: 8}))
	require.Equal(t, []string{"placed"}, names(idx.Match(subject, nil)), "a Put replaces the filters")
	m, ok := idx.Get("orders")
	require.True(t, ok)
	require.Equal(t, Member{Name: "orders", Filters: []string{"events.invoice.>"}, MaxInFlight: 8, MaxInHand: defaultMaxInHand}, m)

	require.True(t, idx.Remove("placed"))
	require.False(t, idx.Remove("placed"))
	require.Empty(t, idx.Match(subject, nil))
	require.Equal(t, []string{"users"}, names(idx.Match("events.user.user-7.Joined", nil)))
}

// A name keeps the generation it was first put with; a new name gets the
// next one.
func TestANameKeepsItsGenerationWhenPutAgain(t *testing.T) {
	t.Parallel()
	idx := NewIndex()
	require.NoError(t, idx.Put(Member{Name: "a", Filters: []string{"events.>"}}))
	at := idx.Generation()
	require.NoError(t, idx.Put(Member{Name: "a", Filters: []string{"events.order.>"}}))
	require.NoError(t, idx.Put(Member{Name: "b", Filters: []string{"events.>"}}))
	a, _ := idx.Entry("a")
	b, _ := idx.Entry("b")
	require.Equal(t, at, a.Gen, "put again: the same generation")
	require.Greater(t, b.Gen, at, "a new name: put after the look")
}

// Bad members are refused naming the field and the value; nothing of
// them stays in the index.
func TestABadMemberIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	idx := NewIndex()
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
		require.ErrorIs(t, err, errInvalid)
		require.ErrorContains(t, err, c.want)
	}
	require.Empty(t, idx.Match("events.order.order-1.Placed", nil), "a refused filter list left nothing behind")
}

func TestMemberOfASubscription(t *testing.T) {
	t.Parallel()
	m := Of(subscription.Subscription{Name: "s", FilterSubjects: []string{"events.>"}, Ordering: subscription.OrderingNone, MaxInFlight: 4, MaxAckPending: 100})
	require.Equal(t, Member{Name: "s", Filters: []string{"events.>"}, MaxInFlight: 4, MaxInHand: 100}, m)
	require.True(t, Of(subscription.Subscription{Ordering: subscription.OrderingStream}).Ordered)
}

// An entry takes a literal subject when one of its filters matches it.
func TestAnEntryTakesTheSubjectsItsFiltersMatch(t *testing.T) {
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
		e := Entry{Member: Member{Filters: []string{"events.user.>", c.filter}}}
		require.Equal(t, c.want, e.Takes(c.subject), "%s ~ %s", c.filter, c.subject)
	}
}
