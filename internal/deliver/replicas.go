package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
)

// consumerReplicas returns the replica count to create or update r's
// durable consumer with: Config.Replicas for a new one; for an existing
// one with another count, its own count, with a warning naming the
// consumer, the stream, have and want. Scaling a consumer moves its state
// between servers, which is the operator's decision, as for streams
// (forward.Provision). A zero count (the stream's) is compared as the
// stream's count.
func (r *runner) consumerReplicas(ctx context.Context) (int, error) {
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
