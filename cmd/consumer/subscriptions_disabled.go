package main

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
)

// disabledState is a disabled subscription as list and get show it: why
// (gone, failing, operator) and since when, from its key
// disabled.<subscription> in the endpoint health bucket.
type disabledState struct {
	Reason    string    `json:"reason"`
	Since     time.Time `json:"since"`
	Status    int       `json:"status,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	Replica   string    `json:"replica,omitempty"`
}

// readDisabled returns the disabled subscriptions' states by name (none
// when the health bucket does not exist yet).
func readDisabled(ctx context.Context, js jetstream.JetStream) (map[string]*disabledState, error) {
	recs, err := consumer.ReadDisabled(ctx, js)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*disabledState, len(recs))
	for _, r := range recs {
		out[r.Subscription] = &disabledState{Reason: r.Reason, Since: r.At.UTC(), Status: r.Status, LastError: r.LastError, Replica: r.Replica}
	}
	return out, nil
}

// column is d in list's DISABLED column: "-" when enabled (d nil), else
// "<reason> since <RFC 3339 time>".
func (d *disabledState) column() string {
	if d == nil {
		return "-"
	}
	return d.Reason + " since " + d.Since.Format(time.RFC3339)
}

// lastErrorText is ", last error: <e>", or "" without one.
func lastErrorText(e string) string {
	if e == "" {
		return ""
	}
	return ", last error: " + e
}
