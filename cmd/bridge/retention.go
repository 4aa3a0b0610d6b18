package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/internal/natsconn"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/internal/startup"
)

// retentionCmd shows, and with --yes changes, the retention of the events
// stream that exists: bridge run only sets it when it creates the stream,
// and reports an existing stream's retention without changing it.
type retentionCmd struct {
	MaxAge            string `name:"max-age" help:"New MaxAge of the events stream: a duration (168h), or 0 for none. Not given: kept."`
	MaxBytes          string `name:"max-bytes" help:"New MaxBytes of the events stream (uncompressed bytes), or 0 for none. Not given: kept."`
	MaxMsgsPerSubject string `name:"max-msgs-per-subject" help:"New MaxMsgsPerSubject of the events stream, or 0 for none. Not given: kept."`
	Yes               bool   `name:"yes" help:"Really change it: JetStream removes at once the messages past the new limits (Postgres keeps them; bridge verify counts them as aged out). Without it, only say what would change."`
	NatsURL           string `name:"nats-url" env:"NATS_URL" help:"NATS server URL(s), comma-separated, of a running server (default: the --context's url)."`
	natsconn.Flags    `embed:""`
	JetStreamStream   string        `name:"jetstream-stream" env:"JSBRIDGE_STREAM" default:"${events_stream}" help:"JetStream stream the bridge publishes to (the bridge's --stream) (default: ${default})."`
	DLQStream         string        `name:"dlq-stream" env:"JSBRIDGE_DLQ_STREAM" default:"${dlq_stream}" help:"The consumer's dead-letter stream, reported beside the events stream (default: ${default})."`
	ConnectTimeout    time.Duration `name:"connect-timeout" default:"30s" help:"Give up when NATS does not answer within this time (default: ${default})."`

	out io.Writer // default os.Stdout; tests capture it
}

// wanted returns the retention asked for: have, with the limits given
// replaced, and whether any was given.
func (c *retentionCmd) wanted(have bridge.Retention) (bridge.Retention, bool, error) {
	r, given := have, false
	if c.MaxAge != "" {
		d, err := time.ParseDuration(c.MaxAge)
		if err != nil || d < 0 {
			return r, false, fmt.Errorf("--max-age %q: want a duration of 0 or more (168h; 0 for none)", c.MaxAge)
		}
		r.MaxAge, given = d, true
	}
	for _, f := range []struct {
		flag, val string
		to        *int64
	}{{"--max-bytes", c.MaxBytes, &r.MaxBytes}, {"--max-msgs-per-subject", c.MaxMsgsPerSubject, &r.MaxMsgsPerSubject}} {
		if f.val == "" {
			continue
		}
		n, err := strconv.ParseInt(f.val, 10, 64)
		if err != nil || n < 0 {
			return r, false, fmt.Errorf("%s %q: want a whole number of 0 or more (0 for none)", f.flag, f.val)
		}
		*f.to, given = n, true
	}
	return r, given, nil
}

func (c *retentionCmd) Run(ctx context.Context, g *Globals) error {
	if _, _, err := c.wanted(bridge.Retention{}); err != nil {
		return err
	}
	conn, err := c.Flags.Resolve(c.NatsURL)
	if err != nil {
		return err
	}
	if conn.URL == "" {
		return errors.New("--nats-url (NATS_URL) is empty: give the URL of a running NATS server, or a --context with a url")
	}
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return err
	}
	nc, err := startup.ConnectNATS(ctx, startup.New(log, c.ConnectTimeout), conn.URL, append(startup.NATSOptions(log, "jsbridge-retention"), conn.Options()...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := conn.JetStream(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return c.run(ctx, js)
}

// run is Run once connected.
func (c *retentionCmd) run(ctx context.Context, js jetstream.JetStream) error {
	w := c.out
	if w == nil {
		w = os.Stdout
	}
	have, err := bridge.StreamRetention(ctx, js, c.JetStreamStream)
	if err != nil {
		return err
	}
	want, given, err := c.wanted(have)
	if err != nil {
		return err
	}
	switch {
	case !given || want == have:
		fmt.Fprintf(w, "%s: %s\n", c.JetStreamStream, have)
	case !c.Yes:
		fmt.Fprintf(w, "would change %s: %s -> %s\n", c.JetStreamStream, have, want)
		return errors.New("retention: nothing changed; run again with --yes to change it (JetStream removes at once the messages past the new limits)")
	default:
		old, err := bridge.SetRetention(ctx, js, c.JetStreamStream, want)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "changed %s: %s -> %s\n", c.JetStreamStream, old, want)
		have = want
	}
	// The consumer's streams follow the events stream's retention only
	// when the consumer creates them: say where they stand.
	follows := []struct {
		name, rule string
		want       bridge.Retention
	}{
		{c.DLQStream, "the dead letters: twice MaxAge, no size limit", bridge.Retention{MaxAge: 2 * have.MaxAge}},
	}
	for _, f := range follows {
		r, err := bridge.StreamRetention(ctx, js, f.name)
		if errors.Is(err, bridge.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		note := ""
		if r != f.want {
			note = fmt.Sprintf("; the consumer creates it with %s, it is left as it is: nats stream edit %s --max-age %s", f.want, f.name, ageFlag(f.want.MaxAge))
			if f.want.MaxBytes > 0 {
				note += fmt.Sprintf(" --max-bytes %d", f.want.MaxBytes)
			}
		}
		fmt.Fprintf(w, "%s (%s): %s%s\n", f.name, f.rule, r, note)
	}
	return nil
}

// ageFlag spells a MaxAge for nats stream edit (0: none).
func ageFlag(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}
