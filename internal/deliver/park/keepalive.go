package park

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
)

// keepAlive sends InProgress for the held events every AckWait/2, and
// updates the parked-stream metrics and the owner's held counts in the
// park bucket, until ctx ends. A parked stream whose oldest held event
// nears or passes the copy's MaxAge gets the cause in its entry (see
// ordercopy.RiskOf) and an error in the log, once per stage.
func (pk *Parking) keepAlive(ctx context.Context) {
	t := pk.clock.NewTicker(min(pk.ackWait/2, 5*time.Second))
	defer t.Stop()
	type state struct {
		held int
		risk ordercopy.Risk
	}
	reported := map[string]state{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		type report struct {
			key    string
			entry  deadletter.ParkedStream
			held   int
			oldest time.Time
			risk   ordercopy.Risk
			atRisk jetstream.Msg // the held event longest in the copy
			inCopy time.Time     // since when
		}
		var msgs []heldMsg
		var reports []report
		oldest := time.Time{}
		now := pk.clock.Now()
		maxAge := pk.copyMaxAge()
		pk.mu.Lock()
		n, stuck := len(pk.parked), 0
		for k, ps := range pk.parked {
			if ps.entry.OrderStuck {
				stuck++
			}
			rp := report{key: k, entry: ps.entry, held: len(ps.held)}
			for _, h := range ps.held {
				msgs = append(msgs, h)
				if rp.oldest.IsZero() || h.at.Before(rp.oldest) {
					rp.oldest = h.at
				}
				if md, err := h.msg.Metadata(); err == nil && (rp.inCopy.IsZero() || md.Timestamp.Before(rp.inCopy)) {
					rp.atRisk, rp.inCopy = h.msg, md.Timestamp
				}
			}
			if !rp.oldest.IsZero() && (oldest.IsZero() || rp.oldest.Before(oldest)) {
				oldest = rp.oldest
			}
			rp.risk = ordercopy.RiskOf(rp.inCopy, now, maxAge)
			// A stream whose held events were set aside (held 0 now)
			// is reported too: its entry must not keep the old count.
			if reported[k] != (state{rp.held, rp.risk}) {
				reports = append(reports, rp)
			}
		}
		pk.mu.Unlock()
		for _, x := range msgs {
			_ = x.h.InProgress(x.msg) // not past its partition's lease, nor while disconnected
		}
		age := 0.0
		if !oldest.IsZero() {
			age = pk.clock.Since(oldest).Seconds()
		}
		pk.setGauges(n, stuck, age)
		for _, rp := range reports {
			e := rp.entry
			e.Held, e.OldestHeldAt, e.UpdatedAt, e.Replica = rp.held, rp.oldest.UTC(), now.UTC(), pk.replicaID
			if rp.risk != ordercopy.RiskNone {
				id := attempt.EventID(rp.atRisk)
				e.Error = ordercopy.RiskError(rp.risk, pk.copyStream, id, rp.inCopy, now, maxAge, pk.replicaID)
				e.AtRiskEventID, e.AtRiskEventTime, e.CopyMaxAge = id, rp.inCopy.UTC(), maxAge
				if reported[rp.key].risk != rp.risk {
					pk.log.Error("a parked stream's held event nears or passed the partitioned copy's MaxAge: "+e.Error,
						slog.String("stream", e.Stream), slog.String("event_id", id), slog.Duration("age", now.Sub(rp.inCopy).Round(time.Millisecond)),
						slog.Duration("max_age", maxAge))
				}
			}
			v, err := json.Marshal(e)
			if err != nil {
				continue
			}
			// Put only over an existing entry: one deleted meanwhile
			// (replayed or skipped) must stay deleted.
			kv := pk.kv()
			if kv == nil {
				continue
			}
			if cur, err := kv.Get(ctx, rp.key); err == nil {
				if _, err := kv.Update(ctx, rp.key, v, cur.Revision()); err == nil {
					reported[rp.key] = state{rp.held, rp.risk}
				}
			}
		}
	}
}

// setGauges sets the subscription's parked, order-stuck and oldest-held
// gauges (those not nil).
func (pk *Parking) setGauges(parked, stuck int, oldestHeld float64) {
	if g := pk.metrics.Parked; g != nil {
		g.WithLabelValues(pk.sub).Set(float64(parked))
	}
	if g := pk.metrics.OrderStuck; g != nil {
		g.WithLabelValues(pk.sub).Set(float64(stuck))
	}
	if g := pk.metrics.OldestHeld; g != nil {
		g.WithLabelValues(pk.sub).Set(oldestHeld)
	}
}
