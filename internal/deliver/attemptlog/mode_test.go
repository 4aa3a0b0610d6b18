package attemptlog

import (
	"errors"
	"testing"
)

// ParseMode takes failures (also the empty default) and all, and refuses
// anything else with ErrInvalidMode, naming the value.
func TestParseMode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Mode{"": ModeFailures, "failures": ModeFailures, "all": ModeAll} {
		got, err := ParseMode(in)
		if err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"none", "ALL", "failure", " all"} {
		_, err := ParseMode(in)
		if !errors.Is(err, ErrInvalidMode) {
			t.Errorf("ParseMode(%q): error %v, want ErrInvalidMode", in, err)
			continue
		}
		if want := `attempts record: invalid mode "` + in + `" (want "failures" or "all")`; err.Error() != want {
			t.Errorf("ParseMode(%q): error %q, want %q", in, err, want)
		}
	}
}
