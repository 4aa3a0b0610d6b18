// The timing rules that tie a bridge's knobs together: the publish
// timeout a lease leaves room for, and the duplicate window a takeover
// needs.

package bridge

import (
	"time"

	"github.com/jsbridge/jsbridge/drain"
)

// MaxPublishTimeout is the longest PublishTimeout that suits a bridge with
// the given Lease (DefaultLease when 0): 40 % of it. A drain cycle's
// publishes must be done 80 % of the lease after its claim (the rest is
// left to settle before the leases run out), and in that time a stream
// may need a reconciliation look-up and then its publish, each waiting up
// to the publish timeout: at half each, both can wait their full time
// before the cycle's deadline cuts them short. With the defaults (30 s
// lease) it is 12 s.
func MaxPublishTimeout(lease time.Duration) time.Duration {
	return drain.HandlerTimeout(lease) / 2
}

// FitPublishTimeout returns the PublishTimeout to use with the given
// Lease: publish (DefaultPublishTimeout when 0) when it is at most
// MaxPublishTimeout(lease), else MaxPublishTimeout(lease) with lowered
// set so the caller can say so (New does, naming the Config fields; `bridge
// run` names its flags). A negative publish is returned as it is
// (Validate rejects it). lease 0 means DefaultLease.
func FitPublishTimeout(publish, lease time.Duration) (fitted time.Duration, lowered bool) {
	if publish == 0 {
		publish = DefaultPublishTimeout
	}
	if most := MaxPublishTimeout(lease); publish > most {
		return most, true
	}
	return publish, false
}

// RequiredDuplicateWindow returns the duplicate window a bridge needs: its
// worst case between the first publish of an event and a re-publish of the
// same event, which is a lease that expires (the bridge died after
// publishing but before acking) plus the retry envelope (the longest a
// publish can wait: PublishTimeout). Negative durations count as 0. Start
// warns when Config.DuplicateWindow is shorter.
func RequiredDuplicateWindow(lease, retryEnvelope time.Duration) time.Duration {
	return max(lease, 0) + max(retryEnvelope, 0)
}
