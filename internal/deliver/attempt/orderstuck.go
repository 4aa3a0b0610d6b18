package attempt

import "time"

// The order-stuck state. A receiver's order gate answers gap (or
// in-progress) while it waits for an earlier version of the stream; the
// sender retries the head in place, spending no attempt, because the
// earlier version is usually on its way (retried, redelivered after
// AckWait, handed over). When it is not (the receiver lost its order
// state, a version was removed from the events stream, a dead letter was
// skipped on the sender but not on the receiver), nothing on either side
// resolves it, and the stream waited for ever, unseen. After the
// consumer's OrderStuckAfter of continuous refusals the head is
// dead-lettered with the gate's answer as its reason, and its stream
// parked whatever the subscription's OnDeadLetter: `consumer status` lists it as order-stuck,
// jsbridge_consumer_streams_order_stuck counts it, the
// JsbridgeStreamsOrderStuck alert fires, and the operator's way out is
// the parked stream's: `consumer dlq replay` (the head is sent again,
// then the held events, once the receiver can take it) or `consumer dlq
// skip` (the held events go on without it). The claim's attempts
// (Claim, claim.go) count the refusals and decide it.

// DefaultOrderStuckAfter is the default bound of an order gate's
// continuous refusals of a stream's head (the consumer's
// OrderStuckAfter): long enough for a receiver's gate to see a
// predecessor that is being retried, redelivered or handed over, short
// enough that an operator hears of a stream that will not move by
// itself.
const DefaultOrderStuckAfter = 5 * time.Minute
