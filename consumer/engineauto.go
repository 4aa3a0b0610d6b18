package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/promreg"
	"github.com/jsbridge/jsbridge/internal/startup"
)

// Engine returns the engine that delivers, EngineShared or
// EngineDurables: Config.Engine when it names one, else the one
// Provision picked (PickEngine); "" before Provision picked it.
func (c *Consumer) Engine() string {
	c.emu.Lock()
	defer c.emu.Unlock()
	return c.running
}

// pick returns c's engine, made on the first call with Config.Engine
// EngineAuto from what PickEngine reads on the server (its errors are
// returned: the events stream missing is waited for by Provision; an
// engine that cannot be made is an error marked permanent). A
// deployment of the durables engine not yet moved is warned of once,
// here.
func (c *Consumer) pick(ctx context.Context) (engine, error) {
	c.emu.Lock()
	defer c.emu.Unlock()
	if c.engine != nil {
		return c.engine, nil
	}
	p, err := PickEngine(ctx, c.js, c.cfg.Stream)
	if err != nil {
		return nil, err
	}
	if p.Unmoved {
		c.cfg.Logger.Warn("engine auto: running the durables engine, since this deployment was not moved to the shared engine: stop every replica and run `consumer migrate` (docs/operations.md, \"Moving to shared readers\")",
			slog.String("engine", p.Engine), slog.String("reason", p.Reason))
	} else {
		c.cfg.Logger.Info("engine auto: running the shared engine", slog.String("engine", p.Engine), slog.String("reason", p.Reason))
	}
	if err := c.build(p.Engine); err != nil {
		return nil, startup.Permanent(err) // its metrics clash: waiting cannot fix it
	}
	return c.engine, nil
}

// build makes the engine name (EngineShared or EngineDurables) of c's
// subscriptions, and shows it in jsbridge_consumer_engine.
func (c *Consumer) build(name string) error {
	cfg, ecfg := c.cfg, c.ecfg
	switch {
	case name == EngineShared:
		var subs []subscription.Subscription
		if cfg.SubscriptionStore == nil {
			subs = engineSubscriptions(cfg.Subscriptions)
		}
		se, err := newSharedEngine(c.js, cfg, ecfg, c.dlq, subs)
		if err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
		c.engine = se
		if cfg.SubscriptionStore != nil {
			c.live, se.loaded = se, make(chan struct{})
		}
	case cfg.SubscriptionStore != nil:
		fleet, err := deliver.NewFleet(c.js, ecfg)
		if err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
		c.fleet, c.engine, c.live = fleet, fleet, fleetSubscriptions{fleet}
	default:
		e, err := deliver.New(c.js, ecfg, engineSubscriptions(cfg.Subscriptions)...)
		if err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
		c.engine = e
	}
	c.running = name
	c.engineGauge.WithLabelValues(name).Set(1)
	return nil
}

// engineGauge returns jsbridge_consumer_engine (engine) registered on reg,
// or the one registered there already (nil reg: unregistered).
func engineGauge(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "jsbridge_consumer_engine",
		Help: "The delivery engine this process runs: 1 for its engine label (shared or durables), nothing before it picked one.",
	}, []string{"engine"})
	if reg == nil {
		return g, nil
	}
	return promreg.Register(reg, g)
}
