package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
)

// statusCmd prints the live replicas, the partitions, where each
// subscription stands and the stuck streams.
type statusCmd struct {
	JSON bool             `name:"json" help:"Print the status as one JSON object (replicas, partitions, subscriptions, stuck streams, and the positions bucket's records and cursors decoded) instead of tables."`
	out  io.Writer        // stdout; tests set it
	now  func() time.Time // time.Now; tests set it
}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	w := out(c.out)
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := consumer.ReadStatus(ctx, js, consumer.StatusConfig{EventsStream: g.Stream, DLQStream: g.DLQStream})
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	if err := printDisabled(ctx, js, w); err != nil {
		return err
	}
	return printStatus(w, st)
}

// printStatus prints st's tables: replicas, partitions, subscriptions,
// then the stuck streams (nothing when none) and each one's way out.
func printStatus(w io.Writer, st consumer.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "REPLICA\tLAST HEARTBEAT\tAGE\tPARTITIONS\n")
	for _, r := range st.Replicas {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, r.Heartbeat.UTC().Format(time.RFC3339), r.Age.Truncate(time.Second), ints(r.Partitions))
	}
	if len(st.Replicas) == 0 {
		fmt.Fprintln(tw, "(no live replica)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "PARTITION\tOWNER\tEPOCH\tFLOOR\tLIVE\tNOT LIVE\tASIDES\tRETRIES\tWRITTEN\n")
	for _, p := range st.Partitions {
		owner := cmp.Or(p.Owner, "-")
		if p.RecordOwner != "" && p.RecordOwner != p.Owner {
			owner += " (record: " + p.RecordOwner + ")"
		}
		written := "-"
		if !p.Written.IsZero() {
			written = p.Written.UTC().Format(time.RFC3339)
		}
		var notLive []string
		for _, s := range slices.Sorted(maps.Keys(p.Cursors)) {
			notLive = append(notLive, fmt.Sprintf("%s %d", s, p.Cursors[s]))
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%s\n", p.Partition, owner, p.Epoch, p.Floor, p.Live,
			cmp.Or(strings.Join(notLive, ", "), "-"), p.Asides, p.Retries, written)
	}
	if len(st.Partitions) == 0 {
		fmt.Fprintln(tw, "(no partition claimed yet)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SUBSCRIPTION\tSETTLED UP TO\tBEHIND\tPARTITIONS\n")
	for _, s := range st.Subscriptions {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", s.Name, s.SettledUpTo, s.Behind, s.States())
	}
	if len(st.Subscriptions) == 0 {
		fmt.Fprintln(tw, "(no subscription has a position yet)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "(BEHIND: the events stream's sequences above SETTLED UP TO, up to its last, %d; an upper bound, as a partition's floor rests at its own last event)\n", st.LastSeq)
	for _, s := range st.Subscriptions {
		byState := map[string][]int{}
		for _, p := range s.Partitions {
			if p.State != consumer.StateLive {
				byState[p.State] = append(byState[p.State], p.Partition)
			}
		}
		for _, state := range slices.Sorted(maps.Keys(byState)) {
			fmt.Fprintf(w, "%s: %s on partitions %s\n", s.Name, state, ints(byState[state]))
		}
	}
	return printStuck(w, st.Stuck)
}

// ints prints ps as "0,2,5", or "-" when empty.
func ints(ps []int) string {
	if len(ps) == 0 {
		return "-"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// printStuck prints the stuck streams' table (nothing when there is
// none), then each one's way out.
func printStuck(w io.Writer, stuck []consumer.StuckStream) error {
	if len(stuck) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STUCK STREAM\tSUBSCRIPTION\tPARTITION\tSTATE\tFROM\tHEAD\tSINCE\tWHY\n")
	for _, s := range stuck {
		head := cmp.Or(s.HeadEventID, "-")
		if s.HeadVersion != "" {
			head += " (v" + s.HeadVersion + ")"
		}
		since := "-"
		if !s.Since.IsZero() {
			since = s.Since.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", cmp.Or(s.Stream, s.StreamKey), s.Subscription, s.Partition, s.State, s.From,
			head, since, s.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range stuck {
		fmt.Fprintf(w, "%s of %s (%s): %s\n", cmp.Or(s.Stream, s.StreamKey), s.Subscription, s.State, s.Next)
	}
	return nil
}
