package health

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// notifier announces a disabled subscription: the ops.endpoint.disabled
// event on JetStream (the ops stream, created when missing, holds it) and,
// when configured, the "endpoint.disabled" operational webhook, signed as
// the subscriptions' webhooks are (Standard Webhooks). Both are best
// effort, in the background: a failure is logged, never blocks a delivery.
type notifier struct {
	js       jetstream.JetStream
	replicas int
	arch     *base.Archetype // the clock and the logger
	url      string
	signer   *webhook.Signer // nil without an ops webhook
	client   *http.Client

	wg sync.WaitGroup
}

// opsWebhookTries and opsWebhookPause bound the operational webhook's
// retries.
const (
	opsWebhookTries = 5
	opsWebhookPause = time.Second
)

// newNotifier returns the notifier of cfg; it fails when OpsWebhookURL is
// set without a valid OpsWebhookSecret.
func newNotifier(arch *base.Archetype, js jetstream.JetStream, cfg Config, replicas int, client *http.Client) (*notifier, error) {
	n := &notifier{js: js, replicas: replicas, arch: arch, url: cfg.OpsWebhookURL, client: client}
	if cfg.OpsWebhookURL != "" {
		s, err := webhook.NewSigner(webhook.SchemeStandard, cfg.OpsWebhookSecret)
		if err != nil {
			return nil, fmt.Errorf("HealthConfig.OpsWebhookSecret: %w", err)
		}
		n.signer = s
	}
	return n, nil
}

// OpsWebhook is the body of an operational webhook.
type OpsWebhook struct {
	// Type is wire.OpsWebhookEndpointDisabled.
	Type string `json:"type"`
	// Timestamp is when it was sent.
	Timestamp time.Time `json:"timestamp"`
	// Data is what was disabled and why.
	Data DisabledRecord `json:"data"`
}

// disabled announces rec in the background (wait waits for it).
func (n *notifier) disabled(rec DisabledRecord) {
	if n == nil {
		return
	}
	n.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n.publish(ctx, rec)
		if n.signer != nil {
			n.post(ctx, rec)
		}
	})
}

// wait waits for the announcements under way.
func (n *notifier) wait() {
	if n != nil {
		n.wg.Wait()
	}
}

// publish publishes rec on wire.SubjectEndpointDisabled, creating the ops
// stream first when missing.
func (n *notifier) publish(ctx context.Context, rec DisabledRecord) {
	log := n.arch.Logger.With(slog.String("subscription", rec.Subscription), slog.String("subject", wire.SubjectEndpointDisabled))
	if err := provisionOpsStream(ctx, n.js, n.replicas); err != nil {
		log.Warn("ops stream not available; publishing anyway", slog.Any("error", err))
	}
	data, _ := json.Marshal(rec)
	if _, err := n.js.Publish(ctx, wire.SubjectEndpointDisabled, data); err != nil {
		log.Warn("operational event not published", slog.Any("error", err))
	}
}

// provisionOpsStream creates the ops stream (wire.DefaultOpsStream on
// "ops.>", 30 days) unless it exists. A stream of another name capturing
// the subjects makes it fail with the server's overlap error: the events
// are captured there.
func provisionOpsStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if _, err := js.Stream(ctx, wire.DefaultOpsStream); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: wire.DefaultOpsStream, Description: "jsbridge operational events (ops.endpoint.disabled)",
		Subjects: []string{wire.All(wire.OpsPrefix)}, Storage: jetstream.FileStorage, Replicas: replicas,
		MaxAge: 30 * 24 * time.Hour,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil
	}
	return err
}

// post sends the operational webhook, retrying a few times on failure.
func (n *notifier) post(ctx context.Context, rec DisabledRecord) {
	log := n.arch.Logger.With(slog.String("subscription", rec.Subscription), slog.String("ops_webhook", breaker.Endpoint(n.url)))
	id := "ops-" + rec.Subscription + "-" + strconv.FormatInt(rec.At.UnixNano(), 10)
	body, _ := json.Marshal(OpsWebhook{Type: wire.OpsWebhookEndpointDisabled, Timestamp: n.arch.Clock.Now().UTC(), Data: rec})
	for try := 1; ; try++ {
		err := n.postOnce(ctx, id, body)
		if err == nil {
			log.Info("operational webhook sent", slog.String("type", wire.OpsWebhookEndpointDisabled))
			return
		}
		if try >= opsWebhookTries || ctx.Err() != nil {
			log.Warn("operational webhook not delivered", slog.Int("tries", try), slog.Any("error", err))
			return
		}
		select {
		case <-ctx.Done():
		case <-n.arch.Clock.After(opsWebhookPause * time.Duration(try)):
		}
	}
}

// postOnce POSTs body once; an error unless the answer is 2xx.
func (n *notifier) postOnce(ctx context.Context, id string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderIdempotencyKey, id)
	n.signer.Sign(req.Header, id, n.arch.Clock.Now(), body)
	resp, err := n.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}
