package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAgedOutTellsRetentionFromLoss(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	old, recent := now.Add(-48*time.Hour), now.Add(-time.Hour)
	day := Retention{MaxAge: 24 * time.Hour, Removed: true, Now: now}
	tests := []struct {
		name    string
		r       Retention
		version int64
		created time.Time
		later   int64 // later versions on the event's subject
		first   int64 // lowest version held of the stream; -1 none
		want    bool
	}{
		{"no limits: lost", Retention{Removed: true, Now: now}, 0, old, 0, -1, false},
		{"MaxAge, old, nothing held", day, 0, old, 0, -1, true},
		{"MaxAge, old, before the first held", day, 0, old, 0, 3, true},
		{"MaxAge, old, but after a held version: a lost tail", day, 5, old, 0, 3, false},
		{"MaxAge, created within MaxAge: lost", day, 0, recent, 0, -1, false},
		{"MaxAge, nothing left the front: lost", Retention{MaxAge: 24 * time.Hour, Now: now}, 0, old, 0, -1, false},
		{"MaxBytes, head", Retention{MaxBytes: 1 << 20, Removed: true, Now: now}, 0, recent, 0, 2, true},
		{"MaxBytes, after the first held", Retention{MaxBytes: 1 << 20, Removed: true, Now: now}, 4, recent, 0, 2, false},
		{"MaxMsgs, nothing held", Retention{MaxMsgs: 10, Removed: true, Now: now}, 4, recent, 0, -1, true},
		{"MaxMsgsPerSubject 1, a later one on the subject", Retention{MaxMsgsPerSubject: 1, Now: now}, 3, recent, 1, 0, true},
		{"MaxMsgsPerSubject 2, one later on the subject: lost", Retention{MaxMsgsPerSubject: 2, Now: now}, 3, recent, 1, 0, false},
		{"MaxMsgsPerSubject, none later: lost", Retention{MaxMsgsPerSubject: 1, Now: now}, 3, recent, 0, 0, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.r.agedOut(tt.version, tt.created, tt.later, tt.first), tt.name)
	}
}
