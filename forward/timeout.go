package forward

import (
	"time"

	"github.com/jsbridge/jsbridge/drain"
)

// MaxPublishTimeout is the longest publish timeout that suits a drain with
// the given lease (drain.DefaultLease when 0): half of
// drain.HandlerTimeout(lease), that is 40% of the lease. A cycle's handler
// must be done HandlerTimeout after the claim, and in that time a stream
// may need a reconciliation lookup and then its publish, each waiting up to
// the publish timeout: at half each, both can wait their full time before
// the cycle's deadline cuts them short. With the defaults (30 s lease) it
// is 12 s.
func MaxPublishTimeout(lease time.Duration) time.Duration {
	return drain.HandlerTimeout(lease) / 2
}

// FitPublishTimeout returns the publish timeout to use with a drain of the
// given lease: publish (DefaultPublishTimeout when 0) when it is at most
// MaxPublishTimeout(lease), else MaxPublishTimeout(lease) with lowered set
// so the caller can say so. A negative publish is returned as it is (New
// rejects it). lease 0 means drain.DefaultLease.
func FitPublishTimeout(publish, lease time.Duration) (fitted time.Duration, lowered bool) {
	if publish == 0 {
		publish = DefaultPublishTimeout
	}
	if most := MaxPublishTimeout(lease); publish > most {
		return most, true
	}
	return publish, false
}
