package ordercopy

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/wire"
)

// CheckEvery is how often the copy's lag is read and its unsettled
// events' ages checked: every lease TTL, at most every 5 s.
func CheckEvery(leaseTTL time.Duration) time.Duration { return min(leaseTTL, 5*time.Second) }

// Watch reads the partitioned copy every Every: it sets the copy lag
// gauges, records the copy's MaxAge (the park room checks held events
// against it) and logs an error while the copy is past RetentionWarn of
// its MaxBytes. Every field is required.
type Watch struct {
	JS     jetstream.JetStream
	Events string        // the events stream's name; the copy is wire.OrderedStream of it
	Every  time.Duration // how often it reads the copy (CheckEvery)
	Clock  clockwork.Clock
	Logger *slog.Logger
	// LagMessages and LagSeconds are jsbridge_consumer_ordered_copy_lag_messages
	// and _seconds, by copy stream.
	LagMessages, LagSeconds *prometheus.GaugeVec
	// MaxAge is where the copy's MaxAge (nanoseconds, 0: none) is stored
	// each time it is read: an operator may change it.
	MaxAge *atomic.Int64
}

// Run reads the copy until ctx ends.
func (cw *Watch) Run(ctx context.Context) {
	name := wire.OrderedStream(cw.Events)
	var full bool
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lag, err := inspect.ReadCopyLag(rctx, cw.JS, cw.Events, cw.Clock.Now())
		var info *jetstream.StreamInfo
		if err == nil {
			var s jetstream.Stream
			if s, err = cw.JS.Stream(rctx, name); err == nil {
				info = s.CachedInfo()
			}
		}
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			cw.Logger.Warn("reading the partitioned copy's lag failed", slog.Any("error", err))
		case err == nil:
			cw.LagMessages.WithLabelValues(lag.Stream).Set(float64(lag.Messages))
			cw.LagSeconds.WithLabelValues(lag.Stream).Set(lag.Age.Seconds())
			cw.MaxAge.Store(int64(info.Config.MaxAge)) // an operator may have changed it
			max := info.Config.MaxBytes
			nearFull := max > 0 && info.State.Bytes >= uint64(max)/4*RetentionWarn
			if nearFull && !full {
				cw.Logger.Error(fmt.Sprintf("the partitioned copy is past 3/4 of its MaxBytes: once full it removes its oldest messages, "+
					"and events held behind a parked stream or not delivered yet among them are never delivered. "+
					"Replay or skip parked streams (consumer dlq), or raise it: nats stream edit %s --max-bytes", name),
					slog.String("jetstream_stream", name), slog.Uint64("bytes", info.State.Bytes), slog.Int64("max_bytes", max))
			}
			full = nearFull
		}
		select {
		case <-ctx.Done():
		case <-cw.Clock.After(cw.Every):
		}
	}
}
