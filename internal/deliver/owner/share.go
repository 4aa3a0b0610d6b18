package owner

import (
	"hash/fnv"
	"slices"
	"strconv"
)

// Share decides one replica's part of the partitions for one ownership
// round (in the old engine: of one ordered subscription's partitions; in
// the next engine: of all partitions, for every subscription together).
// Every replica computes it from what it sees:
// the live members (sorted ids, self among them), the partitions it owns
// (leases it holds and is not releasing) and the partitions whose lease
// key exists (any owner, self included).
//
// Each member's quota is partitions/n, and one more for the first
// partitions mod n members by id, so the quotas add up to partitions. A
// replica over its quota releases the partitions it prefers least; one
// under it claims free partitions (no lease key), most preferred first.
// Preference is rendezvous hashing (fnv64a of replica id and partition),
// so replicas under quota at the same time try different partitions
// first.
//
// The assignment is sticky: a replica keeps what it owns up to its quota,
// so a replica joining takes about partitions/n of them (given up by the
// replicas over their new quota) and one leaving frees only its own,
// instead of reshuffling every partition, and each move costs a hand-over. Replicas that disagree on membership for a round at worst leave
// a partition unowned or claim one more than their quota until the next
// round; a partition never has two owners (the lease key's Create decides).
//
// taken is only read when self is under its quota (see Quota): a caller
// may leave it nil otherwise. An unknown membership (members nil, or self
// not among them) keeps, releases and claims nothing: the caller keeps
// what it owns until it knows.
func Share(partitions int, members []string, self string, owned []int, taken map[int]bool) (keep, release, claim []int) {
	q := Quota(partitions, members, self)
	if q < 0 {
		return nil, nil, nil
	}
	byPreference := func(ps []int) {
		slices.SortFunc(ps, func(a, b int) int {
			sa, sb := rendezvous(self, a), rendezvous(self, b)
			switch {
			case sa > sb:
				return -1
			case sa < sb:
				return 1
			}
			return a - b
		})
	}
	mine := slices.Clone(owned)
	byPreference(mine)
	if len(mine) > q {
		keep, release = mine[:q], mine[q:]
	} else {
		keep = mine
	}
	if missing := q - len(keep); missing > 0 {
		var free []int
		for p := range partitions {
			if !taken[p] && !slices.Contains(owned, p) {
				free = append(free, p)
			}
		}
		byPreference(free)
		claim = free[:min(missing, len(free))]
	}
	return keep, release, claim
}

// Quota is self's quota of the partitions among members (sorted ids):
// partitions/n, one more for the first partitions mod n members; -1 when
// self is not among them.
func Quota(partitions int, members []string, self string) int {
	i := slices.Index(members, self)
	if i < 0 {
		return -1
	}
	n := len(members)
	q := partitions / n
	if i < partitions%n {
		q++
	}
	return q
}

// rendezvous is replica's preference score for partition p.
func rendezvous(replica string, p int) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(replica))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(strconv.Itoa(p)))
	return h.Sum64()
}
