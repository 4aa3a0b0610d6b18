package deliver

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/owner"
)

// buckets are the lease and park buckets' configurations, as provision
// creates them.
type buckets struct {
	js     jetstream.JetStream
	log    *slog.Logger
	leases jetstream.KeyValueConfig
	parks  jetstream.KeyValueConfig
}

// restore creates the lease and park buckets again where they are gone:
// deleted while replicas run (by an operator, or a JetStream store lost).
// The key-value handles the replica holds name their bucket, so they work
// again once it exists; what the deleted buckets held is gone: leases are
// claimed again (their epochs come from the park bucket's epoch counter,
// not from the lease bucket's revisions, see owner.Epochs), and a park
// entry lost lets its stream's held events go on.
func (b buckets) restore(ctx context.Context) {
	for _, cfg := range []jetstream.KeyValueConfig{b.leases, b.parks} {
		if _, err := b.js.KeyValue(ctx, cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
			continue
		}
		if _, err := owner.Bucket(ctx, b.js, cfg); err != nil {
			b.log.Warn("a key-value bucket of ordered delivery is gone; creating it again failed, retrying at the next round",
				slog.String("bucket", cfg.Bucket), slog.Any("error", err))
			continue
		}
		b.log.Warn("a key-value bucket of ordered delivery was deleted while this replica ran; created it again",
			slog.String("bucket", cfg.Bucket))
	}
}

// sharedMemberView is the member view a Fleet's ordered units share: made
// by the first unit that asks for it, run until the Fleet stops. A view
// per unit would bring every unit every other unit's heartbeats: n²
// deliveries a cycle (250 a second at 25 units).
type sharedMemberView struct {
	mu   sync.Mutex
	ctx  context.Context // the Fleet's run (start)
	view *owner.MemberView
	wg   sync.WaitGroup
}

// start sets the context the view runs in once made: the Fleet's run.
func (sv *sharedMemberView) start(ctx context.Context) {
	sv.mu.Lock()
	sv.ctx = ctx
	sv.mu.Unlock()
}

// get returns the shared view; the first call makes it with newView and
// runs it until the context of start ends.
func (sv *sharedMemberView) get(newView func() *owner.MemberView) *owner.MemberView {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.view == nil {
		mv, ctx := newView(), sv.ctx
		if ctx == nil {
			ctx = context.Background() // not started: a unit outside Run (tests)
		}
		sv.view = mv
		sv.wg.Go(func() { mv.Run(ctx) })
	}
	return sv.view
}

// wait waits for the view's run to end.
func (sv *sharedMemberView) wait() { sv.wg.Wait() }
