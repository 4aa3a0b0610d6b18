package deliver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/promreg"
	"github.com/jsbridge/jsbridge/wire"
)

// Disabling: a subscription whose endpoint answered 410 Gone, or failed
// without a success for HealthConfig.DisableAfter across at least
// DisableMinFailures attempts, is disabled: every replica stops delivering
// to it, its durable consumers keep their position, and the events in hand
// wait unsent (no attempt spent, nothing dead-lettered). The state is the
// key wire.DisabledKey(subscription) of the health bucket, so every
// replica sees it and a restart keeps it; `consumer subscriptions enable`
// deletes it. The replica that disables (the one whose KV Create wins)
// publishes the operational event and sends the operational webhook. A
// health bucket that cannot be reached degrades to this replica's own
// state (logged once): disabling never fails a delivery.

// Disable reasons (DisabledRecord.Reason).
const (
	// ReasonGone: the endpoint answered 410 Gone.
	ReasonGone = "gone"
	// ReasonFailing: no success for HealthConfig.DisableAfter.
	ReasonFailing = "failing"
	// ReasonOperator: disabled by `consumer subscriptions disable`.
	ReasonOperator = "operator"
)

// healthWriteTimeout bounds a delivery's write of a disabled key: past
// it the subscription stays disabled on this replica only (degraded).
const healthWriteTimeout = 5 * time.Second

// Defaults of HealthConfig.
const (
	DefaultDisableAfter       = 24 * time.Hour
	DefaultDisableMinFailures = 10
)

// HealthConfig configures automatic disabling and its notification.
type HealthConfig struct {
	// DisableAfter disables a subscription whose endpoint has not answered
	// 2xx for this long while failing (retryable failures: 5xx,
	// timeouts, network errors), once at least DisableMinFailures attempts
	// failed. Default DefaultDisableAfter (24 h); negative: never.
	DisableAfter time.Duration
	// DisableMinFailures is the failed attempts DisableAfter needs (so an
	// endpoint tried once a day is not disabled by one failure). Default
	// DefaultDisableMinFailures (10).
	DisableMinFailures int
	// OpsWebhookURL receives an "endpoint.disabled" operational webhook
	// when a subscription is disabled automatically. Default "": none.
	OpsWebhookURL string
	// OpsWebhookSecret signs it (Standard Webhooks, whsec_...). Required
	// with OpsWebhookURL.
	OpsWebhookSecret string
}

// DisabledRecord is the value of a disabled subscription's key in the
// health bucket, and the body of the ops.endpoint.disabled event and of the
// operational webhook's data.
type DisabledRecord struct {
	Subscription string    `json:"subscription"`
	Endpoint     string    `json:"endpoint,omitempty"`
	Reason       string    `json:"reason"`
	Status       int       `json:"status,omitempty"`
	LastError    string    `json:"last_error,omitempty"`
	At           time.Time `json:"at"`
	Replica      string    `json:"replica,omitempty"`
}

// failStreak is one subscription's failures since its last success.
type failStreak struct {
	since    time.Time
	failures int
}

// health is the disabled state of a Consumer's subscriptions, as this
// replica sees the health bucket. Safe for concurrent use; a nil *health
// has every subscription enabled.
type health struct {
	js      jetstream.JetStream
	cfg     HealthConfig
	clock   clockwork.Clock
	log     *slog.Logger
	replica string
	gauge   *prometheus.GaugeVec
	notify  *notifier
	// breakers get the shared breaker states the watch sees (nil: not
	// shared).
	breakers *breaker.Set

	mu       sync.Mutex
	kv       jetstream.KeyValue
	kvWarned bool
	disabled map[string]DisabledRecord
	streaks  map[string]*failStreak
	// shared are the streaks' starts in the health bucket (streak.go).
	shared *sharedStreaks
	// failing is len(streaks), read without the lock: an ack when no
	// subscription fails (the usual case) takes no lock.
	failing atomic.Int64
	changed chan struct{}
}

// newHealth returns the health of subs' names; the gauge
// jsbridge_consumer_endpoint_disabled{subscription} goes on reg (nil: not
// registered).
func newHealth(js jetstream.JetStream, cfg HealthConfig, clock clockwork.Clock, log *slog.Logger, replica string, reg prometheus.Registerer, notify *notifier, names []string) (*health, error) {
	if cfg.DisableAfter == 0 {
		cfg.DisableAfter = DefaultDisableAfter
	}
	if cfg.DisableMinFailures == 0 {
		cfg.DisableMinFailures = DefaultDisableMinFailures
	}
	g, err := newDisabledGauge(reg)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		g.WithLabelValues(n).Set(0)
	}
	return &health{js: js, cfg: cfg, clock: clock, log: log, replica: replica, gauge: g, notify: notify,
		disabled: map[string]DisabledRecord{}, streaks: map[string]*failStreak{}, shared: newSharedStreaks(), changed: make(chan struct{})}, nil
}

// newDisabledGauge returns jsbridge_consumer_endpoint_disabled
// {subscription}, registered on reg (nil: not registered).
func newDisabledGauge(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "jsbridge_consumer_endpoint_disabled",
		Help: "1 while a subscription is disabled (410 Gone, sustained failure or an operator), else 0, by subscription.",
	}, []string{"subscription"})
	if reg == nil {
		return g, nil
	}
	return promreg.Register(reg, g)
}

// healthBucket opens (creating when missing) the health bucket.
func healthBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	return bucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: wire.DefaultHealthBucket, Description: "jsbridge endpoint health: shared circuit breakers and disabled subscriptions",
		Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
	})
}

// run opens the health bucket and follows its disabled keys until ctx
// ends, reopening the watch after a pause when it breaks. Until the
// bucket answers, the replica goes by its own state.
func (h *health) run(ctx context.Context, replicas int) {
	var pause backoff.Backoff
	for ctx.Err() == nil {
		kv, err := healthBucket(ctx, h.js, replicas)
		if err == nil {
			h.mu.Lock()
			h.kv = kv
			h.mu.Unlock()
			err = h.follow(ctx, kv)
		}
		if ctx.Err() != nil {
			return
		}
		h.degraded(err)
		sleep(ctx, h.clock, pause.Next())
	}
}

// load reads the disabled keys once (so that a disabled subscription
// does not start before the watch caught up); a failure is logged and
// left to run.
func (h *health) load(ctx context.Context, replicas int) {
	kv, err := healthBucket(ctx, h.js, replicas)
	if err != nil {
		h.degraded(err)
		return
	}
	h.mu.Lock()
	h.kv = kv
	h.mu.Unlock()
	recs, err := ReadDisabled(ctx, h.js)
	if err != nil {
		h.degraded(err)
		return
	}
	for _, rec := range recs {
		h.set(rec.Subscription, &rec)
	}
}

// bucket returns the health bucket, nil until it is open.
func (h *health) bucket() jetstream.KeyValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kv
}

// follow applies the disabled keys of kv, and hands the shared breaker
// states to the breakers, until ctx ends or the watch breaks.
func (h *health) follow(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch health bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("health bucket watch ended")
			}
			if e == nil {
				continue // the initial values are in
			}
			if strings.HasPrefix(e.Key(), wire.BreakerKeyPrefix) {
				if st, err := decodeBreakerState(e.Value()); err == nil && e.Operation() == jetstream.KeyValuePut && h.breakers != nil {
					h.breakers.Observe(st, e.Revision())
				}
				continue
			}
			if strings.HasPrefix(e.Key(), wire.StreakKeyPrefix) {
				if name, ended := h.shared.observe(e); ended {
					h.succeeded(name) // a 2xx on some replica
				}
				continue
			}
			if !strings.HasPrefix(e.Key(), wire.DisabledKeyPrefix) {
				continue
			}
			name := strings.TrimPrefix(e.Key(), wire.DisabledKeyPrefix)
			if e.Operation() != jetstream.KeyValuePut {
				h.set(name, nil)
				continue
			}
			var rec DisabledRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				rec = DisabledRecord{Subscription: name, Reason: "unreadable record: " + err.Error()}
			}
			h.set(name, &rec)
		}
	}
}

// degraded logs, once until the bucket answers again, that the health
// bucket cannot be reached.
func (h *health) degraded(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.kvWarned {
		return
	}
	h.kvWarned = true
	h.log.Warn("endpoint health bucket not available: going by this replica's own disabled state until it is", slog.String("bucket", wire.DefaultHealthBucket), slog.Any("error", err))
}

// set records name disabled (rec) or enabled (nil) and wakes the waiters.
func (h *health) set(name string, rec *DisabledRecord) {
	h.mu.Lock()
	_, was := h.disabled[name]
	if rec == nil {
		delete(h.disabled, name)
		h.endStreak(name)
	} else {
		h.disabled[name] = *rec
	}
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
	switch {
	case rec == nil && was:
		h.gauge.WithLabelValues(name).Set(0)
		h.log.Info("subscription enabled: delivering again from where it stopped", slog.String("subscription", name))
	case rec != nil && !was:
		h.gauge.WithLabelValues(name).Set(1)
		h.log.Warn("subscription disabled: nothing is sent to its endpoint until `consumer subscriptions enable`; its position is kept",
			slog.String("subscription", name), slog.String("reason", rec.Reason), slog.String("last_error", rec.LastError))
	}
}

// isDisabled reports whether name is disabled.
func (h *health) isDisabled(name string) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.disabled[name]
	return ok
}

// changes returns a channel closed at the next change of any
// subscription's state (nil for a nil h: never).
func (h *health) changes() <-chan struct{} {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// waitEnabled blocks while name is disabled; it returns ctx's error if
// ctx ends first.
func (h *health) waitEnabled(ctx context.Context, name string) error {
	for {
		ch := h.changes()
		if !h.isDisabled(name) {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// succeeded ends name's failure streak.
func (h *health) succeeded(name string) {
	if h == nil || (h.failing.Load() == 0 && !h.shared.any()) {
		return
	}
	h.mu.Lock()
	h.endStreak(name)
	h.mu.Unlock()
}

// endStreak deletes name's streak, here and in the bucket (h.mu held).
func (h *health) endStreak(name string) {
	h.shared.end(h.kv, name)
	if _, ok := h.streaks[name]; ok {
		delete(h.streaks, name)
		h.failing.Add(-1)
	}
}

// failed counts a failed attempt of name and reports whether the streak
// now calls for disabling it (DisableAfter, DisableMinFailures).
func (h *health) failed(name string) bool {
	if h == nil || h.cfg.DisableAfter < 0 {
		return false
	}
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.streaks[name]
	if s == nil {
		s = &failStreak{since: now}
		h.streaks[name] = s
		h.failing.Add(1)
	}
	s.failures++
	if s.failures < h.cfg.DisableMinFailures {
		return false
	}
	h.shared.record(h.kv, name, s.since)
	return now.Sub(h.shared.earliest(name, s.since)) >= h.cfg.DisableAfter
}

// disable disables rec.Subscription: at once on this replica, then in the
// health bucket. Only the replica whose Create wins notifies (the
// ops.endpoint.disabled event and the operational webhook), so one
// disable is announced once.
func (h *health) disable(ctx context.Context, rec DisabledRecord) {
	if h == nil || h.isDisabled(rec.Subscription) {
		return
	}
	rec.At = h.clock.Now().UTC()
	rec.Replica = h.replica
	h.set(rec.Subscription, &rec)
	h.mu.Lock()
	kv := h.kv
	h.mu.Unlock()
	announce := true
	if kv != nil {
		data, _ := json.Marshal(rec)
		ctx, cancel := context.WithTimeout(ctx, healthWriteTimeout)
		_, err := kv.Create(ctx, wire.DisabledKey(rec.Subscription), data)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyExists):
			announce = false // another replica disabled it first and announced it
		case err != nil:
			h.degraded(err)
		}
	}
	if announce {
		h.notify.disabled(rec)
	}
}
