package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jsbridge/jsbridge/event"
)

// The methods in this file make *Store a drain.Store: claiming streams under
// lease, fetching the events past their watermarks and settling them. Every
// settling method is fenced: it changes the stream only while owner holds a
// live lease on it (leased_by = owner and leased_until > now() on the
// database clock); otherwise it changes nothing and returns an error wrapping
// event.ErrLeaseLost.

// Claim leases up to limit streams that have committed events past their
// watermark, are not blocked, whose next attempt time has come and whose
// lease is free or expired, to owner for lease (database clock). Rows locked
// by concurrent claimers are skipped (FOR UPDATE SKIP LOCKED), never waited
// for, so two claimers never get the same stream. Taking over an expired
// lease does not count a retry. limit must be > 0 and lease >= 1µs.
//
// Streams are claimed in the order they became due: by the created time of
// their oldest unforwarded event, or, for a stream that was retried, by its
// next attempt time (when its backoff ended), so under a backlog each waits
// about as long as the others. The claims come back in no particular order.
//
// With the bridge's own events table the claim first folds, in its
// transaction, the markers appends wrote while no drainer waited
// (migration 009, store/fold.go), so it sees every append committed
// before it.
func (s *Store) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]event.Claim, error) {
	if err := checkClaim(owner, limit, lease); err != nil {
		return nil, err
	}
	var (
		claims        []event.Claim
		skipped, left bool
	)
	b := &pgx.Batch{}
	s.queueFold(b, nil, &left)
	b.Queue(s.q.claim, owner, limit, lease.Microseconds()).Query(func(rows pgx.Rows) error {
		var err error
		claims, skipped, err = scanClaims(rows)
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("claim streams for %s: %w", owner, err)
	}
	s.notes.skipped(skipped || left)
	return claims, nil
}

// checkClaim checks Claim's arguments.
func checkClaim(owner string, limit int, lease time.Duration) error {
	if owner == "" {
		return fmt.Errorf("%w: claim owner is empty", ErrInvalidInput)
	}
	if limit <= 0 {
		return fmt.Errorf("%w: claim limit %d (want > 0)", ErrInvalidInput, limit)
	}
	if lease < time.Microsecond {
		return fmt.Errorf("%w: claim lease %s (want >= 1µs)", ErrInvalidInput, lease)
	}
	return nil
}

// scanClaims reads the rows of the claim statement: the streams claimed,
// and whether it passed over a due stream whose row another transaction
// held (its last row, skipped set). It closes rows.
func scanClaims(rows pgx.Rows) ([]event.Claim, bool, error) {
	defer rows.Close()
	var claims []event.Claim
	skipped := false
	for rows.Next() {
		var (
			c      event.Claim
			stream *string
			wm     *int64
			retry  *int
			until  *time.Time
			prev   *string
			skip   bool
		)
		if err := rows.Scan(&stream, &wm, &retry, &until, &prev, &skip); err != nil {
			return nil, false, err
		}
		if skip {
			skipped = true
			continue
		}
		c.Stream, c.Watermark, c.Retry, c.LeasedUntil, c.PreviousHolder = *stream, *wm, *retry, *until, *prev
		claims = append(claims, c)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	return claims, skipped, nil
}

// Fetch returns, in one query, up to perStream events after each claim's
// watermark, in version order, grouped by stream in the order of claims;
// claims with no such events contribute nothing. perStream must be > 0.
//
// The content of a row never fails the fetch: an event whose data is NULL
// or whose meta is not valid JSON is returned with Err set (an
// *event.ColumnError naming the column), and the drain blocks its stream
// at it. Meta of any valid JSON shape is read by event.ParseMeta. Data is
// returned as stored, not checked for JSON here (the forwarder checks it).
func (s *Store) Fetch(ctx context.Context, claims []event.Claim, perStream int) ([]event.Event, error) {
	if perStream <= 0 {
		return nil, fmt.Errorf("%w: fetch perStream %d (want > 0)", ErrInvalidInput, perStream)
	}
	if len(claims) == 0 {
		return nil, nil
	}
	streams := make([]string, len(claims))
	watermarks := make([]int64, len(claims))
	for i, c := range claims {
		streams[i], watermarks[i] = c.Stream, c.Watermark
	}
	rows, err := s.pool.Query(ctx, s.q.fetch, streams, watermarks, perStream)
	if err != nil {
		return nil, fmt.Errorf("fetch events of %d streams from %s: %w", len(claims), s.EventsTable(), err)
	}
	events, err := pgx.AppendRows(make([]event.Event, 0, s.fetchRoom(len(claims)*perStream)), rows, s.scanEvent)
	if err != nil {
		return nil, fmt.Errorf("fetch events of %d streams from %s: %w", len(claims), s.EventsTable(), err)
	}
	s.lastFetch.Store(int64(len(events)))
	return events, nil
}

// fetchRoom is how many events Fetch makes room for before reading, when a
// page holds at most page: twice what the last fetch returned, at least
// fetchMinRoom, at most fetchMaxRoom and page. Growing the slice row by row
// copied every event of a big page several times (10 % of the bridge's CPU
// draining a backlog), while room for a full page every time allocated and
// cleared ~2 MB per fetch when events come a few at a time (a third of the
// bridge's CPU at 1,000 events/s, most of it in memclr and GC). The floor
// is small: near idle a claim returns a few events, and a floor of 64
// (an event.Event is ~190 B) zeroed 12 KB for each of them.
func (s *Store) fetchRoom(page int) int {
	return min(max(2*int(s.lastFetch.Load()), fetchMinRoom), fetchMaxRoom, page)
}

const (
	fetchMinRoom = 8
	fetchMaxRoom = 16 << 10
)

// errNull is the reason of a ColumnError for a NULL where a value is needed.
var errNull = errors.New("is NULL")

// scanEvent reads one row of the fetch query. Its error is only for a row
// that cannot be scanned at all (a column type the query does not cast,
// which Migrate's layout check refuses); what is wrong with the content of
// one event goes in its Err.
func (s *Store) scanEvent(r pgx.CollectableRow) (event.Event, error) {
	var e event.Event
	var meta []byte
	if err := r.Scan(&e.ID, &e.Stream, &e.Version, &e.Name, &e.Data, &meta, &e.Created); err != nil {
		return e, err
	}
	s.checkEvent(&e, meta)
	return e, nil
}

// checkEvent fills in e, read from a row with its meta column as read,
// as the drain takes it: Err set for a NULL data or a meta that is not
// JSON, DataJSON for the own events table's jsonb data.
func (s *Store) checkEvent(e *event.Event, meta []byte) {
	if e.Data == nil {
		e.Err = &event.ColumnError{Table: s.EventsTable(), Column: "data", Err: errNull}
		return
	}
	// The own events table's data column is jsonb: its text is JSON. An
	// external table's may be text, so the forwarder checks it.
	e.DataJSON = !s.External()
	m, err := event.ParseMeta(meta) // NULL meta (len 0): no ids
	if err != nil {
		e.Err = &event.ColumnError{Table: s.EventsTable(), Column: "meta", Err: err}
		return
	}
	e.Meta = m
}

// Ack advances stream's watermark to the event (version, id) — never back —,
// resets its retry count, next attempt and error, and releases the lease.
// Fenced by owner's lease (error wraps event.ErrLeaseLost).
func (s *Store) Ack(ctx context.Context, owner, stream string, version, id int64) error {
	return s.settle(ctx, "ack", owner, stream, s.q.ack, owner, stream, version, id)
}

// Retry advances stream's watermark to (version, id) when version is past it
// (partial progress; pass the claim's watermark for none), increments the
// retry count, sets the next attempt to now()+delay on the database clock,
// records reason as the stream's error and releases the lease. Fenced by
// owner's lease (error wraps event.ErrLeaseLost). delay < 0 counts as 0.
func (s *Store) Retry(ctx context.Context, owner, stream string, version, id int64, delay time.Duration, reason string) error {
	delay = max(delay, 0)
	return s.settle(ctx, "retry", owner, stream, s.q.retry, owner, stream, version, id, delay.Microseconds(), reason)
}

// Postpone is Retry for an attempt that failed through no fault of the
// stream (the bus was unavailable): it advances the watermark on partial
// progress, sets the next attempt to now()+delay on the database clock and
// records reason as the stream's error, but leaves the retry count as it
// is, so an outage of any length never brings a stream closer to being
// blocked. The lease is ended rather than released (it expires now and
// owner stays its last holder), so the next claim reports owner as
// event.Claim.PreviousHolder and the drain reconciles: a publish cut short
// by the outage may have been stored after all. Fenced by owner's lease
// (error wraps event.ErrLeaseLost). delay < 0 counts as 0.
func (s *Store) Postpone(ctx context.Context, owner, stream string, version, id int64, delay time.Duration, reason string) error {
	delay = max(delay, 0)
	return s.settle(ctx, "postpone", owner, stream, s.q.postpone, owner, stream, version, id, delay.Microseconds(), reason)
}

// Block advances the watermark like Retry, increments the retry count, marks
// stream blocked with reason as its error and releases the lease. A blocked
// stream is not claimed until Unblock or Reset. Fenced by owner's lease
// (error wraps event.ErrLeaseLost).
func (s *Store) Block(ctx context.Context, owner, stream string, version, id int64, reason string) error {
	return s.settle(ctx, "block", owner, stream, s.q.block, owner, stream, version, id, reason)
}

// sqlStateLockNotAvailable is Postgres' lock_not_available (lock_timeout).
const sqlStateLockNotAvailable = "55P03"

// settleBatch starts a batch whose first statement sets, for the batch's
// own implicit transaction:
//   - lock_timeout to the settle timeout: one round trip, and the server
//     gives up waiting (a client-side cancel could leave the statement to
//     run after all);
//   - plan_cache_mode to force_generic_plan: the catch-up (queueCatchUp)
//     names its streams in an array, and with a custom plan's exact
//     array length Postgres judged its generic plan dearer and planned it
//     again at every call, about 0.4 ms of the backend's CPU a cycle for
//     the plan it always makes (the same index probes); the settle
//     statements keep the generic plans they were given anyway.
func (s *Store) settleBatch() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('lock_timeout', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true)`,
		fmt.Sprintf("%dms", max(s.settleTimeout.Milliseconds(), 1)))
	return b
}

func (s *Store) settle(ctx context.Context, op, owner, stream, query string, args ...any) error {
	var tag pgconn.CommandTag
	b := s.settleBatch()
	b.Queue(query, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	s.queueCatchUp(b, []string{stream})
	err := s.pool.SendBatch(ctx, b).Close()
	if err != nil {
		if pgCode(err) == sqlStateLockNotAvailable {
			return fmt.Errorf("%s stream %q for %s: %w (%s)", op, stream, owner, ErrSettleTimeout, s.settleTimeout)
		}
		return fmt.Errorf("%s stream %q for %s: %w", op, stream, owner, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s stream %q for %s: %w", op, stream, owner, event.ErrLeaseLost)
	}
	return nil
}

// queueCatchUp queues, after a statement that moved the watermarks of
// streams forward, the statement that marks pending again those it left
// caught up although appends that committed meanwhile are past the new
// watermark (see the catchUp query and migration 008). An external events
// table has no trigger: its heads are discovery's, exact as far as it
// has read, and it needs none.
func (s *Store) queueCatchUp(b *pgx.Batch, streams []string) {
	if s.External() {
		return
	}
	b.Queue(s.q.catchUp, streams)
}

// Release gives up the live leases owner holds on streams without counting a
// retry or moving the watermark, so another drainer can claim them at once,
// and notifies the store's channel so that idle drainers do.
// Streams owner does not hold are left alone; if there were any, the error
// names them and wraps event.ErrLeaseLost.
func (s *Store) Release(ctx context.Context, owner string, streams []string) error {
	if len(streams) == 0 {
		return nil
	}
	var released []string
	b := s.settleBatch()
	b.Queue(s.q.release, owner, streams).Query(func(rows pgx.Rows) error {
		var err error
		released, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	// Appends to a stream already pending send no notification (migration
	// 005): other drainers learn of the streams given back from this one,
	// sent at commit.
	b.Queue(s.q.wake)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		if pgCode(err) == sqlStateLockNotAvailable {
			err = fmt.Errorf("%w (%s)", ErrSettleTimeout, s.settleTimeout)
		}
		return fmt.Errorf("release %d streams for %s: %w", len(streams), owner, err)
	}
	if len(released) == len(streams) {
		return nil
	}
	done := make(map[string]bool, len(released))
	for _, r := range released {
		done[r] = true
	}
	var lost []string
	for _, st := range streams {
		if !done[st] {
			lost = append(lost, st)
		}
	}
	if len(lost) == 0 { // streams named twice
		return nil
	}
	return fmt.Errorf("release streams %q for %s: %w", lost, owner, event.ErrLeaseLost)
}

// EndLeases ends, now, every live lease owner holds on a stream not in
// keep, and returns those streams (sorted). An ended lease keeps owner as
// its holder with leased_until = now(): the next claim, by owner or any
// other drainer, takes the stream at once without counting a retry and
// reports owner as event.Claim.PreviousHolder, so that claim reconciles
// with what the bus already holds. Nothing else moves. A stream whose row
// another transaction holds (an application's append, say) is skipped
// rather than waited for, and returned in busy (sorted): call again.
//
// It is for a drainer that lost track of what it holds: a settle whose
// answer was lost (a Postgres failover cut the connection) leaves the
// stream leased to a live owner that will not settle it, and a claim
// whose answer was lost leaves leases owner never learnt of. Waiting for
// them to expire would hold those streams for the whole lease. keep names
// the streams owner is still working on.
func (s *Store) EndLeases(ctx context.Context, owner string, keep []string) (ended, busy []string, err error) {
	if owner == "" {
		return nil, nil, fmt.Errorf("%w: end leases: owner is empty", ErrInvalidInput)
	}
	if keep == nil {
		keep = []string{} // NOT (stream = ANY(NULL)) is NULL: nothing would match
	}
	b := s.settleBatch()
	b.Queue(s.q.endLeases, owner, keep).Query(func(rows pgx.Rows) error {
		var stream string
		var skipped bool
		_, err := pgx.ForEachRow(rows, []any{&stream, &skipped}, func() error {
			if skipped {
				busy = append(busy, stream)
			} else {
				ended = append(ended, stream)
			}
			return nil
		})
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		if pgCode(err) == sqlStateLockNotAvailable {
			err = fmt.Errorf("%w (%s)", ErrSettleTimeout, s.settleTimeout)
		}
		return nil, nil, fmt.Errorf("end leases of %s: %w", owner, err)
	}
	slices.Sort(ended)
	slices.Sort(busy)
	return ended, busy, nil
}
