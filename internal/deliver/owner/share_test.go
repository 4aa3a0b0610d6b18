package owner

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// settle runs ownership rounds for the members until no replica releases
// or claims anything, as the replicas would (each round every member sees
// the same lease keys; a claim only succeeds for a free key), and returns
// the owner of every partition. It fails after 10 rounds.
func settle(t *testing.T, partitions int, members []string, owner map[int]string) map[int]string {
	t.Helper()
	owner = maps.Clone(owner)
	if owner == nil {
		owner = map[int]string{}
	}
	for range 10 {
		moved := false
		for _, self := range members {
			var owned []int
			taken := map[int]bool{}
			for p, o := range owner {
				taken[p] = true
				if o == self {
					owned = append(owned, p)
				}
			}
			keep, release, claim := Share(partitions, members, self, owned, taken)
			require.ElementsMatch(t, owned, append(slices.Clone(keep), release...), "%s keeps or releases each partition it owns", self)
			for _, p := range release {
				delete(owner, p)
				moved = true
			}
			for _, p := range claim {
				require.NotContains(t, owner, p, "%s claims only free partitions", self)
				owner[p] = self
				moved = true
			}
		}
		if !moved {
			return owner
		}
	}
	t.Fatalf("ownership did not settle in 10 rounds: %v", owner)
	return nil
}

// counts returns how many partitions each member owns.
func counts(owner map[int]string) map[string]int {
	n := map[string]int{}
	for _, o := range owner {
		n[o]++
	}
	return n
}

// moves counts the partitions whose owner differs between a and b.
func moves(a, b map[int]string) int {
	n := 0
	for p, o := range a {
		if b[p] != o {
			n++
		}
	}
	return n
}

func TestShareBalancesAndMovesOnlyWhatMembershipChangeNeeds(t *testing.T) {
	const partitions = 16
	ids := func(names ...string) []string { slices.Sort(names); return names }

	one := settle(t, partitions, ids("a"), nil)
	require.Equal(t, map[string]int{"a": 16}, counts(one), "a lone replica owns every partition")

	two := settle(t, partitions, ids("a", "b"), one)
	require.Equal(t, map[string]int{"a": 8, "b": 8}, counts(two))
	require.Equal(t, 8, moves(one, two), "a joining replica takes only its share")

	three := settle(t, partitions, ids("a", "b", "c"), two)
	require.Equal(t, map[string]int{"a": 6, "b": 5, "c": 5}, counts(three), "the first partitions mod n replicas by id own one more")
	require.Equal(t, 5, moves(two, three))

	// b is killed: its leases expire, the two left take its partitions
	// and nothing else moves.
	afterKill := map[int]string{}
	for p, o := range three {
		if o != "b" {
			afterKill[p] = o
		}
	}
	two2 := settle(t, partitions, ids("a", "c"), afterKill)
	require.Equal(t, map[string]int{"a": 8, "c": 8}, counts(two2))
	require.Equal(t, 5, moves(three, two2), "only the dead replica's partitions move")

	// b comes back under a new id (a restarted process): again only its
	// share moves.
	back := settle(t, partitions, ids("a", "c", "b2"), two2)
	require.Equal(t, 5, moves(two2, back))
	require.Equal(t, []int{5, 5, 6}, slices.Sorted(maps.Values(counts(back))))
}

func TestShareWithMorePartitionsOrReplicas(t *testing.T) {
	for _, tc := range []struct{ partitions, replicas int }{{1, 3}, {7, 3}, {64, 5}, {16, 16}, {16, 20}} {
		t.Run(fmt.Sprintf("%d partitions, %d replicas", tc.partitions, tc.replicas), func(t *testing.T) {
			var members []string
			for i := range tc.replicas {
				members = append(members, fmt.Sprintf("replica-%02d", i))
			}
			owner := settle(t, tc.partitions, members, nil)
			require.Len(t, owner, tc.partitions, "every partition owned")
			for _, n := range counts(owner) {
				require.LessOrEqual(t, n, (tc.partitions+tc.replicas-1)/tc.replicas)
				require.GreaterOrEqual(t, n, tc.partitions/tc.replicas)
			}
		})
	}
}

func TestShareUnknownMembershipKeepsEverythingAndClaimsNothing(t *testing.T) {
	keep, release, claim := Share(16, nil, "a", []int{1, 2}, map[int]bool{1: true, 2: true})
	require.Nil(t, keep)
	require.Nil(t, release)
	require.Nil(t, claim)
}
