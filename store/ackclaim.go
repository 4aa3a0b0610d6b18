package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jsbridge/jsbridge/event"
)

// AckClaim acks owner's streams as AckStreams does and then claims up to
// limit streams for lease as Claim does (and fetches their events as
// ClaimFetch does, with perStream > 0), in one round trip and one
// transaction (it implements drain.AckClaimer): the drain's settle, its
// next claim and that claim's fetch cost one commit instead of three.
//
// The claim runs after the acks in the same transaction, so it sees the
// streams they released: a stream appended to while owner held it (such an
// append notifies nobody, the stream being leased) is claimed again here
// when its head is past the new watermark. The ack of a single stream
// waits for its row (an application appending to it) up to the settle
// timeout, as Ack does; many streams are acked with SKIP LOCKED as
// AckStreams does, and a stream left out that way (an appender held its
// row, or the lease was lost) is acked alone after the transaction, so the
// claim did not see it released: again is then true, and the caller
// should claim once more instead of relying on a notification.
//
// With perStream > 0 the claim also fetches up to perStream events of
// each claimed stream, as ClaimFetch does, returned in events; with 0 it
// claims only (events nil).
//
// ackErrs has one error per ack, in their order, as AckStreams returns
// them. err is the claim's error (claims nil then); when the transaction
// failed as a whole (the connection's error, ErrSettleTimeout), every ack
// gets that error too and nothing may be assumed about what committed.
// The claim's arguments are checked as Claim and ClaimFetch check them
// (ErrInvalidInput, nothing acked; perStream < 0 is refused). With no
// acks it is Claim, or ClaimFetch.
func (s *Store) AckClaim(ctx context.Context, owner string, acks []event.Progress, limit int, lease time.Duration, perStream int) (ackErrs []error, claims []event.Claim, events []event.Event, again bool, err error) {
	ackErrs = make([]error, len(acks))
	check := checkClaim(owner, limit, lease)
	if check == nil && perStream != 0 {
		check = checkClaimFetch(owner, limit, lease, perStream)
	}
	if check != nil {
		for i := range ackErrs {
			ackErrs[i] = check
		}
		return ackErrs, nil, nil, false, check
	}
	if len(acks) == 0 {
		if perStream > 0 {
			claims, events, err = s.ClaimFetch(ctx, owner, limit, lease, perStream)
		} else {
			claims, err = s.Claim(ctx, owner, limit, lease)
		}
		return ackErrs, claims, events, false, err
	}
	// Sorted by stream, as AckStreams does; a stream named twice is
	// refused. The sort is stable, so the first ack of a stream comes
	// first among its equals: no map to find them.
	order := make([]int, len(acks))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(acks[i].Stream, acks[j].Stream) })
	kept := order[:0]
	for _, i := range order {
		if n := len(kept); n > 0 && acks[kept[n-1]].Stream == acks[i].Stream {
			ackErrs[i] = fmt.Errorf("%w: ack stream %q for %s: named twice (acks %d and %d)", ErrInvalidInput, acks[i].Stream, owner, kept[n-1], i)
			continue
		}
		kept = append(kept, i)
	}
	order = kept

	// streams are the acked streams in order; done[k] says streams[k]'s
	// ack took.
	streams := make([]string, len(order))
	for k, i := range order {
		streams[k] = acks[i].Stream
	}
	done := make([]bool, len(order))
	b := s.settleBatch()
	if len(order) == 1 {
		// One row: waiting for it holds no other lock, so it cannot close
		// a deadlock cycle; the claim that follows sees what the appender
		// it waited for committed.
		a := acks[order[0]]
		b.Queue(s.q.ack, owner, a.Stream, a.Version, a.ID).Exec(func(t pgconn.CommandTag) error {
			done[0] = t.RowsAffected() > 0
			return nil
		})
	} else {
		versions := make([]int64, len(order))
		ids := make([]int64, len(order))
		for k, i := range order {
			versions[k], ids[k] = acks[i].Version, acks[i].ID
		}
		b.Queue(s.q.ackMany, owner, streams, versions, ids).Query(func(rows pgx.Rows) error {
			// Each name read in place and found in streams: no string
			// per row.
			var st pgtype.DriverBytes
			_, err := pgx.ForEachRow(rows, []any{&st}, func() error {
				if k, ok := slices.BinarySearch(streams, string(st)); ok {
					done[k] = true
				}
				return nil
			})
			return err
		})
	}
	// The catch-up of the acked streams goes with the fold (queueFold):
	// one statement fewer.
	var skipped, left bool
	s.queueFold(b, streams, &left)
	if perStream > 0 {
		b.Queue(s.q.claimFetch, owner, limit, lease.Microseconds(), perStream).Query(func(rows pgx.Rows) error {
			var err error
			claims, events, skipped, err = s.scanClaimEvents(rows, limit*perStream)
			return err
		})
	} else {
		b.Queue(s.q.claim, owner, limit, lease.Microseconds()).Query(func(rows pgx.Rows) error {
			var err error
			claims, skipped, err = scanClaims(rows)
			return err
		})
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		if pgCode(err) == sqlStateLockNotAvailable {
			err = fmt.Errorf("%w (%s)", ErrSettleTimeout, s.settleTimeout)
		}
		for _, i := range order {
			ackErrs[i] = fmt.Errorf("ack stream %q for %s (with %d others, and a claim): %w", acks[i].Stream, owner, len(order)-1, err)
		}
		return ackErrs, nil, nil, false, fmt.Errorf("claim streams for %s (with %d acks): %w", owner, len(order), err)
	}
	s.notes.skipped(skipped || left)
	for k, i := range order {
		if done[k] {
			continue
		}
		if len(order) == 1 {
			ackErrs[i] = fmt.Errorf("ack stream %q for %s: %w", acks[i].Stream, owner, event.ErrLeaseLost)
			continue
		}
		// Left out of the shared statement: the single ack waits for the
		// row and tells a lost lease from an appender's lock. The claim
		// did not see this stream released.
		ackErrs[i] = s.Ack(ctx, owner, acks[i].Stream, acks[i].Version, acks[i].ID)
		again = again || ackErrs[i] == nil
	}
	return ackErrs, claims, events, again, nil
}
