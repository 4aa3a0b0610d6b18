package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// replayCmd re-delivers a time window of the events stream to one
// subscription's endpoint (consumer.Consumer.ReplayWindow).
type replayCmd struct {
	subscriptionFlags `embed:""`
	kvFlags           `embed:""` // run_kv.go; replay_kv.go
	engineFlag        `embed:""`

	Subscription string `name:"subscription" short:"s" help:"The subscription to replay to (its endpoint, secrets, filter subjects); may be left out when --config (or the bucket, with --subscriptions-from kv) holds one subscription, or without either (the flags' --name)."`
	Since        string `name:"since" required:"" placeholder:"TIME" help:"Window start: an RFC 3339 time (2026-11-25T10:00:00Z) or a duration ago (90m); events JetStream stored at or after it."`
	Until        string `name:"until" placeholder:"TIME" help:"Window end, exclusive, as --since (default: the events stream's last message when the replay begins)."`
	SourceStream string `name:"source-stream" placeholder:"NAME" xor:"narrow" help:"Only this source stream's events (the event-store stream, e.g. order-42)."`
	Match        string `name:"match" placeholder:"REGEX" xor:"narrow" help:"Only the events of source streams whose name matches this regular expression (Go syntax, e.g. '^order-4[0-9]$')."`
	DryRun       bool   `name:"dry-run" help:"Count the events that would be sent; send nothing."`
	JSON         bool   `name:"json" help:"Print the result as one JSON object instead of text."`

	// out and progress receive the result and the progress lines
	// (default stdout and stderr); tests set them.
	out, progress io.Writer
}

// replayProgressEvery is how often a running replay prints how far it got.
const replayProgressEvery = 2 * time.Second

func (c *replayCmd) Run(ctx context.Context, g *Globals) error {
	now := time.Now()
	w, err := c.window(now)
	if err != nil {
		return err
	}
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return err
	}
	var cfg consumer.Config
	if c.SubscriptionsFrom != "kv" {
		// Flags and file are checked before connecting.
		if cfg, err = c.config(g, log, nil, 0, 0); err != nil {
			return err
		}
	}
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	if c.SubscriptionsFrom == "kv" {
		if cfg, err = c.kvConfig(ctx, g, js, log); err != nil {
			return err
		}
	}
	sub, err := c.subscription(cfg.Subscriptions)
	if err != nil {
		return err
	}
	if err := c.check(log); err != nil {
		return err
	}
	cons, err := consumer.New(js, cfg)
	if err != nil {
		return withFlagHints(err)
	}
	out, progress := cmpWriter(c.out, os.Stdout), cmpWriter(c.progress, os.Stderr)
	verb := "delivered"
	if w.DryRun {
		verb = "would send"
	}
	last := now
	w.Progress = func(r consumer.WindowResult) {
		if time.Since(last) < replayProgressEvery {
			return
		}
		last = time.Now()
		fmt.Fprintf(progress, "replay: %d %s so far; at event %s (seq %d, %s)\n", max(r.Delivered, r.Matched), verb, r.Last.EventID, r.Last.Seq,
			r.Last.Time.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(progress, "replay: subscription %s, JetStream stream %s %s\n", sub, cfg.Stream, windowText(w))
	res, err := cons.ReplayWindow(ctx, sub, w)
	switch {
	case err != nil && ctx.Err() != nil && res.Delivered > 0:
		// Interrupted (SIGINT, SIGTERM): from the last event delivered, which
		// the receiver drops by its Idempotency-Key.
		return fmt.Errorf("replay interrupted after %d delivered (the last: event %s, seq %d); resume with --since %s",
			res.Delivered, res.Last.EventID, res.Last.Seq, res.Last.Time.UTC().Format(time.RFC3339Nano))
	case err != nil:
		return fmt.Errorf("replay: %w (%d delivered before)", err, res.Delivered)
	}
	if c.JSON {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return err
		}
	} else {
		printReplay(out, res, w)
	}
	if f := res.Failed; f != nil {
		return fmt.Errorf("replay stopped at event %s (seq %d): %s; resume with --since %s", f.EventID, f.Seq, f.Reason, f.Time.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// window is the replay window of the flags, durations ago counted from
// now.
func (c *replayCmd) window(now time.Time) (consumer.Window, error) {
	var w consumer.Window
	var err error
	if w.Since, err = parseWhen(c.Since, now); err != nil {
		return w, fmt.Errorf("--since %q: %w", c.Since, err)
	}
	if c.Until != "" {
		if w.Until, err = parseWhen(c.Until, now); err != nil {
			return w, fmt.Errorf("--until %q: %w", c.Until, err)
		}
		if !w.Until.After(w.Since) {
			return w, fmt.Errorf("--until %s is not after --since %s", w.Until.Format(time.RFC3339Nano), w.Since.Format(time.RFC3339Nano))
		}
	}
	if c.Match != "" {
		if w.Match, err = regexp.Compile(c.Match); err != nil {
			return w, fmt.Errorf("--match %q: %w", c.Match, err)
		}
	}
	w.Stream, w.DryRun = c.SourceStream, c.DryRun
	return w, nil
}

// subscription is the name of the subscription to replay to: --subscription,
// which subs must hold, or the only one of subs.
func (c *replayCmd) subscription(subs []consumer.Subscription) (string, error) {
	var names []string
	for _, s := range subs {
		if c.Subscription == s.Name {
			return s.Name, nil
		}
		names = append(names, s.Name)
	}
	switch {
	case c.Subscription != "":
		return "", fmt.Errorf("--subscription %q: no such subscription (there are: %q)", c.Subscription, names)
	case len(subs) != 1:
		return "", fmt.Errorf("--subscription is required: %d subscriptions are configured (%q)", len(subs), names)
	}
	return subs[0].Name, nil
}

// cmpWriter is w, or def when w is nil.
func cmpWriter(w, def io.Writer) io.Writer {
	if w == nil {
		return def
	}
	return w
}

// parseWhen reads an RFC 3339 time, or a duration ago from now ("90m").
func parseWhen(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return time.Time{}, errors.New("want an RFC 3339 time (2026-11-25T10:00:00Z) or a duration ago (90m)")
	case d <= 0:
		return time.Time{}, errors.New("a duration ago must be positive")
	}
	return now.Add(-d), nil
}

// printReplay prints the outcome of a replay (a count, for a dry run).
func printReplay(out io.Writer, r consumer.WindowResult, w consumer.Window) {
	window := windowText(w)
	switch {
	case w.DryRun:
		fmt.Fprintf(out, "replay --dry-run: %d events of subscription %s %s would be sent; nothing sent\n", r.Matched, r.Subscription, window)
	case r.Failed != nil:
		f := r.Failed
		fmt.Fprintf(out, "replay: %d events of subscription %s %s delivered, then event %s (seq %d, stream %s, %s) failed: %s\n",
			r.Delivered, r.Subscription, window, f.EventID, f.Seq, f.Stream, f.Time.UTC().Format(time.RFC3339Nano), f.Reason)
	default:
		fmt.Fprintf(out, "replay: %d events of subscription %s %s delivered\n", r.Delivered, r.Subscription, window)
	}
}

// windowText says w's bounds: "from <since> to <until>".
func windowText(w consumer.Window) string {
	until := "the stream's last message"
	if !w.Until.IsZero() {
		until = w.Until.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("from %s to %s", w.Since.UTC().Format(time.RFC3339Nano), until)
}
