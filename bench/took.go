package main

import (
	"fmt"
	"strings"
	"time"
)

// rowTimes is how long each row of a run took (wall clock, start-up and
// loading included), in the order they ran: what to shrink when a quick
// run passes its 3 minutes.
type rowTimes struct {
	names []string
	took  []time.Duration
	cur   time.Time
}

// start ends the row running (printing its time) and starts name; "" only
// ends the row running.
func (t *rowTimes) start(name string) {
	now := time.Now()
	if n := len(t.names); n > 0 && !t.cur.IsZero() {
		t.took[n-1] = now.Sub(t.cur)
		fmt.Printf("bench: row %s took %s\n", t.names[n-1], t.took[n-1].Round(100*time.Millisecond))
	}
	t.cur = time.Time{}
	if name != "" {
		t.names, t.took, t.cur = append(t.names, name), append(t.took, 0), now
	}
}

// String is "drain 21s, claim 9s, …".
func (t rowTimes) String() string {
	parts := make([]string, len(t.names))
	for i, n := range t.names {
		parts[i] = fmt.Sprintf("%s %s", n, t.took[i].Round(time.Second))
	}
	return strings.Join(parts, ", ")
}
