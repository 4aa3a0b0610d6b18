package forward

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Observer is told about every publish attempt, for metrics. Its methods are
// called from many goroutines at once and must not block.
type Observer interface {
	// Published is called once per event the Forwarder sent (not for events
	// skipped after a failure, nor for those reconciliation found already
	// stored): o is its outcome, took the time from send to PubAck or error.
	// A failed reconciliation lookup is reported as a failure of the
	// batch's first event.
	Published(o Outcome, took time.Duration)
}

type noObserver struct{}

func (noObserver) Published(Outcome, time.Duration) {}

// Publish error classes returned by ErrorClass (metric label values).
const (
	ClassTooLarge     = "too_large"
	ClassInvalidData  = "invalid_data"
	ClassTimeout      = "timeout"
	ClassCanceled     = "canceled"
	ClassNoResponders = "no_responders"
	ClassConnection   = "connection"
	ClassStorage      = "storage"
	ClassNotAttempted = "not_attempted"
	ClassConflict     = "conflict"
	ClassOther        = "other"
)

// ErrorClass names the class of a publish failure: ClassTooLarge and
// ClassInvalidData (non-retryable); ClassTimeout (no PubAck or lookup
// answer within the publish timeout or before the cycle's deadline,
// context.DeadlineExceeded; also nats.go's async publish timeout and
// stall), ClassCanceled (cut short by the context's cancellation:
// shutdown), ClassNoResponders (no JetStream server or stream answered)
// ClassConnection (closed or reconnecting) and ClassStorage (JetStream
// refused the message for lack of storage: see IsStorageFull), which the
// Forwarder reports as drain.UnavailableError; ClassConflict (ErrConflict),
// ClassNotAttempted or ClassOther. It returns "" for nil.
func ErrorClass(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrTooLarge):
		return ClassTooLarge
	case errors.Is(err, errInvalidData):
		return ClassInvalidData
	case errors.Is(err, errNotAttempted):
		return ClassNotAttempted
	case errors.Is(err, ErrConflict):
		return ClassConflict
	case IsStorageFull(err):
		return ClassStorage
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return ClassTimeout
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrStreamNotFound):
		return ClassNoResponders
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrConnectionDraining):
		return ClassConnection
	}
	return ClassOther
}

// JetStream API error codes of a message refused for lack of storage.
const (
	apiErrAccountResourcesExceeded jetstream.ErrorCode = 10002 // account limit (max_file_store of the account)
	apiErrInsufficientResources    jetstream.ErrorCode = 10023 // server limit (max_file_store) reached
	apiErrMemoryResourcesExceeded  jetstream.ErrorCode = 10028
	apiErrStorageResourcesExceeded jetstream.ErrorCode = 10047
	apiErrStreamStoreFailed        jetstream.ErrorCode = 10077 // the store refused the write (a discard-new limit, a full disk)
)

// IsStorageFull reports whether err is JetStream refusing a message for
// lack of storage: the server's or the account's storage limit reached
// (API errors 10023 "insufficient resources", 10002 "resource limits
// exceeded for account", 10028, 10047), or the stream's store refusing
// the write (10077: a stream limit with DiscardNew, a full disk). Nothing
// was stored; the same publish succeeds once space is freed.
func IsStorageFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case apiErrAccountResourcesExceeded, apiErrInsufficientResources, apiErrMemoryResourcesExceeded,
		apiErrStorageResourcesExceeded, apiErrStreamStoreFailed:
		return true
	}
	return false
}
