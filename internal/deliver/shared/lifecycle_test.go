package shared

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/unpark"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/internal/lifecycle/lifecycletest"
	"github.com/jsbridge/jsbridge/wire"
)

// TestEveryPartSurvivesConcurrentStartsAndStops starts and stops each
// long-running part of the engine from many goroutines at once, round
// after round, on a real JetStream (lifecycletest.Stress): no panic, no
// race (-race), every Stop returns with Stopped closed, and no goroutine
// of the part is left after the last Stop (goleak).
func TestEveryPartSurvivesConcurrentStartsAndStops(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := t.Context()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	poskv, err := position.Bucket(ctx, js, position.DefaultBucket, 1)
	require.NoError(t, err)
	leasekv, err := owner.Bucket(ctx, js, owner.LeaseBucketConfig(wire.DefaultLeaseBucket, time.Second, 1))
	require.NoError(t, err)
	arch := base.New(clockwork.NewRealClock(), nil, "stress")
	// Every bucket exists before the leak checks: a new stream's
	// goroutines are the server's.
	hs, err := health.New(health.Config{}, health.Deps{Archetype: arch, JetStream: js}, nil)
	require.NoError(t, err)
	hs.Load(ctx)
	sub := subscription.Subscription{Name: "orders", FilterSubjects: []string{"events.>"}, URL: "http://127.0.0.1:1/hook",
		Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, AllowPrivate: true}

	var claims sync.WaitGroup // the stressed owner's claims, served until released
	gained := func(c *owner.Claim) { claims.Go(func() { <-c.Context().Done(); c.Done() }) }

	parts := []struct {
		name   string
		rounds int
		make   func(t *testing.T) lifecycle.Part
	}{
		{"owner.MemberView", 25, func(*testing.T) lifecycle.Part {
			return owner.NewMemberView(arch, leasekv, time.Second, nil)
		}},
		{"owner.Owner", 20, func(t *testing.T) lifecycle.Part {
			o, err := owner.New(owner.Config{Archetype: arch, Partitions: 4, LeaseTTL: time.Second,
				ReleaseWait: time.Second}, owner.Deps{JetStream: js, Epochs: owner.Epochs{KV: poskv}}, owner.Callbacks{Gained: gained})
			require.NoError(t, err)
			return o
		}},
		{"health.State", 25, func(t *testing.T) lifecycle.Part {
			h, err := health.New(health.Config{}, health.Deps{Archetype: arch, JetStream: js}, []string{"orders"})
			require.NoError(t, err)
			return h
		}},
		{"position.Partition", 50, func(t *testing.T) lifecycle.Part {
			p, err := position.Claim(ctx, js, poskv, position.Config{Archetype: arch, Partition: 0, Owner: "stress", Epoch: 1})
			require.NoError(t, err)
			return p
		}},
		{"unpark.Requests", 25, func(*testing.T) lifecycle.Part { return unpark.New(poskv, nil) }},
		{"attemptlog.Log", 50, func(t *testing.T) lifecycle.Part {
			l, err := attemptlog.New(js, attemptlog.Config{Archetype: arch})
			require.NoError(t, err)
			return l
		}},
		{"shared.loop", 50, func(*testing.T) lifecycle.Part {
			return newLoop(arch, js, reader.Config{Archetype: arch}, func() int { return 0 })
		}},
		{"shared.Replica", 10, func(t *testing.T) lifecycle.Part {
			r, err := New(Config{Archetype: arch, Partitions: 4, LeaseTTL: time.Second},
				Deps{JetStream: js, Subscriptions: []subscription.Subscription{sub}})
			require.NoError(t, err)
			return r
		}},
		{"lifecycle.Func", 50, func(*testing.T) lifecycle.Part {
			return lifecycle.NewFunc(func(ctx context.Context) error { <-ctx.Done(); return nil })
		}},
	}
	// The server ends a watch's consumer a moment after the client
	// stopped it: its goroutines are the server's, not the part's.
	serverSide := []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*consumer).processInboundAcks"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*consumer).loopAndGatherMsgs"),
	}
	for _, p := range parts {
		t.Run(p.name, func(t *testing.T) {
			part := p.make(t)
			before := goleak.IgnoreCurrent()
			lifecycletest.Stress(t, ctx, part, p.rounds, 8)
			claims.Wait()
			goleak.VerifyNone(t, append(serverSide, before)...)
		})
	}
}
