package wire

// DeliveredKeyPrefix starts the park bucket keys of the durables engine's
// delivered records ("delivered.<subscription>.<p>", three tokens, so
// a subscription's ParkedKey pattern "<subscription>.*" never matches
// them): listings of the
// park bucket skip these keys. The records themselves are read by
// `consumer migrate` alone (package internal/deliver/migrate/legacy).
const DeliveredKeyPrefix = "delivered."
