package wire

import "encoding/hex"

// SkippedKey is the park bucket key of the versions of one stream that an
// ordered subscription dead-lettered and never delivered (skipped, or
// gone past by on_dead_letter "continue"), with the predecessor each of
// them carried: "skipped.<subscription>.<hex of the stream key>" (three
// tokens, so the old engine's park entries' pattern "<subscription>.*"
// never matches it). The version chain (Jsbridge-Previous-Version) reads
// it to step over a version the receiver never accepted; streamKey is
// StreamKey of the stream's subjects on the events stream.
func SkippedKey(subscription, streamKey string) string {
	return SkippedKeyPrefix + subscription + "." + hex.EncodeToString([]byte(streamKey))
}

// SkippedKeyPrefix starts every SkippedKey: listings of the park bucket
// skip these keys.
const SkippedKeyPrefix = "skipped."
