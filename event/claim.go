package event

import (
	"errors"
	"time"
)

// ErrLeaseLost is returned (wrapped) when an ack, retry, block or release is
// fenced off because the caller no longer holds the stream's lease: it
// expired, and another drainer may have claimed the stream since. Nothing was
// changed.
var ErrLeaseLost = errors.New("lease lost")

// Claim is one stream held under lease by a drainer: the bridge's per-stream
// row as the store hands it to the drain.
type Claim struct {
	// Stream is the stream's name.
	Stream string
	// Watermark is the version of the last event forwarded; -1 when none was.
	Watermark int64
	// Retry counts the failed attempts since the last ack (0 on a fresh stream).
	Retry int
	// LeasedUntil is when the lease expires (database clock).
	LeasedUntil time.Time
	// PreviousHolder is the owner whose lease on the stream expired without
	// an ack, retry, block or release (it died or hung), or who postponed
	// the stream after an attempt the bus did not answer: that owner may
	// have published events it never acked, so this claim reconciles.
	// Empty when the stream was free.
	PreviousHolder string
}

// Progress is how far a drainer forwarded one stream: the version and id of
// the last event it forwarded, the point an ack moves the stream's
// watermark to (never back).
type Progress struct {
	// Stream is the stream's name.
	Stream string
	// Version is the last forwarded event's version (0-based).
	Version int64
	// ID is the last forwarded event's id.
	ID int64
}
