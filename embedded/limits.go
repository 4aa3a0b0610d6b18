package embedded

// UnlimitedConsumers is the embedded servers' (Start, StartCluster)
// default_max_consumers: no limit on the consumers of a stream that sets
// none itself. nats-server otherwise caps every stream at 1,000 consumers
// (JSDefaultMaxConsumersPerStream), and jsbridge keeps one durable
// consumer per unordered subscription on the events stream and sixteen
// per ordered one on its partitioned copy: the 1,001st subscription's
// durable consumer would be refused ("maximum consumers limit reached",
// API error 10026). A server of your own needs the same setting to run
// more than 1,000 subscriptions (docs/subscriptions-kv.md, "Limits"):
//
//	jetstream { limits { default_max_consumers: -1 } }
const UnlimitedConsumers = -1
