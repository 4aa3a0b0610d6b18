package wire

// Subscriptions managed at runtime (`consumer subscriptions ...`) live in a
// JetStream key-value bucket: one key per subscription, its name, whose
// value is a versioned JSON document (docs/wire.md, "Subscriptions
// bucket"). Every consumer replica run with --subscriptions-from kv
// watches it.
const (
	// DefaultSubscriptionsBucket is the JetStream key-value bucket holding
	// the subscriptions managed at runtime; created on first use.
	DefaultSubscriptionsBucket = "jsbridge_subscriptions"
	// SubscriptionDocumentVersion is the version of the subscription
	// document layout written today (its "version" field). A reader
	// refuses a document of a later version, naming both.
	SubscriptionDocumentVersion = 1
)
