package wire

import (
	"encoding/hex"
	"strconv"
	"time"
)

// AsideKey is the park bucket key recording that an ordered subscription
// set one stream aside: the stream's head was refused while its later
// events piled up, so those were acked out of the partition consumer, to
// be read again from the partitioned copy once the head goes:
// "aside.<subscription>.<partition>.<hex of the stream key>" (four
// tokens, so a subscription's ParkedKey pattern never matches it). streamKey
// is StreamKey of the stream's subjects in the partitioned copy.
func AsideKey(subscription string, partition int, streamKey string) string {
	return AsideKeyPrefix + subscription + "." + strconv.Itoa(partition) + "." + hex.EncodeToString([]byte(streamKey))
}

// AsideKeyPrefix starts every AsideKey: listings of the park bucket skip
// these keys.
const AsideKeyPrefix = "aside."

// AsideRecord is the value of an AsideKey, as JSON: the old engine's
// partition owners write it when they set a stream aside, `consumer
// status` and `consumer migrate` read it. Sequences are the partitioned
// copy's.
type AsideRecord struct {
	Subscription string `json:"subscription"`
	Partition    int    `json:"partition"`
	// Subject is a subject of the stream in the partitioned copy.
	Subject string `json:"subject"`
	// Start is the copy sequence of the first event set aside: the
	// stream's events from it on are acked out of the partition consumer
	// as they come (those before it are delivered as usual).
	Start uint64 `json:"start"`
	// Head is the copy sequence of the stream's head in its lane when it
	// was set aside (refused): the re-read starts once it settled.
	Head uint64 `json:"head,omitempty"`
	// From is the copy sequence the stream is re-read from: every event
	// of the stream before it was settled.
	From uint64 `json:"from"`
	// Replica is the replica that set it aside, At when.
	Replica string    `json:"replica,omitempty"`
	At      time.Time `json:"set_aside_at"`
	// HeadEventID and HeadVersion name the refused head (its event id
	// and ce-streamversion) and Answer the receiver's last answer to it
	// when the stream was set aside; empty for a parked stream's events
	// (Parked), whose head is in the dead-letter stream.
	HeadEventID string `json:"head_event_id,omitempty"`
	HeadVersion string `json:"head_version,omitempty"`
	Answer      string `json:"answer,omitempty"`
	// Parked is true when the stream was set aside because it is parked
	// (its held events pressed on the partition consumer's
	// MaxAckPending).
	Parked bool `json:"parked,omitempty"`
}
