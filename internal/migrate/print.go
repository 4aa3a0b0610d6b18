package migrate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
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
