package deliver

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/unordered"
)

// fleetShared is what a Fleet's units share instead of building their
// own: the health state (one watch of the health bucket, one disabled
// gauge, the shared breaker states handed to the one breaker Set) and the
// notifier announcing disables. Without it every unit opened its own
// watch of the health bucket (an ordered JetStream consumer each on the
// server, pushing idle heartbeats) and called Breakers.Share again.
//
// census lists the units' durable consumers for them (unordered.Census).
type fleetShared struct {
	health *health.State
	census *unordered.Census
	// units is the number of the Fleet's subscriptions (Put adds, Pause
	// takes away).
	units atomic.Int64
	// members is the lease bucket's member view of the ordered units:
	// one watch for the replica (owner.MemberView).
	members sharedMemberView
}

// newFleetShared builds the health of cfg (defaults filled) once.
func newFleetShared(js jetstream.JetStream, cfg Config) (*fleetShared, error) {
	h, err := newHealth(js, cfg, nil)
	if err != nil {
		return nil, err
	}
	return &fleetShared{health: h, census: unordered.NewCensus(js, cfg.Stream, cfg.Clock)}, nil
}

// newHealth builds the health of the subscriptions names for cfg
// (defaults filled), and shares the breakers through the health bucket
// unless cfg.LocalBreakers.
func newHealth(js jetstream.JetStream, cfg Config, names []string) (*health.State, error) {
	d := health.Deps{JetStream: js, Clock: cfg.Clock, Logger: cfg.Logger, Replica: cfg.ReplicaID, Replicas: cfg.Replicas,
		Registerer: cfg.Registerer, HTTPClient: egress.NoRedirects(cfg.HTTPClient)}
	if !cfg.LocalBreakers {
		d.Breakers = cfg.Breakers
	}
	h, err := health.New(cfg.Health, d, names)
	if err != nil {
		return nil, err
	}
	if !cfg.LocalBreakers {
		cfg.Breakers.Share(h.BreakerStore(), cfg.ReplicaID)
	}
	return h, nil
}

// run reads the disabled subscriptions once (bounded by
// healthLoadTimeout), then calls started and follows the health bucket
// until ctx ends; it returns once the announcements under way are sent.
func (s *fleetShared) run(ctx context.Context, started func()) {
	s.members.start(ctx)
	defer s.members.wait()
	lctx, cancel := context.WithTimeout(ctx, healthLoadTimeout)
	s.health.Load(lctx)
	cancel()
	started()
	var wg sync.WaitGroup
	wg.Go(func() { s.health.Run(ctx) })
	wg.Go(func() { s.census.Run(ctx) })
	wg.Wait()
	s.health.Wait()
}

// unitCount is the number of subscriptions the Fleet runs (0 for a nil
// s).
func (s *fleetShared) unitCount() int {
	if s == nil {
		return 0
	}
	return int(s.units.Load())
}

// added sets the disabled gauge of a subscription the Fleet runs from now
// on (0 unless it is disabled).
func (s *fleetShared) added(name string) {
	s.health.Added(name)
}
