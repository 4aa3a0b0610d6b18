package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
)

// statusCmd prints each subscription's start and position, who owns
// what among the consumer replicas, and the stuck streams.
type statusCmd struct {
	JSON bool      `name:"json" help:"Print the status as one JSON object (positions, replicas, partitions, stuck streams, and the shared engine's partition records when its bucket exists) instead of tables."`
	out  io.Writer // stdout; tests set it
}

// statusJSON is `consumer status --json`'s object.
type statusJSON struct {
	Replicas      []consumer.ReplicaStatus      `json:"replicas"`
	Subscriptions []consumer.SubscriptionStatus `json:"subscriptions"`
	Stuck         []consumer.StuckStream        `json:"stuck"`
	Shared        []consumer.SharedPosition     `json:"shared_positions,omitempty"`
}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	w := out(c.out)
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := consumer.ReadStatus(ctx, js)
	if err != nil {
		return err
	}
	shared, err := consumer.ReadSharedPositions(ctx, js)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(statusJSON{Replicas: st.Replicas, Subscriptions: st.Subscriptions, Stuck: st.Stuck, Shared: shared})
	}
	if err := printDisabled(ctx, js, w); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "REPLICA\tSUBSCRIPTION\tLAST HEARTBEAT\n")
	for _, m := range st.Replicas {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.ID, m.Subscription, m.Heartbeat.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SUBSCRIPTION\tPARTITION\tOWNER\tPARKED STREAMS\n")
	for _, s := range st.Subscriptions {
		for _, p := range s.Partitions {
			owner := p.Owner
			if owner == "" {
				owner = "-"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", s.Name, p.Partition, owner, p.Parked)
		}
	}
	if len(st.Subscriptions) == 0 {
		fmt.Fprintln(tw, "(no ordered subscription has a partition lease)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Held events nearing or past the copy's MaxAge: the causes, in full.
	for _, s := range st.Subscriptions {
		for _, p := range s.Partitions {
			for _, e := range p.AtRisk {
				fmt.Fprintf(w, "%s partition %d: parked stream %s\n", s.Name, p.Partition, e)
			}
		}
	}
	if err := printStuck(w, st.Stuck); err != nil {
		return err
	}
	return printShared(w, shared)
}

// printShared prints the shared engine's partition records (nothing when
// its bucket does not exist or holds none): one line a partition with
// its owner, epoch, floor and how many entries of each kind it holds,
// then each cursor. `--json` gives them whole.
func printShared(w io.Writer, shared []consumer.SharedPosition) error {
	if len(shared) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SHARED PARTITION\tOWNER\tEPOCH\tFLOOR\tSTREAM ENTRIES\tMEMBERS\tASIDES\tRETRIES\tCURSORS\tWRITTEN\n")
	for _, s := range shared {
		r := s.Record
		entries := len(r.Streams)
		for _, own := range r.Ahead {
			entries += len(own)
		}
		written := "-"
		if !s.Updated.IsZero() {
			written = s.Updated.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Partition, cmp.Or(r.Owner, "-"), r.Epoch, r.Floor,
			entries, len(r.Members), len(r.Asides), len(r.Retries), len(s.Cursors), written)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range shared {
		for _, sub := range slices.Sorted(maps.Keys(s.Cursors)) {
			c := s.Cursors[sub]
			fmt.Fprintf(w, "partition %d: %s has a cursor (%s) from sequence %d\n", s.Partition, sub, c.State, c.Floor+1)
		}
	}
	return nil
}

// printStuck prints the stuck streams' table (nothing when there is
// none), then each one's way out.
func printStuck(w io.Writer, stuck []consumer.StuckStream) error {
	if len(stuck) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STUCK STREAM\tSUBSCRIPTION\tPARTITION\tSTATE\tHEAD\tSINCE\tLAST ANSWER\n")
	for _, s := range stuck {
		head := cmp.Or(s.HeadEventID, "-")
		if s.HeadVersion != "" {
			head += " (v" + s.HeadVersion + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", s.StreamKey, s.Subscription, s.Partition, s.State, head,
			s.Since.UTC().Format(time.RFC3339), cmp.Or(s.LastAnswer, "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range stuck {
		fmt.Fprintf(w, "%s (%s): %s\n", s.StreamKey, s.State, s.Next)
	}
	return nil
}
