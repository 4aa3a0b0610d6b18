package unordered

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// Pull timing of a Fleet's unordered units. An idle pull request costs
// a heartbeat message from the server every pull.Heartbeat and a new
// request every pull expiry (30 s by default): 2 s heartbeats are 500
// messages a second at 1,000 subscriptions, through the server and the
// consumer, with no event. A Fleet stretches its units' heartbeats with
// their number, so that an idle replica's heartbeats stay near
// fleetHeartbeatRate a second, between pull.Heartbeat and
// fleetMaxHeartbeat, and their pull expiry to fleetExpiryBeats
// heartbeats (at least nats.go's 30 s). The price: a pull request lost
// on the server's side (see pull.Heartbeat) stalls its subscription for
// up to two heartbeats, 60 s at the longest, instead of 4 s.
const (
	fleetHeartbeatRate = 200 // heartbeats a second, a whole idle replica
	fleetMaxHeartbeat  = 30 * time.Second
	fleetExpiryBeats   = 4
	defaultPullExpiry  = 30 * time.Second // nats.go's
)

// pullTiming returns the heartbeat and pull expiry of a unit of a Fleet
// running units subscriptions (units <= 0: not in a Fleet: pull.Heartbeat
// and nats.go's expiry).
func pullTiming(units int) (heartbeat, expiry time.Duration) {
	heartbeat = pull.Heartbeat
	if units > 0 {
		heartbeat = min(max(pull.Heartbeat, time.Duration(units)*time.Second/fleetHeartbeatRate), fleetMaxHeartbeat)
	}
	return heartbeat, max(defaultPullExpiry, fleetExpiryBeats*heartbeat)
}

// pullOptions are the Messages options of r's pull: its client buffer
// (MaxInFlight messages) and pullTiming's heartbeat and expiry, without
// an error on missed heartbeats (nats.go issues new pull requests).
func (r *Runner) pullOptions() []jetstream.PullMessagesOpt {
	hb, expiry := pullTiming(r.units())
	return []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(r.sub.MaxInFlight), jetstream.PullHeartbeat(hb),
		jetstream.PullExpiry(expiry), jetstream.WithMessagesErrOnMissingHeartbeat(false)}
}
