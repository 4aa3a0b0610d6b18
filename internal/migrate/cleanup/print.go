package cleanup

import (
	"fmt"
	"io"
	"strings"

	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// Print writes c as `consumer migrate --cleanup` shows it: what is to
// delete, kind by kind and name by name, what stays, and the refusals.
func (c *Leftovers) Print(w io.Writer) error {
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
	list("park bucket "+legacy.ParkBucket+" keys", c.ParkKeys)
	if c.ParkBucket != "" {
		fmt.Fprintf(&b, "  park bucket %s, then left empty\n", c.ParkBucket)
	} else if c.ParkKept > 0 {
		fmt.Fprintf(&b, "  park bucket %s stays: %d keys of subscriptions the old layout has no consumers for\n", legacy.ParkBucket, c.ParkKept)
	}
	list("lease bucket "+wire.DefaultLeaseBucket+" keys of the old engine", c.LeaseKeys)
	list("durable consumers on "+c.Events, c.Durables)
	list("partition consumers on "+legacy.CopyStream(c.Events), c.PartitionConsumers)
	if c.Copy != "" {
		fmt.Fprintf(&b, "  partitioned copy %s\n", c.Copy)
	} else if len(c.CopyKept) > 0 {
		fmt.Fprintf(&b, "  partitioned copy %s stays: its consumers %s are not the old engine's\n", legacy.CopyStream(c.Events), strings.Join(c.CopyKept, ", "))
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
