package owner

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// A failure repeated at every try is warned about once a minute per key,
// the next warning counting the repeats; the others are at debug level.
func TestWarnPaceWarnsOnceAMinutePerKey(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := NewWarnPace(clock)
	lines := func(level string) int { return strings.Count(buf.String(), "level="+level+" ") }

	for range 5 {
		w.Warn(log, "orders", "claiming a partition lease failed", slog.Int("partition", 1))
	}
	w.Warn(log, "billing", "claiming a partition lease failed")
	w.Warn(log, "orders", "membership heartbeat failed")
	require.Equal(t, 3, lines("WARN"), "one per subscription and message:\n%s", buf.String())
	require.Equal(t, 4, lines("DEBUG"))

	clock.Advance(warnEvery - time.Second)
	w.Warn(log, "orders", "claiming a partition lease failed")
	require.Equal(t, 3, lines("WARN"))
	clock.Advance(time.Second)
	w.Warn(log, "orders", "claiming a partition lease failed")
	require.Equal(t, 4, lines("WARN"))
	require.Contains(t, buf.String(), "repeats=5", "the four repeats and the one at 59 s")
}
