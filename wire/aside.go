package wire

import (
	"encoding/hex"
	"strconv"
)

// AsideKey is the park bucket key recording that an ordered subscription
// set one stream aside: the stream's head was refused while its later
// events piled up, so those were acked out of the partition consumer, to
// be read again from the partitioned copy once the head goes:
// "aside.<subscription>.<partition>.<hex of the stream key>" (four
// tokens, so ParkedFilter of a subscription never matches it). streamKey
// is StreamKey of the stream's subjects in the partitioned copy.
func AsideKey(subscription string, partition int, streamKey string) string {
	return AsideKeyPrefix + subscription + "." + strconv.Itoa(partition) + "." + hex.EncodeToString([]byte(streamKey))
}

// AsideKeyPrefix starts every AsideKey: listings of the park bucket skip
// these keys.
const AsideKeyPrefix = "aside."

// AsideFilter matches the AsideKeys of subscription.
func AsideFilter(subscription string) string { return AsideKeyPrefix + subscription + ".>" }

// AsideFilterPartition matches the AsideKeys of one partition of
// subscription.
func AsideFilterPartition(subscription string, partition int) string {
	return AsideKeyPrefix + subscription + "." + strconv.Itoa(partition) + ".*"
}
