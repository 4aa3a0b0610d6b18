package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/otelenv"
)

// observers are what run hands the consumer besides its subscriptions:
// the tracer provider of the OTEL_* environment and the attempts record.
type observers struct {
	tracerProvider trace.TracerProvider
	// attempts configures the attempts record; nil without one.
	attempts *consumer.AttemptsConfig
}

// attemptsFlags bound the attempts record run keeps.
type attemptsFlags struct {
	AttemptsMaxAge   time.Duration `name:"attempts-max-age" env:"JSBRIDGE_ATTEMPTS_MAX_AGE" default:"72h" help:"How long attempt records are kept in the attempts stream when run creates it; 0 keeps no records (trace then shows only the message and dead letters) (default: ${default})."`
	AttemptsMaxBytes int64         `name:"attempts-max-bytes" env:"JSBRIDGE_ATTEMPTS_MAX_BYTES" default:"1073741824" help:"Size bound of the attempts stream in bytes when run creates it; the oldest records go first (default: ${default}, 1 GiB)."`
	AttemptsRecord   string        `name:"attempts-record" env:"JSBRIDGE_ATTEMPTS_RECORD" default:"failures" help:"Which attempts are recorded: failures (every failed attempt, and the success that ends a series with a failure in it; a success on the first attempt is only counted in jsbridge_consumer_deliveries_total, and trace reads its delivery from the positions bucket) or all (every attempt, one record per webhook, about as big as the event on the events stream) (default: ${default})."`
}

// observe sets up tracing from the OTEL_* environment (off unless it asks
// for OTLP) and returns the stop that flushes the spans still batched.
func (r *runCmd) observe(ctx context.Context, log *slog.Logger) (func(), error) {
	tp, stop, err := otelenv.Start(ctx, "jsbridge-consumer", log)
	if err != nil {
		return nil, err
	}
	r.obs.tracerProvider = tp
	return stop, nil
}

// attemptsConfig maps the attempts flags to the consumer's attempts
// record: nil (no records) when --attempts-max-age is 0.
func (r *runCmd) attemptsConfig(g *Globals, log *slog.Logger) (*consumer.AttemptsConfig, error) {
	if r.AttemptsMaxAge < 0 || r.AttemptsMaxBytes < 0 {
		return nil, fmt.Errorf("--attempts-max-age %s, --attempts-max-bytes %d: want 0 or more", r.AttemptsMaxAge, r.AttemptsMaxBytes)
	}
	record, err := attemptsRecord(r.AttemptsRecord)
	if err != nil {
		return nil, err
	}
	if r.AttemptsMaxAge == 0 {
		log.Info("attempt records off (--attempts-max-age 0)")
		return nil, nil
	}
	return &consumer.AttemptsConfig{
		Stream: g.AttemptsStream, MaxAge: r.AttemptsMaxAge, MaxBytes: r.AttemptsMaxBytes,
		Replica: r.ReplicaID, // --replica-id names the records too; empty: the consumer's replica id
		Record:  record,
	}, nil
}

// attemptsRecord parses --attempts-record (JSBRIDGE_ATTEMPTS_RECORD):
// failures or all; anything else is an error naming the flag and the
// value.
func attemptsRecord(v string) (consumer.AttemptsRecord, error) {
	switch rec := consumer.AttemptsRecord(v); rec {
	case consumer.AttemptsRecordFailures, consumer.AttemptsRecordAll:
		return rec, nil
	}
	return "", fmt.Errorf("--attempts-record (JSBRIDGE_ATTEMPTS_RECORD) %q: want %s or %s", v, consumer.AttemptsRecordFailures, consumer.AttemptsRecordAll)
}

type traceCmd struct {
	EventID      string        `arg:"" name:"EVENT_ID" help:"Event id (the Nats-Msg-Id, ce-id and Idempotency-Key)."`
	SourceStream string        `name:"source-stream" help:"The event's stream (e.g. order-42): when no attempt record says where the event is, its subjects on the events stream are scanned for it."`
	JSON         bool          `name:"json" help:"One JSON object instead of text."`
	Timeout      time.Duration `name:"timeout" default:"30s" help:"Give up reading JetStream after this long (default: ${default})."`

	out io.Writer // default os.Stdout; tests capture it
}

func (c *traceCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	tr, err := consumer.TraceEvent(ctx, js, c.EventID, consumer.TraceConfig{
		Stream: g.Stream, DLQStream: g.DLQStream, AttemptsStream: g.AttemptsStream, SourceStream: c.SourceStream,
	})
	if err != nil {
		return err
	}
	out := c.out
	if out == nil {
		out = os.Stdout
	}
	return printTrace(out, tr, c.JSON, c.SourceStream != "")
}

// printTrace writes tr as text (the message, one block of attempts per
// subscription, the dead letters, where the event stands for each
// subscription) or as one JSON object. scanned says --source-stream was
// given.
//
// An event without attempt records is not an event never delivered:
// under --attempts-record failures (the default) a success on the first
// attempt is not recorded. Trace says so, and when it found the event on
// the events stream it prints what the positions bucket says
// (consumer.EventTrace.Deliveries); a settled event with neither an
// attempt record nor a dead letter of that subscription was answered 2xx
// on its first attempt.
func printTrace(w io.Writer, tr consumer.EventTrace, asJSON, scanned bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(tr)
	}
	if m := tr.Message; m != nil {
		fmt.Fprintf(w, "event %s: %s v%d %s, JetStream sequence %d on %s, published %s\n", tr.EventID, m.SourceStream, m.Version, m.Name,
			m.Sequence, m.Subject, m.PublishedAt.Format(time.RFC3339Nano))
		if m.TraceParent != "" {
			fmt.Fprintf(w, "traceparent %s\n", m.TraceParent)
		}
	} else {
		fmt.Fprintf(w, "event %s: not found on the events stream (give --source-stream to scan its stream)\n", tr.EventID)
	}
	if len(tr.Attempts) == 0 {
		switch {
		case tr.Message != nil:
			fmt.Fprintln(w, "no attempt records: under --attempts-record failures (the default) a success on the first attempt leaves none;"+
				" where each subscription stands is below (`consumer run --attempts-record all` records every attempt)")
		case !scanned:
			fmt.Fprintln(w, "no attempt records: under --attempts-record failures (the default) a success on the first attempt leaves none,"+
				" so this does not mean it was never delivered: give --source-stream STREAM to find it and read whether each subscription settled it"+
				" (`consumer run --attempts-record all` records every attempt)")
		default:
			fmt.Fprintln(w, "no attempt records (none made yet, older than the attempts stream's max age, or records off)")
		}
	}
	if tr.Message == nil && len(tr.Attempts) == 0 && len(tr.DeadLetters) == 0 { // no sign the consumer ever had it
		if !scanned {
			fmt.Fprint(w, "if --source-stream does not find it either, ")
		}
		fmt.Fprintln(w, "next: `bridge streams --blocked` shows whether the bridge holds it back (a blocked stream: fix the cause, then `bridge unblock STREAM`);"+
			" if the bridge forwarded it, `bridge verify` tells an event the events stream lost (missing; `bridge verify --repair` re-publishes it) from one its limits aged out (see docs/recovery.md)")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	sub := ""
	for _, a := range tr.Attempts {
		if a.Subscription != sub {
			sub = a.Subscription
			fmt.Fprintf(tw, "\nsubscription %s\n", sub)
			fmt.Fprintln(tw, "ATTEMPT\tTIME\tREPLICA\tSTATUS\tLATENCY\tOUTCOME\tBREAKER\tERROR")
		}
		status := fmt.Sprint(a.Status)
		if a.Status == 0 {
			status = a.StatusClass
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, a.At.Format(time.RFC3339Nano), a.Replica, status,
			a.Latency.Round(time.Microsecond), a.Outcome, a.Breaker, a.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, d := range tr.DeadLetters {
		fmt.Fprintf(w, "\ndead letter %d (subscription %s): %d attempts, status %d, %s, dead-lettered %s\n", d.Seq, d.Subscription, d.Attempts, d.Status, d.Reason,
			d.DeadLetteredAt.UTC().Format(time.RFC3339))
		fmt.Fprint(w, deadLetterNext(d.Seq))
	}
	return printDeliveries(w, tr)
}

// printDeliveries writes where the event stands for each subscription,
// from the positions bucket, when trace found its message.
func printDeliveries(w io.Writer, tr consumer.EventTrace) error {
	if tr.Message == nil {
		return nil
	}
	if len(tr.Deliveries) == 0 {
		fmt.Fprintln(w, "\nno partition record in the positions bucket names a subscription for this event's partition")
		return nil
	}
	recorded, letters := map[string]bool{}, map[string]bool{}
	for _, a := range tr.Attempts {
		recorded[a.Subscription] = true
	}
	for _, d := range tr.DeadLetters {
		letters[d.Subscription] = true
	}
	fmt.Fprintln(w, "\nwhere each subscription stands, from the positions bucket (which holds no filters: a subscription that does not take the event shows settled)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tKEY\tSEQUENCE\tSTATE\tWHY")
	for _, d := range tr.Deliveries {
		why := d.Why
		if d.State == consumer.DeliverySettled && !recorded[d.Subscription] && !letters[d.Subscription] {
			why += "; no attempt record and no dead letter: answered 2xx on its first attempt (not recorded under --attempts-record failures), or not one its filters take"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", d.Subscription, d.Key, d.Sequence, d.State, why)
	}
	return tw.Flush()
}

// deadLetterNext is what trace says to do about the dead letter seq: the
// commands out of it (docs/recovery.md tells when to use which).
func deadLetterNext(seq uint64) string {
	return fmt.Sprintf("next: once the endpoint takes it, `consumer dlq replay --seq %d` with the subscription's flags (-c FILE or --subscriptions-from kv)"+
		" POSTs it again; delivered, it leaves the DLQ and a stream it parked (ordered subscriptions) goes on."+
		" To give it up instead: `consumer dlq skip --seq %d` (its parked stream goes on without it). See docs/recovery.md\n", seq, seq)
}
