package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/internal/bridgemetrics"
	"github.com/jsbridge/jsbridge/internal/natsconn"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/internal/startup"
	"github.com/jsbridge/jsbridge/store"
)

// Exit statuses of verify, as diff and cmp use them.
const (
	// verifyProblems: the audit found problems (or some are left after
	// --repair).
	verifyProblems = 1
	// verifyTrouble: bad flags, or the audit could not be completed.
	verifyTrouble = 2
)

type verifyCmd struct {
	Streams         []string `name:"stream" sep:"none" help:"Verify this stream only (may be repeated). Default: every stream."`
	Match           string   `name:"match" help:"Verify the streams whose name matches this regular expression (Postgres ~)."`
	Since           string   `name:"since" help:"Verify only events created since this time: RFC 3339 (2026-11-23T10:00:00Z) or a duration before now (24h)."`
	Repair          bool     `name:"repair" help:"Re-publish each stream's missing tail (events after the last one JetStream holds) through the bridge's fenced path; holes, copies and content mismatches are reported, never changed; events the stream's limits aged out are counted apart and never re-published."`
	JSON            bool     `name:"json" help:"One JSON object per problem, then a summary object, instead of text."`
	NatsURL         string   `name:"nats-url" env:"NATS_URL" help:"NATS server URL(s), comma-separated, of a running server (default: the --context's url)."`
	natsconn.Flags  `embed:""`
	JetStreamStream string        `name:"jetstream-stream" env:"JSBRIDGE_STREAM" default:"${events_stream}" help:"JetStream stream the bridge publishes to (the bridge's --stream) (default: ${default})."`
	SubjectPrefix   string        `name:"subject-prefix" env:"JSBRIDGE_SUBJECT_PREFIX" default:"${events_prefix}" help:"The bridge's subject prefix (default: ${default})."`
	Source          string        `name:"source" env:"JSBRIDGE_SOURCE" default:"jsbridge" help:"The bridge's CloudEvents source (ce-source), part of what is compared (default: ${default})."`
	PageSize        int           `name:"page-size" default:"1000" help:"Events read from Postgres per query (default: ${default})."`
	PublishTimeout  time.Duration `name:"publish-timeout" env:"JSBRIDGE_PUBLISH_TIMEOUT" default:"5s" help:"With --repair, how long to wait for JetStream to acknowledge one publish (default: ${default})."`
	Continuous      bool          `name:"continuous" help:"Verify again every --interval until SIGINT/SIGTERM (a duration --since moves with each round); a round that fails is logged and tried again. Exits by the last round."`
	Interval        time.Duration `name:"interval" default:"5m" help:"With --continuous, the time between the starts of two rounds (default: ${default})."`
	ConnectTimeout  time.Duration `name:"connect-timeout" default:"30s" help:"Give up (exit 2) when Postgres or NATS do not answer within this time (default: ${default})."`
	OpsAddr         string        `name:"ops-addr" env:"JSBRIDGE_VERIFY_OPS_ADDR" default:"127.0.0.1:9466" help:"With --continuous, address of the ops port serving /metrics (jsbridge_bridge_audit_*), /healthz and /readyz; empty disables it (default: ${default})."`
}

// exitError is an error with the process exit status (ops.RunCLI uses it).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }
func (e exitError) ExitCode() int { return e.code }

func trouble(err error) error { return exitError{verifyTrouble, err} }

// Run verifies, repairs when asked, prints the problems and a summary,
// and fails with status 1 when problems are left. With --continuous it
// does so every --interval until SIGINT/SIGTERM, then exits by the last
// round.
func (v *verifyCmd) Run(ctx context.Context, g *Globals) error {
	if _, err := v.check(time.Now()); err != nil {
		return trouble(err)
	}
	conn, err := v.Flags.Resolve(v.NatsURL)
	if err != nil {
		return trouble(err)
	}
	if conn.URL == "" {
		return trouble(errors.New("--nats-url (NATS_URL) is empty: give the URL of a running NATS server, or a --context with a url"))
	}
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return trouble(err)
	}
	pool, st, err := openReadStore(ctx, g)
	if err != nil {
		return trouble(err)
	}
	defer pool.Close()
	w := startup.New(log, v.ConnectTimeout)
	if err := waitPostgres(ctx, w, pool); err != nil {
		return trouble(err)
	}
	nc, err := startup.ConnectNATS(ctx, w, conn.URL, append(startup.NATSOptions(log, "jsbridge-verify"), conn.Options()...)...)
	if err != nil {
		return trouble(err)
	}
	defer nc.Close()
	js, err := conn.JetStream(nc)
	if err != nil {
		return trouble(fmt.Errorf("jetstream: %w", err))
	}
	if !v.Continuous {
		return v.round(ctx, st, js, log, nil)
	}
	// Continuous: the ops port exports each round's findings, so an alert
	// sees a loss without anyone reading the output.
	opsSrv := ops.NewServer()
	metrics, err := bridgemetrics.NewAudit(opsSrv.Registry)
	if err != nil {
		return trouble(err)
	}
	opsSrv.AddCheck("postgres", func(ctx context.Context) error { return pool.Ping(ctx) })
	opsSrv.AddCheck("nats", func(context.Context) error {
		if s := nc.Status(); s != nats.CONNECTED {
			return fmt.Errorf("connection %s", s)
		}
		return nil
	})
	addr, err := opsSrv.Start(v.OpsAddr)
	if err != nil {
		return trouble(err)
	}
	defer opsSrv.Stop()
	if addr != "" {
		log.Info("ops port listening", "addr", addr)
	}
	// A round that could not be made (Postgres or NATS away) is logged,
	// counted and tried again next time; only a stop ends the loop.
	t := time.NewTicker(v.Interval)
	defer t.Stop()
	for {
		err := v.round(ctx, st, js, log, metrics)
		var ee exitError
		if ctx.Err() != nil {
			return nil
		}
		if errors.As(err, &ee) && ee.code == verifyTrouble {
			metrics.Failed()
			log.Warn("verify round failed; trying again next round", "error", err, "interval", v.Interval)
		}
		select {
		case <-ctx.Done():
			if errors.As(err, &ee) && ee.code == verifyTrouble {
				return nil
			}
			return err
		case <-t.C:
		}
	}
}

// round reads the watermarks, verifies, repairs when asked, prints, and
// records a completed round in metrics (nil: a single run, no metrics).
func (v *verifyCmd) round(ctx context.Context, st *store.Store, js jetstream.JetStream, log *slog.Logger, metrics *bridgemetrics.Audit) error {
	since, err := v.check(time.Now())
	if err != nil {
		return trouble(err)
	}
	// Watermarks first: every event up to them was stored in JetStream
	// before the read below begins (or lost).
	var infos []store.StreamInfo
	if len(v.Streams) > 0 {
		infos, err = st.Streams(ctx, store.StreamFilter{Names: v.Streams})
	} else {
		infos, err = st.Streams(ctx, store.StreamFilter{Match: v.Match})
	}
	if err != nil {
		if errors.Is(err, store.ErrInvalidInput) {
			return trouble(fmt.Errorf("--match: %w", err))
		}
		return trouble(err)
	}
	if len(v.Streams) > 0 && len(infos) < len(v.Streams) {
		return trouble(fmt.Errorf("--stream: %s", missingNames(v.Streams, infos)))
	}
	cfg := bridge.VerifyConfig{Stream: v.JetStreamStream, SubjectPrefix: v.SubjectPrefix, Source: v.Source, Since: since, PageSize: v.PageSize,
		All: len(v.Streams) == 0 && v.Match == "", PublishTimeout: v.PublishTimeout, Logger: log}
	rep, err := bridge.Verify(ctx, js, st, infos, cfg)
	if err != nil {
		return trouble(fmt.Errorf("verify: %w", flagNames(err)))
	}
	if v.Repair {
		if err := bridge.Repair(ctx, js, &rep); err != nil {
			return trouble(err)
		}
	}
	if err := v.print(rep); err != nil {
		return trouble(err)
	}
	if metrics != nil {
		metrics.Completed(auditRound(rep, time.Now()))
	}
	if n := rep.Unresolved(); n > 0 {
		return exitError{verifyProblems, fmt.Errorf("verify: %d problems left", n)}
	}
	return nil
}

// check validates the flags and returns --since as a time (zero: none).
func (v *verifyCmd) check(now time.Time) (time.Time, error) {
	if len(v.Streams) > 0 && v.Match != "" {
		return time.Time{}, fmt.Errorf("give --stream %q or --match %q, not both", v.Streams, v.Match)
	}
	if v.Continuous && v.Interval <= 0 {
		return time.Time{}, fmt.Errorf("--interval %s: want > 0", v.Interval)
	}
	if v.PageSize <= 0 {
		return time.Time{}, fmt.Errorf("--page-size %d: want > 0", v.PageSize)
	}
	if v.Since == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v.Since); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v.Since)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-11-23T10:00:00Z) or a positive duration before now (24h)", v.Since)
	}
	return now.Add(-d), nil
}

// auditRound reduces a report to the numbers the metrics export: the
// problems left, by kind.
func auditRound(rep bridge.Report, end time.Time) bridgemetrics.AuditRound {
	r := bridgemetrics.AuditRound{Events: rep.Events, Duration: rep.Elapsed, End: end}
	for _, p := range rep.Problems {
		if p.Repaired {
			r.Repaired++
			continue
		}
		switch p.Kind {
		case bridge.ProblemMissing:
			r.Missing++
		case bridge.ProblemDuplicate:
			r.Duplicates++
		case bridge.ProblemOutOfOrder:
			r.OutOfOrder++
		case bridge.ProblemContentDiffers:
			r.ContentDiffers++
		}
	}
	return r
}

// missingNames names the --stream names the store does not know.
func missingNames(names []string, infos []store.StreamInfo) string {
	known := make(map[string]bool, len(infos))
	for _, i := range infos {
		known[i.Stream] = true
	}
	var miss []string
	for _, n := range names {
		if !known[n] {
			miss = append(miss, fmt.Sprintf("%q", n))
		}
	}
	return "no such stream: " + strings.Join(miss, ", ")
}

type verifySummary struct {
	Summary         bool                       `json:"summary"`
	Streams         int                        `json:"streams"`
	Events          int64                      `json:"events"`
	Messages        int64                      `json:"messages"`
	AgedOut         int64                      `json:"aged_out"`
	Problems        map[bridge.ProblemKind]int `json:"problems"`
	Repaired        int                        `json:"repaired"`
	Left            int                        `json:"left"`
	Seconds         float64                    `json:"seconds"`
	JetStreamSecs   float64                    `json:"jetstream_seconds"`
	EventsPerSecond float64                    `json:"events_per_second"`
}

// print writes one line per problem and a summary line to stdout.
func (v *verifyCmd) print(rep bridge.Report) error {
	counts, repaired := rep.Counts()
	sum := verifySummary{Summary: true, Streams: rep.Streams, Events: rep.Events, Messages: rep.Messages, AgedOut: rep.AgedOut, Problems: counts,
		Repaired: repaired, Left: rep.Unresolved(), Seconds: rep.Elapsed.Seconds(), JetStreamSecs: rep.ReadJetStream.Seconds(), EventsPerSecond: rep.EventsPerSecond()}
	if v.JSON {
		enc := json.NewEncoder(os.Stdout)
		for _, p := range rep.Problems {
			if err := enc.Encode(p); err != nil {
				return err
			}
		}
		return enc.Encode(sum)
	}
	for _, p := range rep.Problems {
		state := ""
		if p.Repaired {
			state = " repaired"
		}
		seq := "-"
		if p.Sequence > 0 {
			seq = fmt.Sprint(p.Sequence)
		}
		fmt.Printf("%s version=%d event_id=%d kind=%s sequence=%s%s: %s\n", p.Stream, p.Version, p.EventID, p.Kind, seq, state, p.Detail)
	}
	fmt.Printf("verified %d events of %d streams against %d JetStream messages in %s (JetStream read %s; %.0f events/s): %d missing, %d duplicate, %d out of order, %d content differs; %d repaired, %d left; %d aged out (removed by the JetStream stream's limits, not a problem)\n",
		sum.Events, sum.Streams, sum.Messages, rep.Elapsed.Round(time.Millisecond), rep.ReadJetStream.Round(time.Millisecond), sum.EventsPerSecond,
		counts[bridge.ProblemMissing], counts[bridge.ProblemDuplicate], counts[bridge.ProblemOutOfOrder], counts[bridge.ProblemContentDiffers], repaired, sum.Left, sum.AgedOut)
	return nil
}
