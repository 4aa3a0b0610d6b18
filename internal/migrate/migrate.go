// Package migrate moves a deployment from the old engine's layout (a
// durable per unordered subscription, partition consumers on the
// partitioned copy, the park bucket's records) to the positions bucket:
// one record per partition (pos.p<N>), a cursor per unordered
// subscription and partition (cur.<subscription>.p<N>), and the keys
// copied as they are; docs/design/next-engine.md section 5 has the table
// of what each part becomes. The old layout's names and reads are package
// legacy's, the keys the migration leaves package mark's, the deletion of
// the old layout package cleanup's.
//
// ReadPlan reads the old layout through the JetStream API alone, with
// every old consumer replica stopped, and computes what the positions
// bucket would hold, writing nothing (`consumer migrate --dry-run`,
// Plan.Print); where the layout disagrees with itself or with the
// configuration the plan holds a Refusal instead of guessing. The API
// lists no acked sequences above an unordered durable's ack floor: with
// Config.ReadPending its pending set is read back, else the events of
// (floor, last delivered] are sent again and counted
// (SubscriptionPlan.Resent) before anything is written. Apply writes the
// plan.
package migrate

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrRefused is wrapped by Plan.Err (and by Apply) when the plan holds
// refusals: the old layout cannot be moved as it is.
var ErrRefused = errors.New("migrate: the old layout cannot be moved as it is")

// ErrInvalidConfig is wrapped by ReadPlan for a Config it cannot use,
// naming the field and the value.
var ErrInvalidConfig = errors.New("migrate: invalid configuration")

// States of a position.Aside the plan writes, as the new engine reads
// them (position.Aside.State).
const (
	StateStuck      = "stuck"
	StateParked     = "parked"
	stateOrderStuck = "order-stuck"
	// StateBehind is the state of the cursors an unordered subscription
	// gets (position.Cursor.State): it reads its own events until it
	// reaches the shared read.
	StateBehind = "behind"
)

// noVersion is position.NoVersion.
const noVersion = position.NoVersion

// Config says where the old layout is and what the new one runs with.
type Config struct {
	// Events is the events stream. Default wire.DefaultEventsStream.
	Events string
	// Partitions is the partition count the new engine runs with
	// (--partitions). Required (1 or more). The partitioned copy's
	// transform must partition for the same count, or the plan refuses
	// (the partition function must agree, design section 2).
	Partitions int
	// Subscriptions are the subscriptions to move (legacy.Discover lists
	// the old layout's), by name, each once.
	// Consumers of the events stream or of the copy that belong to none
	// of them are left alone.
	Subscriptions []legacy.Subscription
	// DLQ is the dead-letter stream (a parked head's events stream
	// sequence is read from its dead letter). Default
	// wire.DefaultDLQStream; its subject prefix is wire.DefaultDLQPrefix
	// unless DLQPrefix says otherwise.
	DLQ       string
	DLQPrefix string
	// ReadPending reads each unordered durable's pending set back (see
	// SubscriptionPlan.Resent): it pulls from the stopped durable, never
	// acking, until every pending event came back or for its AckWait plus
	// its longest BackOff step plus 2 s, so that the events of (ack
	// floor, last delivered] it acked are not sent again. The durables'
	// reads run one after another. Each pull counts as a delivery attempt
	// of its events on the old durable, and new events it pulls stay
	// pending there. Default false: those events are counted as re-sent.
	ReadPending bool
	// Archetype is the engine's; its clock bounds ReadPending's reads.
	// Default base.Default (the real clock).
	*base.Archetype
}

func (c *Config) defaults() error {
	if c.Events == "" {
		c.Events = wire.DefaultEventsStream
	}
	if c.DLQ == "" {
		c.DLQ = wire.DefaultDLQStream
	}
	if c.DLQPrefix == "" {
		c.DLQPrefix = wire.DefaultDLQPrefix
	}
	c.Archetype = base.Default(c.Archetype)
	if c.Partitions < 1 {
		return fmt.Errorf("%w: Partitions %d: want 1 or more", ErrInvalidConfig, c.Partitions)
	}
	seen := map[string]bool{}
	for _, s := range c.Subscriptions {
		if !subscription.ValidName(s.Name) {
			return fmt.Errorf("%w: subscription name %q: want [A-Za-z0-9_-]+", ErrInvalidConfig, s.Name)
		}
		if seen[s.Name] {
			return fmt.Errorf("%w: subscription %q named twice", ErrInvalidConfig, s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// Plan is what the positions bucket would hold after the migration, and
// what it costs, subscription by subscription: what `consumer migrate
// --dry-run` prints. Sequences are the events stream's unless a field
// says otherwise.
type Plan struct {
	// Events is the events stream; EventsCreated its creation time
	// (written in every record: position.Config.Created); AllowDirect
	// whether it answers direct gets already (the migration turns it on
	// otherwise).
	Events        string    `json:"events"`
	EventsCreated time.Time `json:"events_created"`
	AllowDirect   bool      `json:"allow_direct"`
	// Copy is the partitioned copy read ("" when no ordered subscription
	// is moved), Sourced the events stream sequence its last message came
	// from.
	Copy    string `json:"copy,omitempty"`
	Sourced uint64 `json:"copy_sourced,omitempty"`
	// Partitions is P, written once to the positions bucket.
	Partitions int `json:"partitions"`
	// Epoch is the old lease epoch counter (0: none), copied unless the
	// positions bucket holds a higher one.
	Epoch uint64 `json:"lease_epoch"`
	// Skipped are the skipped-version records to copy, by key, their
	// values as stored.
	Skipped map[string]string `json:"skipped,omitempty"`
	// Subscriptions are the moved subscriptions, in Config's order.
	Subscriptions []SubscriptionPlan `json:"subscriptions"`
	// Records are the partition records, by partition (none when no
	// subscription has a position to move).
	Records []position.Record `json:"records,omitempty"`
	// Cursors are the cursor keys to write.
	Cursors []CursorPlan `json:"cursors,omitempty"`
	// Refusals say why the layout cannot be moved; the plan is not
	// applied while there is one.
	Refusals []Refusal `json:"refusals,omitempty"`
	// Fingerprint names what the plan writes (a hash of the partitions,
	// the epoch, the skipped records, the records and the cursors): a
	// second run over the same old layout computes the same, and finds
	// it done.
	Fingerprint string `json:"fingerprint"`
}

// SubscriptionPlan is one subscription's part of a plan.
type SubscriptionPlan struct {
	Name    string `json:"name"`
	Ordered bool   `json:"ordered"`
	// Floor: every event the subscription takes at or below it was
	// settled (an unordered durable's ack floor; the lowest of an ordered
	// subscription's partition floors, translated).
	Floor uint64 `json:"floor"`
	// Delivered is an unordered durable's last delivered sequence.
	Delivered uint64 `json:"delivered,omitempty"`
	// Pending is how many events were delivered and not acked (the
	// consumers' NumAckPending, summed): sent again by either engine.
	Pending int `json:"pending"`
	// Resent is how many events the old layout holds as acked that the
	// new one would send again (same Idempotency-Key): for an unordered
	// durable, those of (Floor, Delivered] it takes, less Pending (0
	// when its pending set was read back: Config.ReadPending); for an
	// ordered subscription 0, unless a delivered record could not be
	// read (then those of its partition's range, less its pending).
	Resent uint64 `json:"resent"`
	// Partitions are an ordered subscription's partitions.
	Partitions []PartitionPlan `json:"partitions,omitempty"`
	// Asides are its streams set aside or parked.
	Asides []StreamPlan `json:"asides,omitempty"`
	// Attempts counts its failed-attempt counts not carried (their event
	// is not pending above a floor).
	Attempts int `json:"attempts_not_carried,omitempty"`
	// Notes say what the plan could not read exactly, and what follows.
	Notes []string `json:"notes,omitempty"`
}

// PartitionPlan is one partition of an ordered subscription.
type PartitionPlan struct {
	Partition int `json:"partition"`
	// CopyFloor is the partition consumer's ack floor (a copy sequence),
	// Floor the same translated.
	CopyFloor uint64 `json:"copy_floor"`
	Floor     uint64 `json:"floor"`
	Pending   int    `json:"pending"`
	// Settled counts the streams settled above the floor (the delivered
	// record's entries, translated).
	Settled int `json:"settled"`
}

// StreamPlan is one stream of a subscription set aside or parked.
type StreamPlan struct {
	Partition int `json:"partition"`
	// Stream is the stream's key (wire.StreamKey of its subjects).
	Stream string `json:"stream"`
	// From: the stream's events from it on are not dispatched to the
	// subscription until it is re-read.
	From  uint64 `json:"from"`
	State string `json:"state"`
	// Head is a parked stream's dead-lettered head's event id.
	Head string `json:"head,omitempty"`
}

// CursorPlan is one cursor key to write: CursorKey(Subscription, Partition).
type CursorPlan struct {
	Subscription string          `json:"subscription"`
	Partition    int             `json:"partition"`
	Cursor       position.Cursor `json:"cursor"`
}

// Refusal is one reason the layout cannot be moved; Partition is -1 when
// it is not a partition's, Subscription "" when not a subscription's.
type Refusal struct {
	Subscription string `json:"subscription,omitempty"`
	Partition    int    `json:"partition"`
	Reason       string `json:"reason"`
}

// String says where (subscription, partition) and why.
func (r Refusal) String() string {
	var where []string
	if r.Subscription != "" {
		where = append(where, "subscription "+r.Subscription)
	}
	if r.Partition >= 0 {
		where = append(where, fmt.Sprintf("partition %d", r.Partition))
	}
	if len(where) == 0 {
		return r.Reason
	}
	return strings.Join(where, ", ") + ": " + r.Reason
}

// Err returns nil when the plan can be applied, else an error wrapping
// ErrRefused that lists the refusals.
func (p *Plan) Err() error {
	if len(p.Refusals) == 0 {
		return nil
	}
	reasons := make([]string, len(p.Refusals))
	for i, r := range p.Refusals {
		reasons[i] = r.String()
	}
	return fmt.Errorf("%w: %s", ErrRefused, strings.Join(reasons, "; "))
}

// refuse adds a refusal.
func (p *Plan) refuse(sub string, partition int, format string, args ...any) {
	p.Refusals = append(p.Refusals, Refusal{Subscription: sub, Partition: partition, Reason: fmt.Sprintf(format, args...)})
}
