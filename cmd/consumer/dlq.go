package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// dlqCmd groups the dead-letter operations.
type dlqCmd struct {
	List   dlqListCmd   `cmd:"" help:"List dead letters, oldest first: seq, subscription, event id, attempts, status, reason, times."`
	Replay dlqReplayCmd `cmd:"" help:"POST dead letters again to their subscription's endpoint (same Idempotency-Key, current secrets; for an ordered subscription the predecessor its last attempt named, Jsbridge-Previous-Version, and no partition or epoch); each one delivered (2xx) is removed from the DLQ."`
	Skip   dlqSkipCmd   `cmd:"" help:"Drop the dead-lettered head of a parked stream (ordered subscriptions): its dead letter is deleted and the events held behind it are delivered, in order, the first naming the head's own predecessor (Jsbridge-Previous-Version)."`
	Purge  dlqPurgeCmd  `cmd:"" help:"Delete dead letters for good (of one subscription, or all); needs --yes."`
}

type dlqListCmd struct {
	Subscription string `name:"subscription" short:"s" help:"Only this subscription's dead letters."`
	JSON         bool   `name:"json" help:"One JSON object per line instead of a table."`
}

func (c *dlqListCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	q := consumer.OpenDeadLetters(js, g.DLQStream)
	letters, err := q.List(ctx, c.Subscription)
	if err != nil {
		return err
	}
	parked, err := q.Parked(ctx, c.Subscription)
	if err != nil {
		return err
	}
	if c.JSON {
		return printLettersJSON(os.Stdout, letters, parked)
	}
	if err := printLetters(os.Stdout, letters, false); err != nil {
		return err
	}
	return printParked(os.Stdout, parked, letters)
}

// printLettersJSON prints one JSON object per dead letter; the head of a
// parked stream carries "parked" (the stream parked behind it).
func printLettersJSON(w io.Writer, letters []consumer.DeadLetter, parked []consumer.ParkedStream) error {
	byHead := map[string]*consumer.ParkedStream{}
	for i, p := range parked {
		byHead[p.Subscription+"\x00"+p.HeadEventID] = &parked[i]
	}
	enc := json.NewEncoder(w)
	for _, d := range letters {
		if err := enc.Encode(struct {
			consumer.DeadLetter
			Parked *consumer.ParkedStream `json:"parked,omitempty"`
		}{d, byHead[d.Subscription+"\x00"+d.EventID]}); err != nil {
			return err
		}
	}
	return nil
}

// printParked lists the parked streams of ordered subscriptions: the head's
// dead letter (its seq, for dlq replay or dlq skip) and since when it is
// parked (its later events wait in the events stream).
func printParked(w io.Writer, parked []consumer.ParkedStream, letters []consumer.DeadLetter) error {
	if len(parked) == 0 {
		return nil
	}
	seqOf := map[string]uint64{}
	for _, d := range letters {
		seqOf[d.Subscription+"\x00"+d.EventID] = d.Seq
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARKED STREAM\tSUBSCRIPTION\tHEAD SEQ\tHEAD EVENT ID\tPARKED SINCE")
	for _, p := range parked {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", p.Stream, p.Subscription, seqOf[p.Subscription+"\x00"+p.HeadEventID], p.HeadEventID,
			p.ParkedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

type dlqSkipCmd struct {
	Seq []uint64 `name:"seq" required:"" help:"Dead-letter sequence number(s) of parked heads (see dlq list); repeatable or comma-separated."`
}

func (c *dlqSkipCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	q := consumer.OpenDeadLetters(js, g.DLQStream)
	for _, seq := range c.Seq {
		d, err := q.Get(ctx, seq)
		if err != nil {
			return fmt.Errorf("dlq skip --seq %d: %w", seq, err)
		}
		if err := q.Skip(ctx, d); err != nil {
			return fmt.Errorf("dlq skip --seq %d: %w", seq, err)
		}
		fmt.Printf("skipped seq %d (subscription %s, event %s): its stream goes on with the events held behind it\n", d.Seq, d.Subscription, d.EventID)
	}
	return nil
}

func printLetters(w io.Writer, letters []consumer.DeadLetter, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, d := range letters {
			if err := enc.Encode(d); err != nil {
				return err
			}
		}
		return nil
	}
	if len(letters) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSUBSCRIPTION\tEVENT ID\tSUBJECT\tATTEMPTS\tSTATUS\tDEAD-LETTERED\tREASON")
	for _, d := range letters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.Seq, d.Subscription, d.EventID, d.Subject, d.Attempts, d.Status,
			d.DeadLetteredAt.UTC().Format(time.RFC3339), d.Reason)
	}
	return tw.Flush()
}

type dlqReplayCmd struct {
	subscriptionFlags `embed:""`
	kvFlags           `embed:""` // run_kv.go
	engineFlag        `embed:""`

	Subscription string   `name:"subscription" short:"s" help:"Only this subscription's dead letters."`
	Seq          []uint64 `name:"seq" help:"Dead-letter sequence number(s) to replay (see dlq list); repeatable or comma-separated."`
	All          bool     `name:"all" help:"Replay every dead letter (of --subscription when given)."`
}

func (c *dlqReplayCmd) Run(ctx context.Context, g *Globals) error {
	if c.All == (len(c.Seq) > 0) {
		return errors.New("dlq replay: give either --seq N... or --all")
	}
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return err
	}
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	cfg, err := c.staticConfig(ctx, g, js, log, func() (consumer.Config, error) { return c.config(g, log, nil, 0, 0) })
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
	q := cons.DeadLetters()
	var letters []consumer.DeadLetter
	if c.All {
		if letters, err = q.List(ctx, c.Subscription); err != nil {
			return err
		}
	} else {
		for _, seq := range c.Seq {
			d, err := q.Get(ctx, seq)
			if err != nil {
				return fmt.Errorf("dlq replay --seq %d: %w", seq, err)
			}
			if c.Subscription != "" && d.Subscription != c.Subscription {
				return fmt.Errorf("dlq replay --seq %d: dead letter of subscription %q, not --subscription %q", seq, d.Subscription, c.Subscription)
			}
			letters = append(letters, d)
		}
	}
	failed := 0
	for _, res := range cons.Replay(ctx, letters) {
		d := res.Letter
		if res.Delivered {
			fmt.Printf("replayed seq %d (subscription %s, event %s): HTTP %d, removed from the DLQ\n", d.Seq, d.Subscription, d.EventID, res.Status)
			continue
		}
		failed++
		fmt.Printf("not replayed seq %d (subscription %s, event %s): %v\n", d.Seq, d.Subscription, d.EventID, res.Err)
	}
	fmt.Printf("dlq replay: %d replayed, %d failed\n", len(letters)-failed, failed)
	if failed > 0 {
		log.Warn("some dead letters were not replayed; they stay in the DLQ", slog.Int("failed", failed))
		return fmt.Errorf("dlq replay: %d of %d dead letters not replayed", failed, len(letters))
	}
	return nil
}

type dlqPurgeCmd struct {
	Subscription string `name:"subscription" short:"s" help:"Only this subscription's dead letters (default: every subscription's)."`
	Yes          bool   `name:"yes" help:"Really delete them; without it, only say how many would go."`
}

func (c *dlqPurgeCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	q := consumer.OpenDeadLetters(js, g.DLQStream)
	which := "every subscription"
	if c.Subscription != "" {
		which = "subscription " + c.Subscription
	}
	if !c.Yes {
		n, err := q.Count(ctx, c.Subscription)
		if err != nil {
			return err
		}
		return fmt.Errorf("dlq purge: would delete %d dead letters of %s from stream %s for good (they cannot be replayed afterwards); run again with --yes", n, which, q.Stream())
	}
	n, err := q.Purge(ctx, c.Subscription)
	if err != nil {
		return err
	}
	fmt.Printf("dlq purge: deleted %d dead letters of %s from stream %s\n", n, which, q.Stream())
	return nil
}
