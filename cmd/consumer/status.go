package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
)

// statusCmd prints each subscription's start and position, and who owns
// what among the consumer replicas.
type statusCmd struct{}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := consumer.ReadStatus(ctx, js)
	if err != nil {
		return err
	}
	positions, err := consumer.ReadPositions(ctx, js, g.Stream)
	if err != nil {
		return err
	}
	if err := printDisabled(ctx, js); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SUBSCRIPTION\tORDERING\tSTART\tSETTLED UP TO\tPENDING\n")
	for _, p := range positions {
		ordering := "none"
		if p.Ordered {
			ordering = fmt.Sprintf("stream (%d partitions)", p.Partitions)
		}
		floor := "-"
		if p.AckFloor > 0 {
			floor = fmt.Sprintf("%s seq %d", g.Stream, p.AckFloor)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", p.Name, ordering, p.Start, floor, p.Pending)
	}
	if len(positions) == 0 {
		fmt.Fprintln(tw, "(no subscription has a durable consumer yet)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "REPLICA\tSUBSCRIPTION\tLAST HEARTBEAT\n")
	for _, m := range st.Replicas {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.ID, m.Subscription, m.Heartbeat.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
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
				fmt.Printf("%s partition %d: parked stream %s\n", s.Name, p.Partition, e)
			}
			for _, e := range p.OrderStuck {
				fmt.Printf("%s partition %d: order-stuck stream %s\n", s.Name, p.Partition, e)
			}
		}
	}
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "COPY\tEVENTS\tSOURCED UP TO\tLAG MESSAGES\tLAG\n")
	for _, c := range st.Copies {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", c.Stream, c.Events, c.Sourced, c.Messages, c.Age.Round(time.Millisecond))
	}
	if len(st.Copies) == 0 {
		fmt.Fprintln(tw, "(no partitioned copy: no ordered subscription ran yet)")
	}
	return tw.Flush()
}
