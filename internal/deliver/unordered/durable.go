package unordered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// createConsumer creates r's durable pull consumer with the
// subscription's start, or updates the existing one, which keeps its
// start and position (ErrStartChanged when the subscription's start
// differs from the one it records).
func (r *Runner) createConsumer(ctx context.Context) (jetstream.Consumer, error) {
	cfg := r.consumerConfig()
	replicas, err := r.consumerReplicas(ctx)
	if err != nil {
		return nil, err
	}
	cfg.Replicas = replicas
	existing, err := r.js.Consumer(ctx, r.stream, cfg.Durable)
	switch {
	case err == nil:
		have := existing.CachedInfo().Config
		if err := subscription.CheckStart(r.sub.Name, r.sub.Start, have, cfg.Durable, r.stream,
			fmt.Sprintf("nats consumer rm %s %s", r.stream, cfg.Durable)); err != nil {
			return nil, err
		}
		subscription.KeepStart(&cfg, have)
		r.log.Info("durable consumer exists: it keeps its start and position", slog.String("durable", cfg.Durable), slog.String("start", subscription.ReportedStart(have)))
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		subscription.ApplyStart(&cfg, r.sub.Start)
		cons, err := r.js.CreateConsumer(ctx, r.stream, cfg)
		if err == nil {
			r.log.Info("durable consumer created", slog.String("durable", cfg.Durable), slog.String("start", r.sub.Start.String()))
			return cons, nil
		}
		if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
			return nil, fmt.Errorf("deliver: subscription %q: create durable consumer on JetStream stream %q: %w (%s)", r.sub.Name, r.stream, err, consumersLimitHint)
		}
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return nil, fmt.Errorf("deliver: subscription %q: create durable consumer on JetStream stream %q: %w", r.sub.Name, r.stream, err)
		}
		// Another replica created it meanwhile: look again.
		return r.createConsumer(ctx)
	default:
		return nil, fmt.Errorf("deliver: subscription %q: look up durable consumer on JetStream stream %q: %w", r.sub.Name, r.stream, err)
	}
	cons, err := r.js.CreateOrUpdateConsumer(ctx, r.stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("deliver: subscription %q: create or update durable consumer on JetStream stream %q: %w", r.sub.Name, r.stream, err)
	}
	return cons, nil
}

// Description begins the description of an unordered subscription's
// durable consumer, followed by its endpoint (the engine's ReadPositions
// finds them by it).
const Description = "jsbridge webhook subscription to "

// consumersLimitHint follows JetStream's "maximum consumers limit
// reached" in the error of a durable consumer it refused: nats-server
// caps a stream at 1,000 consumers unless told otherwise, one per
// unordered subscription (sixteen per ordered one on the partitioned
// copy).
const consumersLimitHint = "nats-server allows 1,000 consumers per stream by default: one per unordered subscription, 16 per ordered one; " +
	"raise it with jetstream { limits { default_max_consumers: -1 } } in the server's configuration, or the stream's or account's max_consumers"

// consumerConfig is the durable pull consumer of r's subscription. BackOff
// is applied by NakWithDelay, not set on the consumer: a server-side BackOff
// would replace AckWait with BackOff[0] (nats-server consumer.go) and
// redeliver a slow but healthy POST. MaxDeliver is enforced by the
// consumer, not the server (which gets -1): a failure on attempt
// MaxDeliver is dead-lettered, and when the dead letter cannot be written
// the Nak'd message must still come back, which a server-side MaxDeliver
// would prevent (the event would be dropped).
func (r *Runner) consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        r.sub.Name,
		Description:    Description + r.endpoint,
		FilterSubjects: r.sub.FilterSubjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        r.sub.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  r.sub.MaxAckPending,
	}
}

// consumerReplicas returns the replica count to create or update r's
// durable consumer with: Config.Replicas for a new one; for an existing
// one with another count, its own count, with a warning naming the
// consumer, the stream, have and want. Scaling a consumer moves its state
// between servers, which is the operator's decision, as for streams
// (forward.Provision). A zero count (the stream's) is compared as the
// stream's count.
func (r *Runner) consumerReplicas(ctx context.Context) (int, error) {
	want := r.replicas
	cons, err := r.js.Consumer(ctx, r.stream, r.sub.Name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return want, nil
	}
	if err != nil {
		return 0, fmt.Errorf("deliver: subscription %q: look up durable consumer on JetStream stream %q: %w", r.sub.Name, r.stream, err)
	}
	have := cons.CachedInfo().Config.Replicas
	if have == want {
		return want, nil
	}
	haveN, wantN := have, want
	if have == 0 || want == 0 {
		s, err := r.js.Stream(ctx, r.stream)
		if err != nil {
			return 0, fmt.Errorf("deliver: subscription %q: look up JetStream stream %q: %w", r.sub.Name, r.stream, err)
		}
		if n := s.CachedInfo().Config.Replicas; have == 0 {
			haveN = n
		} else {
			wantN = n
		}
	}
	if haveN != wantN {
		r.log.Warn(fmt.Sprintf("durable consumer %s on JetStream stream %s has %d replica(s), not the %d asked for; it is left as it is: "+
			"change it with: nats consumer edit %s %s --replicas %d", r.sub.Name, r.stream, haveN, wantN, r.stream, r.sub.Name, wantN),
			slog.String("jetstream_stream", r.stream), slog.Int("have", haveN), slog.Int("want", wantN))
	}
	return have, nil
}
