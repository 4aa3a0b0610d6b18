package migrate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jsbridge/jsbridge/wire"
)

// Print writes the plan as `consumer migrate --dry-run` shows it: the
// events stream and the copy, then per subscription its floor, pending
// count, what would be re-sent, its partitions (ordered) and its streams
// set aside or parked, then the refusals.
func (p *Plan) Print(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "events stream %s (AllowDirect %s), %d partitions, lease epoch %d, %d skipped-version records, fingerprint %s\n",
		p.Events, onOff(p.AllowDirect, "on", "off: turned on by the migration"), p.Partitions, p.Epoch, len(p.Skipped), p.Fingerprint)
	if p.Copy != "" {
		fmt.Fprintf(&b, "partitioned copy %s, sourced up to %d\n", p.Copy, p.Sourced)
	}
	for _, s := range p.Subscriptions {
		b.WriteString("\n")
		kind := "unordered"
		if s.Ordered {
			kind = "ordered"
		}
		fmt.Fprintf(&b, "subscription %s (%s): floor %d", s.Name, kind, s.Floor)
		if !s.Ordered {
			fmt.Fprintf(&b, ", last delivered %d", s.Delivered)
		}
		fmt.Fprintf(&b, ", pending %d, re-sent %d", s.Pending, s.Resent)
		if !s.Ordered && s.Resent > 0 {
			fmt.Fprintf(&b, " (the events of (%d, %d] it takes less those pending: re-sent unless its pending set is read back, --read-pending)", s.Floor, s.Delivered)
		}
		b.WriteString("\n")
		if len(s.Partitions) > 0 {
			tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  partition\tcopy floor\tfloor\tpending\tstreams settled above")
			for _, pp := range s.Partitions {
				fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\n", pp.Partition, pp.CopyFloor, pp.Floor, pp.Pending, pp.Settled)
			}
			_ = tw.Flush()
		}
		for _, a := range s.Asides {
			fmt.Fprintf(&b, "  %s: partition %d, stream %s, from %d", a.State, a.Partition, a.Stream, a.From)
			if a.Head != "" {
				fmt.Fprintf(&b, ", head event %s", a.Head)
			}
			b.WriteString("\n")
		}
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "  note: %s\n", n)
		}
	}
	if len(p.Refusals) > 0 {
		b.WriteString("\nrefused:\n")
		for _, r := range p.Refusals {
			fmt.Fprintf(&b, "  %s\n", r)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func onOff(v bool, on, off string) string {
	if v {
		return on
	}
	return off
}

// Print writes c as `consumer migrate --cleanup` shows it: what is to
// delete, kind by kind and name by name, what stays, and the refusals.
func (c *Cleanup) Print(w io.Writer) error {
	var b strings.Builder
	migrated := c.Migrated
	if migrated == "" {
		migrated = "none applied"
	}
	fmt.Fprintf(&b, "what the old layout left of events stream %s (migration %s), to delete:\n", c.Events, migrated)
	list := func(what string, names []string) {
		if len(names) == 0 {
			return
		}
		fmt.Fprintf(&b, "  %s (%d):\n", what, len(names))
		for _, n := range names {
			fmt.Fprintf(&b, "    %s\n", n)
		}
	}
	list("park bucket "+ParkBucket+" keys", c.ParkKeys)
	if c.ParkBucket != "" {
		fmt.Fprintf(&b, "  park bucket %s, then left empty\n", c.ParkBucket)
	} else if c.ParkKept > 0 {
		fmt.Fprintf(&b, "  park bucket %s stays: %d keys of subscriptions the old layout has no consumers for\n", ParkBucket, c.ParkKept)
	}
	list("lease bucket "+wire.DefaultLeaseBucket+" keys of the old engine", c.LeaseKeys)
	list("durable consumers on "+c.Events, c.Durables)
	list("partition consumers on "+CopyStream(c.Events), c.PartitionConsumers)
	if c.Copy != "" {
		fmt.Fprintf(&b, "  partitioned copy %s\n", c.Copy)
	} else if len(c.CopyKept) > 0 {
		fmt.Fprintf(&b, "  partitioned copy %s stays: its consumers %s are not the old engine's\n", CopyStream(c.Events), strings.Join(c.CopyKept, ", "))
	}
	if c.Empty() {
		b.WriteString("  nothing left to delete\n")
	}
	fmt.Fprintf(&b, "kept: the dead letters, the positions bucket %s, the shared engine's keys in %s\n", c.Positions, wire.DefaultLeaseBucket)
	if len(c.Refusals) > 0 {
		b.WriteString("\nrefused:\n")
		for _, r := range c.Refusals {
			fmt.Fprintf(&b, "  %s\n", r)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
