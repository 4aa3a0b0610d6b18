package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

type migrateCmd struct {
	DryRun bool `name:"dry-run" help:"Print the SQL of every migration instead of running it."`
}

func (m *migrateCmd) Run(ctx context.Context, g *Globals) error {
	if m.DryRun {
		stmts, err := store.MigrationSQL(g.storeOptions()...)
		if err != nil {
			return err
		}
		for _, s := range stmts {
			s = strings.TrimSpace(s)
			if !strings.HasSuffix(s, ";") {
				s += ";"
			}
			fmt.Println(s)
			fmt.Println()
		}
		return nil
	}
	pool, st, err := openStore(ctx, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := st.MigrateApplied(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if st.External() {
		fmt.Printf("events table %s: layout checked, left unchanged (new events are found by polling)\n", st.EventsTable())
	}
	if len(applied) == 0 {
		fmt.Printf("schema %q is up to date: no migration to apply\n", g.Schema)
		return nil
	}
	fmt.Printf("schema %q: applied %d migrations\n", g.Schema, len(applied))
	for _, m := range applied {
		fmt.Printf("  %s: %s\n", m.Name, strings.Join(m.Objects, ", "))
	}
	return nil
}

// openReadStore is openStore for operator commands that read the events
// table: without --events-table, a schema set up for an external events
// table is read with that table (store.RecordedEventsTable).
func openReadStore(ctx context.Context, g *Globals) (*pgxpool.Pool, *store.Store, error) {
	pool, st, err := openStore(ctx, g)
	if err != nil || st.External() {
		return pool, st, err
	}
	table, err := st.RecordedEventsTable(ctx)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("%w (give --events-table)", err)
	}
	if table == "" {
		return pool, st, nil
	}
	st, err = store.New(pool, g.storeOptions(store.WithEventsTable(table))...)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, st, nil
}

type appendCmd struct {
	Stream          string `arg:"" help:"Stream name, e.g. order-42 (category: the part before the first '-')."`
	Name            string `arg:"" help:"Event name (type), e.g. OrderPlaced."`
	Data            string `arg:"" optional:"" help:"Event data as JSON, e.g. '{\"total\": 42}'; - reads it from stdin. Omit it with --data-file."`
	DataFile        string `name:"data-file" type:"path" help:"Read the event data from this file (- for stdin) instead of the JSON argument: for data too large for a command line."`
	ExpectedVersion int64  `name:"expected-version" default:"-2" help:"Optimistic concurrency: the stream's current last version; -1 means the stream must be empty, -2 (default) skips the check."`
	Correlation     string `name:"correlation" help:"Correlation id stored in the event's meta."`
	Causation       string `name:"causation" help:"Causation id stored in the event's meta."`
}

func (a *appendCmd) Run(ctx context.Context, g *Globals) error {
	data, err := a.data()
	if err != nil {
		return err
	}
	pool, st, err := openStore(ctx, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	evs, err := st.Append(ctx, a.Stream, a.ExpectedVersion, store.NewEvent{
		Name: a.Name, Data: data, Meta: event.Meta{Correlation: a.Correlation, Causation: a.Causation},
	})
	if err != nil {
		return err
	}
	for _, e := range evs {
		fmt.Printf("appended event %d to %s at version %d\n", e.ID, e.Stream, e.Version)
	}
	return nil
}

// data returns the event data: the JSON argument, stdin ("-") or
// --data-file, exactly one of them.
func (a *appendCmd) data() ([]byte, error) {
	switch {
	case a.DataFile != "" && a.Data != "":
		return nil, fmt.Errorf("give the event data once: the JSON argument %q or --data-file %q, not both", abbreviate(a.Data), a.DataFile)
	case a.DataFile == "" && a.Data == "":
		return nil, errors.New("no event data: give it as the JSON argument, - to read stdin, or --data-file FILE")
	case a.Data == "-" || a.DataFile == "-":
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("read event data from stdin: %w", err)
		}
		return b, nil
	case a.DataFile != "":
		b, err := os.ReadFile(a.DataFile)
		if err != nil {
			return nil, fmt.Errorf("--data-file: %w", err)
		}
		return b, nil
	}
	return []byte(a.Data), nil
}

// abbreviate shortens s for an error message.
func abbreviate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

type streamsCmd struct {
	Blocked bool   `name:"blocked" help:"Only blocked streams."`
	Lagging bool   `name:"lagging" help:"Only streams with events not yet forwarded."`
	Match   string `name:"match" help:"Only streams whose name matches this regular expression (Postgres ~)."`
	Limit   int    `name:"limit" default:"1000" help:"At most this many streams (default: ${default})."`
	JSON    bool   `name:"json" help:"One JSON object per line instead of a table."`
}

func (s *streamsCmd) Run(ctx context.Context, g *Globals) error {
	pool, st, err := openReadStore(ctx, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	infos, err := st.Streams(ctx, store.StreamFilter{Blocked: s.Blocked, Lagging: s.Lagging, Match: s.Match, Limit: s.Limit})
	if err != nil {
		return err
	}
	if s.JSON {
		enc := json.NewEncoder(os.Stdout)
		for _, i := range infos {
			if err := enc.Encode(streamJSON(i)); err != nil {
				return err
			}
		}
		return nil
	}
	return printStreams(os.Stdout, infos, s.Blocked)
}

// printStreams writes infos as a table, then the next step for the
// blocked streams and those backing off among them (docs/recovery.md).
// onlyBlocked is whether the listing was --blocked.
func printStreams(w io.Writer, infos []store.StreamInfo, onlyBlocked bool) error {
	if len(infos) == 0 {
		msg := "no streams"
		if onlyBlocked {
			msg = "no blocked streams"
		}
		_, err := fmt.Fprintln(w, msg)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tWATERMARK\tHEAD\tLAG\tLAG_AGE\tRETRY\tNEXT_ATTEMPT\tBLOCKED\tLEASED_BY\tLEASED_UNTIL\tERROR")
	var blocked, backingOff []store.StreamInfo
	for _, i := range infos {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%s\t%t\t%s\t%s\t%s\n",
			i.Stream, i.Watermark, i.Head, i.Lag, i.LagAge.Round(time.Millisecond), i.Retry,
			fmtTime(i.NextAttempt), i.Blocked, dash(i.LeasedBy), fmtTime(i.LeasedUntil), dash(i.Error))
		switch {
		case i.Blocked:
			blocked = append(blocked, i)
		case i.Retry > 0:
			backingOff = append(backingOff, i)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, streamsNext(blocked, backingOff))
	return err
}

// nextNamed is how many streams streamsNext names in a command; past it
// the command takes --all or --match.
const nextNamed = 5

// streamsNext is what bridge streams says to do about the blocked streams
// and those backing off after failures: empty when there are none.
func streamsNext(blocked, backingOff []store.StreamInfo) string {
	var b strings.Builder
	names := func(infos []store.StreamInfo) string {
		if len(infos) > nextNamed {
			return "--all (or --match REGEX)"
		}
		out := make([]string, len(infos))
		for k, i := range infos {
			out[k] = i.Stream
		}
		return strings.Join(out, " ")
	}
	if len(blocked) > 0 {
		fmt.Fprintf(&b, "\n%d blocked: nothing of theirs is forwarded until an operator acts. Fix the cause their ERROR names, then\n", len(blocked))
		fmt.Fprintf(&b, "  bridge unblock %s\n", names(blocked))
		b.WriteString("resumes them after their WATERMARK (no event is skipped or sent twice). `bridge reset STREAM --yes` forwards a stream again from version 0 instead. See docs/recovery.md\n")
	}
	if len(backingOff) > 0 {
		fmt.Fprintf(&b, "\n%d retrying after failures (RETRY > 0): each tries again at its NEXT_ATTEMPT by itself, and blocks after --max-retries; `bridge unblock %s` tries now.\n",
			len(backingOff), names(backingOff))
	}
	return b.String()
}

type streamRow struct {
	Stream      string  `json:"stream"`
	Watermark   int64   `json:"watermark"`
	Head        int64   `json:"head"`
	Lag         int64   `json:"lag"`
	LagSeconds  float64 `json:"lag_seconds"`
	Retry       int     `json:"retry"`
	NextAttempt string  `json:"next_attempt,omitempty"`
	Blocked     bool    `json:"blocked"`
	Error       string  `json:"error,omitempty"`
	LeasedBy    string  `json:"leased_by,omitempty"`
	LeasedUntil string  `json:"leased_until,omitempty"`
}

func streamJSON(i store.StreamInfo) streamRow {
	return streamRow{
		Stream: i.Stream, Watermark: i.Watermark, Head: i.Head, Lag: i.Lag, LagSeconds: i.LagAge.Seconds(),
		Retry: i.Retry, NextAttempt: fmtTimeJSON(i.NextAttempt), Blocked: i.Blocked, Error: i.Error,
		LeasedBy: i.LeasedBy, LeasedUntil: fmtTimeJSON(i.LeasedUntil),
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtTimeJSON(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type unblockCmd struct {
	Names []string `arg:"" optional:"" help:"Streams to unblock."`
	Match string   `name:"match" help:"Unblock every blocked or backing-off stream whose name matches this regular expression (Postgres ~)."`
	All   bool     `name:"all" help:"Unblock every blocked or backing-off stream."`
}

func (u *unblockCmd) Run(ctx context.Context, g *Globals) error {
	modes := 0
	for _, set := range []bool{len(u.Names) > 0, u.Match != "", u.All} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return errors.New("unblock: give stream names, --match REGEX or --all (exactly one of them)")
	}
	pool, st, err := openStore(ctx, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	var changed []store.Changed
	switch {
	case u.All:
		changed, err = st.UnblockMatch(ctx, "")
	case u.Match != "":
		changed, err = st.UnblockMatch(ctx, u.Match)
	default:
		changed, err = st.Unblock(ctx, u.Names)
	}
	if err != nil {
		return err
	}
	for _, c := range changed {
		state := "backing off"
		if c.Blocked {
			state = "blocked"
		}
		fmt.Printf("unblocked %s (was %s: %s): resumes after version %d, %d events to forward\n",
			c.Stream, state, dash(c.Error), c.Watermark, max(c.Head-c.Watermark, 0))
	}
	if len(changed) == 0 {
		fmt.Println("nothing to unblock: no selected stream is blocked or backing off")
	}
	return nil
}

type resetCmd struct {
	Names []string `arg:"" help:"Streams to reset."`
	Yes   bool     `name:"yes" help:"Really reset: every event of the streams is published again (JetStream drops only those still inside its duplicate window)."`
}

func (r *resetCmd) Run(ctx context.Context, g *Globals) error {
	pool, st, err := openReadStore(ctx, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !r.Yes {
		infos, err := st.Streams(ctx, store.StreamFilter{Names: r.Names})
		if err != nil {
			return err
		}
		for _, i := range infos {
			fmt.Printf("would reset %s: watermark %d -> -1, re-publishing its %d events from version 0\n", i.Stream, i.Watermark, i.Head+1)
		}
		if len(infos) == 0 {
			return errors.New("reset: none of the named streams exists")
		}
		return errors.New("reset: nothing changed; run again with --yes to reset (JetStream drops only re-published events still inside its duplicate window)")
	}
	changed, err := st.Reset(ctx, r.Names)
	if err != nil {
		return err
	}
	for _, c := range changed {
		fmt.Printf("reset %s: watermark %d -> -1, %d events to re-publish from version 0\n", c.Stream, c.Watermark, c.Head+1)
	}
	if len(changed) == 0 {
		return errors.New("reset: none of the named streams exists")
	}
	return nil
}
