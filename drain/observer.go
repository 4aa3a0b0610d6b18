package drain

import "time"

// How a stream was settled, as Observer.Settled reports it (metric label
// values).
const (
	SettledAcked     = "acked"
	SettledRetried   = "retried"
	SettledBlocked   = "blocked"
	SettledReleased  = "released"
	SettledLeaseLost = "lease_lost"
	SettledError     = "error"
)

// Observer is told what the drain does, for metrics. Its methods are called
// from the drain's goroutine and must not block.
type Observer interface {
	// Claimed is called after every Claim: how many streams it leased, how
	// long it took, and its error (nil on success).
	Claimed(streams int, took time.Duration, err error)
	// Settled is called once per settled stream: how (SettledAcked, ...),
	// how many events it forwarded, and how long the store call took (for
	// streams acked together by one Store.AckStreams call, that call's).
	Settled(stream, how string, forwarded int, took time.Duration)
}

type noObserver struct{}

func (noObserver) Claimed(int, time.Duration, error)          {}
func (noObserver) Settled(string, string, int, time.Duration) {}
