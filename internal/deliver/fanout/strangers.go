package fanout

import (
	"log/slog"
	"maps"
	"slices"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
)

// holdStrangers keeps the place of every subscription the claimed record
// or cursors hold that is not in members (a stranger: another replica
// delivers it, this one does not): one the record lists live is given a
// StateHeld cursor holding what the record says it settled
// (position.Partition.Detach), so that the floor may pass it while its
// events from its own position on stay owed; one with a cursor keeps it
// as it is. A stranger cfg.Deleted names is dropped instead
// (position.Partition.Drop). It returns the strangers held. Called by
// New before it reads the record.
func holdStrangers(cfg Config, members *member.Index, pos Position) map[string]bool {
	held := map[string]bool{}
	rec, curs := pos.Record(), pos.Cursors()
	names := slices.Sorted(maps.Keys(rec.Members))
	for name := range curs {
		if _, isMember := rec.Members[name]; !isMember {
			names = append(names, name)
		}
	}
	for _, name := range names {
		if _, ok := members.Entry(name); ok {
			continue
		}
		log := cfg.Logger.With(slog.Int("partition", cfg.Partition), slog.String("subscription", name))
		if cfg.Deleted != nil && cfg.Deleted(name) {
			pos.Drop(name)
			log.Info("the partition's record holds a subscription deleted since: its place is dropped")
			continue
		}
		held[name] = true
		if pos.Detach(name, StateHeld) {
			log.Info("the partition's record lists a subscription this replica does not deliver: its place is held (a replica that delivers it resumes it from there)")
		}
	}
	return held
}
