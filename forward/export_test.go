package forward

// The package's unexported sentinels and helpers, for its external tests.
var (
	ErrLostInJetStream = errLostInJetStream
	ErrNotAttempted    = errNotAttempted
	ErrInvalidData     = errInvalidData
	ErrWrongStream     = errWrongStream
	ReplicasWarning    = replicasWarning
)
