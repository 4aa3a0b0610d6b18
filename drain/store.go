package drain

import (
	"context"
	"time"

	"github.com/jsbridge/jsbridge/event"
)

// Store is what the drain needs from the event store. The Postgres
// implementation lives in package store and is plugged in by package bridge. A
// settle or release fenced off because the caller no longer holds the
// stream's lease returns an error wrapping event.ErrLeaseLost.
//
// Every method that changes a stream is fenced by the lease: when owner does
// not hold a live lease on the stream it returns event.ErrLeaseLost (wrapped) and
// changes nothing.
type Store interface {
	// Claim leases up to limit streams that have events past their watermark,
	// are not blocked, whose next attempt time has come and whose lease is
	// free or expired, for the given duration. Streams held by other
	// claimers are skipped, never waited for.
	Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]event.Claim, error)
	// Fetch returns, for each claim, up to perStream events after its
	// watermark in version order; the result is grouped by stream in the
	// order of claims, and streams with no events are omitted. An event
	// whose row cannot be read (NULL data, meta that is not JSON) is
	// returned with event.Event.Err set rather than failing the fetch: the
	// drain blocks that stream at it and goes on with the others.
	Fetch(ctx context.Context, claims []event.Claim, perStream int) ([]event.Event, error)
	// Ack advances the stream's watermark to the event (version, id), resets
	// its retry count and releases the lease.
	Ack(ctx context.Context, owner, stream string, version, id int64) error
	// AckStreams acks many streams, each as Ack does, in as few round trips
	// as it can (the drain acks a cycle's streams with one call). It
	// returns one error per ack, in their order: nil, one wrapping
	// event.ErrLeaseLost, or another; one stream's failure never keeps
	// another from being acked. The streams are distinct.
	AckStreams(ctx context.Context, owner string, acks []event.Progress) []error
	// Retry advances the watermark to (version, id) when version is greater
	// than the current watermark (partial progress), increments the retry
	// count, sets the next attempt to now+delay (database clock), records
	// reason as the last error and releases the lease.
	Retry(ctx context.Context, owner, stream string, version, id int64, delay time.Duration, reason string) error
	// Postpone is Retry for an attempt that failed because the bus was
	// unavailable (not the stream's fault): it advances the watermark the
	// same way, sets the next attempt to now+delay and records reason, but
	// leaves the retry count unchanged, so an outage never brings a stream
	// closer to MaxRetries. It ends the lease so that the next claim
	// reports owner as Claim.PreviousHolder (the attempt's publishes may
	// have been stored without an answer, so that claim must reconcile).
	Postpone(ctx context.Context, owner, stream string, version, id int64, delay time.Duration, reason string) error
	// Block advances the watermark like Retry, marks the stream blocked with
	// reason as its error and releases the lease. A blocked stream is not
	// claimed again until unblocked.
	Block(ctx context.Context, owner, stream string, version, id int64, reason string) error
	// Release gives up the leases owner holds on streams without counting a
	// retry or moving the watermark (used at shutdown).
	Release(ctx context.Context, owner string, streams []string) error
	// EndLeases ends now every live lease owner holds on a stream not in
	// keep, without counting a retry or moving the watermark, and returns
	// those streams: the next claim takes them at once and reports owner as
	// Claim.PreviousHolder, so it reconciles. Streams it could not end
	// without waiting (another transaction holds them) come back in busy.
	// The drain calls it after a store call failed (a settle or claim
	// whose answer was lost may have left leases it will never settle),
	// keeping the streams in flight.
	EndLeases(ctx context.Context, owner string, keep []string) (ended, busy []string, err error)
}

// Notifier wakes the drain when new events may have been appended (Postgres
// LISTEN/NOTIFY). It is optional: without it the drain only polls.
//
// A Notifier need not signal every append: Run claims again at once after
// any cycle that claimed a stream (with an AckClaimer, in the same round
// trip as the cycle's acks), so appends to a stream that is pending
// already or leased (package store's trigger sends nothing for them) are
// taken by the claim that follows whatever made the stream pending or
// ended the lease. A Notifier
// that stays silent that way must signal when a claim passed over such a
// stream (package store does, when the stream's row was locked by its
// appender) and when leases are given back (Release).
type Notifier interface {
	// Notifications returns a channel that receives a value (coalesced) after
	// events are appended. It is closed when ctx is done.
	Notifications(ctx context.Context) (<-chan struct{}, error)
}

// IdleNotifier is a Notifier whose notifications are sent only while some
// drainer waits for them (package store, since its migration 006: an
// append notifies only while a drainer holds the store's idle lock), so
// that appends cost no notification while the drainers work. Run tells
// it when it goes to wait and when it keeps working. Each channel
// Notifications returns is one drainer's: Idle and Busy name it (notes),
// so several drains on one IdleNotifier each have their own idle state.
type IdleNotifier interface {
	Notifier
	// Idle is called after a claim found nothing, before Run waits on
	// notes for a notification. ready true: notifications will reach this
	// drainer and every append that sent none is visible to the claim
	// already made; Run waits. ready false: Run claims once more first
	// (the notifier has only now begun to be notified, or appenders that
	// sent no notification had not committed yet). On an error
	// (transient: notes has no listening session now, or a statement
	// failed) Run polls: it waits for PollInterval at most, logs the
	// first error of a run of them, and asks again when next idle.
	Idle(ctx context.Context, notes <-chan struct{}) (ready bool, err error)
	// Busy is called when Run goes on claiming without waiting (at the
	// fourth cycle in a row that claimed something, or at one after which
	// it lingers): appends need not notify this drainer until it is Idle
	// again. Its error is logged.
	Busy(ctx context.Context, notes <-chan struct{}) error
}

// AckClaimer is a Store that can ack a cycle's streams and claim the next
// cycle's in one round trip and one transaction (package store's *Store
// can). Run uses it when every stream of a cycle that found no backlog is
// acked: the claim, made after the acks, takes again the streams appended
// to while they were leased (those appends notify nobody), so no claim
// has to follow the settle just for them.
type AckClaimer interface {
	// AckClaim acks as AckStreams does, then claims as Claim does, in
	// one transaction. ackErrs is AckStreams' answer; err is the claim's
	// (claims nil), and when the transaction failed as a whole every ack
	// has it too. again is true when a stream was acked outside the
	// claim's transaction (so the claim could not take it again): the
	// caller claims once more.
	//
	// With perStream > 0 it also fetches up to perStream events of each
	// claimed stream (as Store.Fetch would, from the claim's snapshot),
	// returned in events; with 0 events is nil and Run fetches.
	AckClaim(ctx context.Context, owner string, acks []event.Progress, limit int, lease time.Duration, perStream int) (ackErrs []error, claims []event.Claim, events []event.Event, again bool, err error)
}

// ClaimFetcher is a Store that can claim streams and fetch their events
// in one round trip and one transaction (package store's *Store can):
// Run and Cycle then claim with ClaimFetch, and never call Fetch.
type ClaimFetcher interface {
	// ClaimFetch claims as Store.Claim does, then returns, for the streams
	// claimed, up to perStream events past each one's watermark, as
	// Store.Fetch returns them (grouped by stream, version order, an
	// unreadable row with event.Event.Err set), read in the claim's
	// snapshot: an event committed after it is found by the next claim,
	// its stream being left pending by the settle.
	ClaimFetch(ctx context.Context, owner string, limit int, lease time.Duration, perStream int) ([]event.Claim, []event.Event, error)
}
