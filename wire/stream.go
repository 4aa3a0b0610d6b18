package wire

// Default JetStream stream names and subject prefixes. Both binaries take
// them as flag defaults (--stream, --subject-prefix, --dlq-stream).
const (
	// DefaultEventsStream is the JetStream stream the bridge publishes
	// events to and the consumer reads.
	DefaultEventsStream = "EVENTS"
	// DefaultEventsPrefix is the first subject token of an event; the events
	// stream holds "<prefix>.>".
	DefaultEventsPrefix = "events"
	// DefaultDLQStream is the JetStream stream holding dead letters.
	DefaultDLQStream = "DLQ"
	// DefaultDLQPrefix is the first subject token of a dead letter; the
	// dead-letter stream holds "<prefix>.>" (see DLQSubject).
	DefaultDLQPrefix = "dlq"
)

// All returns the filter matching every subject under prefix:
// "<prefix>.>". It is the subject a stream under prefix holds.
func All(prefix string) string { return prefix + ".>" }

// The attempts record: the consumer writes one message per delivery
// attempt to this JetStream stream (bounded by a max age and a max size),
// which `consumer trace EVENT_ID` reads back.
const (
	// DefaultAttemptsStream is the JetStream stream of attempt records.
	DefaultAttemptsStream = "JSBRIDGE_ATTEMPTS"
	// DefaultAttemptsPrefix is the first subject token of an attempt
	// record; the stream holds "<prefix>.>" (see AttemptSubject).
	DefaultAttemptsPrefix = "attempts"
)
