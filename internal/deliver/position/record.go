// Package position keeps where every subscription stands on one
// partition, in a key-value record the partition's owner writes itself
// (docs/design/next-engine.md, D4 and D6, stage 2): the record
// pos.p<N> (Record), a cursor key cur.<subscription>.p<N> (Cursor) for a
// subscription that left the shared read, a members key
// mem.p<N>.<claim>.<n> holding the names of the record's members once
// there are many (written before the record that names it, once, so that
// a commit does not write every member again: MembersKey), the claim
// that makes a former owner's writes fail (Claim, ErrLost),
// compare-and-set commits that linger and coalesce (Partition.Run), and
// the write-before-next waiters (Partition.Wait). The values it stores,
// their rules and their binary encoding are package record's (its room
// below it, no I/O); this package reads and writes them in the bucket.
//
// The rules it keeps (the design's R2–R4):
//   - write before next: Wait returns only once a commit whose record (or
//     cursor) covers the settlement succeeded, so a lane sends a stream's
//     next version only then;
//   - one writer: every commit is a compare-and-set on the revision this
//     claim last wrote, and carries the claim's token; a claim rewrites
//     the record before the new owner reads anything else, so a former
//     owner's commit after it fails (ErrLost). A refusal is read from the
//     bucket's stream leader before it is believed: a record that still
//     carries this claim's token means an earlier write landed with its
//     answer lost (or the server refused spuriously), and the commit goes
//     again from the revision found;
//   - cursors first: a cursor key is written before the commit that drops
//     its subscription from the record's members, and a cursor key whose
//     subscription the record still lists as a member is stale (a commit
//     that never landed, or a former owner's) and is dropped at the claim.
//     Every commit writes the record after its cursor keys, and waiters
//     are released only once both succeeded: the record's compare-and-set
//     fences the cursor keys too.
//
// The package does not decide the floor, the members or when a
// subscription falls behind: the owner's dispatcher does, through
// Partition.Edit, Detach, Start and Rejoin (the fan-out, run by
// internal/deliver/shared).
package position

import (
	"strconv"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
)

// Defaults of Config and of the bucket.
const (
	// DefaultBucket is the key-value bucket of the position records and
	// cursor keys (no TTL, history 1).
	DefaultBucket = "jsbridge_positions"
	// DefaultLinger bounds how long a settlement waits for its commit
	// when no waiter wants it sooner: commits coalesce within it.
	DefaultLinger = 200 * time.Millisecond
	// defaultMaxSize caps an encoded record, in bytes (a KV value may be
	// 1 MiB): past it, the subscription with the most entries of its own
	// is given a cursor (Partition.Detach) before the commit.
	defaultMaxSize = 256 << 10
)

// Key is partition p's record key: "pos.p<p>".
func Key(p int) string { return "pos.p" + strconv.Itoa(p) }

// CursorKey is the cursor key of subscription sub on partition p:
// "cur.<sub>.p<p>" (subscription names are [A-Za-z0-9_-]+, valid key
// tokens).
func CursorKey(sub string, p int) string { return "cur." + sub + ".p" + strconv.Itoa(p) }

// cursorFilter matches every cursor key of partition p.
func cursorFilter(p int) string { return "cur.*.p" + strconv.Itoa(p) }

// The values of the bucket, defined by package record (see there), under
// the names this package's callers use.
type (
	// Entry is record.Entry: a stream's last event settled.
	Entry = record.Entry
	// Aside is record.Aside: a stream of a subscription set aside.
	Aside = record.Aside
	// Retry is record.Retry: the failed attempts at one event.
	Retry = record.Retry
	// Record is record.Record: a partition's position record, stored
	// under Key(N).
	Record = record.Record
	// Cursor is record.Cursor: a subscription not live, stored under
	// CursorKey(sub, N).
	Cursor = record.Cursor
)

// NoVersion is record.NoVersion: an Entry's Version naming no
// predecessor.
const NoVersion = record.NoVersion

// ErrCorrupt is record.ErrCorrupt, returned (wrapped, naming the key and
// what is wrong) for a stored record, cursor or members key that cannot
// be decoded.
var ErrCorrupt = record.ErrCorrupt
