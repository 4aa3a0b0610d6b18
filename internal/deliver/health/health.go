// Package health is the consumer engine's room for the health of its
// subscriptions: failure streaks, automatic and operator disabling, the
// operational notifications of a disable, and the store of the shared
// circuit breaker states, all kept in the health bucket
// (wire.DefaultHealthBucket) that every replica watches. It imports
// nothing of the engine above it: the engine hands it a Config and the
// dependencies in Deps.
package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/internal/promreg"
	"github.com/jsbridge/jsbridge/wire"
)

// Disabling: a subscription whose endpoint answered 410 Gone, or failed
// without a success for Config.DisableAfter across at least
// DisableMinFailures attempts, is disabled: every replica stops delivering
// to it, its position is kept, and the events in hand
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
	// ReasonFailing: no success for Config.DisableAfter.
	ReasonFailing = "failing"
	// ReasonOperator: disabled by `consumer subscriptions disable`.
	ReasonOperator = "operator"
)

// healthWriteTimeout bounds a delivery's write of a disabled key: past
// it the subscription stays disabled on this replica only (degraded).
const healthWriteTimeout = 5 * time.Second

// Defaults of Config.
const (
	// DefaultDisableAfter is Config.DisableAfter's default.
	DefaultDisableAfter = 24 * time.Hour
	// DefaultDisableMinFailures is Config.DisableMinFailures' default.
	DefaultDisableMinFailures = 10
)

// Config configures automatic disabling and its notification.
type Config struct {
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
	// Subscription is the disabled subscription's name.
	Subscription string `json:"subscription"`
	// Endpoint is its endpoint (breaker.Endpoint: scheme, host and port),
	// when a delivery disabled it.
	Endpoint string `json:"endpoint,omitempty"`
	// Reason is ReasonGone, ReasonFailing, ReasonOperator or the
	// operator's own words.
	Reason string `json:"reason"`
	// Status is the HTTP status of the answer that disabled it (0: none).
	Status int `json:"status,omitempty"`
	// LastError is that answer or the failure, in words.
	LastError string `json:"last_error,omitempty"`
	// At is when it was disabled (UTC).
	At time.Time `json:"at"`
	// Replica is the id of the consumer replica that disabled it.
	Replica string `json:"replica,omitempty"`
}

// failStreak is one subscription's failures since its last success.
type failStreak struct {
	since    time.Time
	failures int
}

// Breakers is what a State needs of the circuit breakers whose states it
// shares through the health bucket: *breaker.Set implements it.
type Breakers interface {
	// Observe hands a shared state read from the bucket at revision rev
	// to the endpoint's breaker.
	Observe(st breaker.SharedState, rev uint64)
}

// Deps are what a State needs from the engine that owns it.
type Deps struct {
	// JetStream holds the health bucket and the ops stream. Required.
	JetStream jetstream.JetStream
	// Archetype is the engine's clock (the failure streaks, the
	// records, the pauses), logger (disables, enables, a health bucket
	// out of reach) and replica id (written in the records it makes).
	// Default base.Default.
	*base.Archetype
	// Replicas is the health bucket's and the ops stream's replica count
	// when they are created (0: the server's default, 1).
	Replicas int
	// Registerer takes the gauge jsbridge_consumer_endpoint_disabled
	// (nil: not registered).
	Registerer prometheus.Registerer
	// HTTPClient sends the operational webhook. Default:
	// http.DefaultClient.
	HTTPClient *http.Client
	// Breakers get the shared breaker states the watch sees (nil: the
	// breakers are not shared).
	Breakers Breakers
}

// State is the disabled state of a consumer's subscriptions, as this
// replica sees the health bucket, with their failure streaks. Safe for
// concurrent use; a nil *State has every subscription enabled.
type State struct {
	lifecycle.Base

	js       jetstream.JetStream
	cfg      Config
	arch     *base.Archetype // the clock, the logger, the replica id
	replicas int
	gauge    *prometheus.GaugeVec
	notify   *notifier
	// breakers get the shared breaker states the watch sees (nil: not
	// shared).
	breakers Breakers

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

// New returns the health of the subscriptions names (their disabled
// gauges set to 0), with cfg's zero fields at their defaults. It fails
// when cfg.OpsWebhookURL is set without a valid OpsWebhookSecret, or the
// gauge cannot be registered. Nothing is read before Load or Start.
func New(cfg Config, d Deps, names []string) (*State, error) {
	cfg.DisableAfter = cmp.Or(cfg.DisableAfter, DefaultDisableAfter)
	cfg.DisableMinFailures = cmp.Or(cfg.DisableMinFailures, DefaultDisableMinFailures)
	d.Archetype = base.Default(d.Archetype)
	d.HTTPClient = cmp.Or(d.HTTPClient, http.DefaultClient)
	n, err := newNotifier(d.Archetype, d.JetStream, cfg, d.Replicas, d.HTTPClient)
	if err != nil {
		return nil, err
	}
	g, err := disabledGauge(d.Registerer)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		g.WithLabelValues(n).Set(0)
	}
	return &State{js: d.JetStream, cfg: cfg, arch: d.Archetype, replicas: d.Replicas, gauge: g, notify: n, breakers: d.Breakers,
		disabled: map[string]DisabledRecord{}, streaks: map[string]*failStreak{}, shared: newSharedStreaks(), changed: make(chan struct{})}, nil
}

// disabledGauge returns the gauge jsbridge_consumer_endpoint_disabled
// {subscription} (1 while disabled, else 0), registered on reg (nil: not
// registered; one registered before on reg is returned instead).
func disabledGauge(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
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
	cfg := jetstream.KeyValueConfig{
		Bucket: wire.DefaultHealthBucket, Description: "jsbridge endpoint health: shared circuit breakers and disabled subscriptions",
		Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
	}
	kv, err := jsapi.KeyValue(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("deliver: key-value bucket %q: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Start reads the disabled keys once (Load, bounded by ctx), then
// follows the health bucket in the background until Stop
// (lifecycle.Part), reopening the watch after a pause when it breaks.
// Until the bucket answers, the replica goes by its own state. It
// returns nil: a bucket that does not answer is waited for. Stop returns
// once the watch ended and the streak writes and announcements under way
// are done.
func (h *State) Start(ctx context.Context) error {
	return h.Base.Start(ctx, func(ctx context.Context) error { h.Load(ctx); return nil }, func(ctx context.Context) error {
		h.run(ctx)
		h.shared.wait() // the streak writes under way
		h.Wait()        // the announcements under way
		return nil
	})
}

// run opens the health bucket and follows its disabled keys until ctx
// ends.
func (h *State) run(ctx context.Context) {
	var pause backoff.Backoff
	for ctx.Err() == nil {
		kv, err := h.open(ctx)
		if err == nil {
			err = h.follow(ctx, kv)
		}
		if ctx.Err() != nil {
			return
		}
		h.degraded(err)
		t := h.arch.Clock.NewTimer(pause.Next())
		select {
		case <-ctx.Done():
		case <-t.Chan():
		}
		t.Stop()
	}
}

// Load reads the disabled keys once (so that a disabled subscription
// does not start before the watch caught up); a failure is logged and
// left to the watch (Start).
func (h *State) Load(ctx context.Context) {
	kv, err := h.open(ctx)
	var recs []DisabledRecord
	if err == nil {
		recs, err = readDisabled(ctx, kv)
	}
	if err != nil {
		h.degraded(err)
		return
	}
	for _, rec := range recs {
		h.set(rec.Subscription, &rec)
	}
}

// open opens (creating when missing) the health bucket, kept for the
// writes (bucket).
func (h *State) open(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := healthBucket(ctx, h.js, h.replicas)
	if err == nil {
		h.mu.Lock()
		h.kv = kv
		h.mu.Unlock()
	}
	return kv, err
}

// bucket returns the health bucket, nil until it is open.
func (h *State) bucket() jetstream.KeyValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kv
}

// follow applies the disabled keys of kv, and hands the shared breaker
// states to the breakers, until ctx ends or the watch breaks.
func (h *State) follow(ctx context.Context, kv jetstream.KeyValue) error {
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
					h.Succeeded(name) // a 2xx on some replica
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

// degraded logs, once, that the health bucket cannot be reached.
func (h *State) degraded(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.kvWarned {
		return
	}
	h.kvWarned = true
	h.arch.Logger.Warn("endpoint health bucket not available: going by this replica's own disabled state until it is", slog.String("bucket", wire.DefaultHealthBucket), slog.Any("error", err))
}

// set records name disabled (rec) or enabled (nil) and wakes the waiters.
func (h *State) set(name string, rec *DisabledRecord) {
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
		h.arch.Logger.Info("subscription enabled: delivering again from where it stopped", slog.String("subscription", name))
	case rec != nil && !was:
		h.gauge.WithLabelValues(name).Set(1)
		h.arch.Logger.Warn("subscription disabled: nothing is sent to its endpoint until `consumer subscriptions enable`; its position is kept",
			slog.String("subscription", name), slog.String("reason", rec.Reason), slog.String("last_error", rec.LastError))
	}
}

// IsDisabled reports whether name is disabled.
func (h *State) IsDisabled(name string) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.disabled[name]
	return ok
}

// Changes returns a channel closed at the next change of any
// subscription's state (nil for a nil h: never).
func (h *State) Changes() <-chan struct{} {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// WaitEnabled blocks while name is disabled; it returns ctx's error if
// ctx ends first.
func (h *State) WaitEnabled(ctx context.Context, name string) error {
	for {
		ch := h.Changes()
		if !h.IsDisabled(name) {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Succeeded ends name's failure streak.
func (h *State) Succeeded(name string) {
	if h == nil || (h.failing.Load() == 0 && !h.shared.any()) {
		return
	}
	h.mu.Lock()
	h.endStreak(name)
	h.mu.Unlock()
}

// endStreak deletes name's streak, here and in the bucket (h.mu held).
func (h *State) endStreak(name string) {
	h.shared.end(h.kv, name)
	if _, ok := h.streaks[name]; ok {
		delete(h.streaks, name)
		h.failing.Add(-1)
	}
}

// Failed counts a failed attempt of name and reports whether the streak
// now calls for disabling it (DisableAfter, DisableMinFailures).
func (h *State) Failed(name string) bool {
	if h == nil || h.cfg.DisableAfter < 0 {
		return false
	}
	now := h.arch.Clock.Now()
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

// Disable disables rec.Subscription: at once on this replica, then in the
// health bucket. Only the replica whose Create wins notifies (the
// ops.endpoint.disabled event and the operational webhook), so one
// disable is announced once.
func (h *State) Disable(ctx context.Context, rec DisabledRecord) {
	if h == nil || h.IsDisabled(rec.Subscription) {
		return
	}
	rec.At = h.arch.Clock.Now().UTC()
	rec.Replica = h.arch.Replica
	h.set(rec.Subscription, &rec)
	announce := true
	if kv := h.bucket(); kv != nil {
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

// Added sets the disabled gauge of subscription name, one the owner runs
// from now on, to 0 unless name is disabled.
func (h *State) Added(name string) {
	if !h.IsDisabled(name) {
		h.gauge.WithLabelValues(name).Set(0)
	}
}

// Wait waits for the announcements of disables under way (the ops event
// and the operational webhook, sent in the background).
func (h *State) Wait() {
	if h != nil {
		h.notify.wait()
	}
}
