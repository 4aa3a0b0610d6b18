// Package base holds what every part of the consumer's engine takes once
// from the one who assembles it: the Archetype (the clock, the logger and
// the replica's id), as River's baseservice.Archetype does for its
// services. The consumer makes one at New and hands it down; each part
// keeps it (embedded in its Config) and hands it on to the parts it
// makes, with its own log attributes added (With). Time in the engine is
// the archetype's clock alone, so a test drives leases, lingers, pauses
// and deadlines with a fake one (internal/archtest refuses the time
// package's clock calls under internal/deliver).
//
// base is the engine's lowest floor: it imports nothing of the module.
package base

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/jonboulle/clockwork"
)

// Archetype is what every part of the engine shares: made once (New) by
// the consumer, read-only after. A part takes a *Archetype in its Config
// (embedded, so its Clock, Logger and Replica read as the Config's own)
// and treats a nil one as Default().
type Archetype struct {
	// Clock is the engine's only clock: leases and their deadlines,
	// lingers, retry pauses, backoffs, the POSTs' stamps and timings.
	// Default: the real clock.
	Clock clockwork.Clock
	// Logger receives the part's records, with the attributes the parts
	// above it added (With). Default: discard.
	Logger *slog.Logger
	// Replica is this replica's id ([A-Za-z0-9_-]+): its lease keys'
	// and heartbeat's value, its position records' owner, the attempt
	// records' and webhooks' replica. Default ReplicaID().
	Replica string
}

// New returns the archetype of clock, logger and replica, each
// defaulted when zero: nil clock the real one, nil logger a discarding
// one, "" replica ReplicaID().
func New(clock clockwork.Clock, logger *slog.Logger, replica string) *Archetype {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if replica == "" {
		replica = ReplicaID()
	}
	return &Archetype{Clock: clock, Logger: logger, Replica: replica}
}

// Default returns a when it is not nil, else the process's fallback,
// made once at first use: the real clock, a discarding logger, one
// ReplicaID for the process (read-only, as every archetype). A part's
// constructor calls it on the archetype it was given; what needs a
// replica id of its own passes one (New).
func Default(a *Archetype) *Archetype {
	if a != nil {
		return a
	}
	return fallback()
}

// fallback is Default's archetype: made once, since parts made often
// (a cursor per read) default theirs.
var fallback = sync.OnceValue(func() *Archetype { return New(nil, nil, "") })

// With returns a copy of a whose logger adds attrs (slog.Logger.With)
// to every record: what a part passes on to the parts it makes
// (a partition's number, a subscription's name).
func (a *Archetype) With(attrs ...any) *Archetype {
	c := *Default(a)
	c.Logger = c.Logger.With(attrs...)
	return &c
}

// WithReplica returns a copy of a naming replica instead (the attempts
// record's own name, AttemptsConfig.Replica). "" keeps a's.
func (a *Archetype) WithReplica(replica string) *Archetype {
	c := *Default(a)
	if replica != "" {
		c.Replica = replica
	}
	return &c
}

// ValidReplica reports whether s is made of [A-Za-z0-9_-], as a
// replica id must be (a KV key token).
func ValidReplica(s string) bool {
	for _, r := range s {
		if !idRune(r) {
			return false
		}
	}
	return true
}

// idRune reports whether r may be in a replica id: [A-Za-z0-9_-].
func idRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// ReplicaID returns an id for this process as a replica, unique among
// the replicas of a deployment: "<host>-<pid>-<6 hex digits>", the host
// name's characters outside [A-Za-z0-9_-] written '_', the hex digits
// random (a restarted process on the same host and pid gets another id).
func ReplicaID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if idRune(r) {
			return r
		}
		return '_'
	}, host)
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
