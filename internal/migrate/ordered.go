package migrate

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// partitionState is what one ordered subscription holds on one partition,
// translated: its floor, its streams settled above it, its asides.
type partitionState struct {
	sub     string
	p       int
	floor   uint64
	entries map[string]position.Entry
	asides  []position.Aside
	// copyFloor and copyEntries are the partition consumer's ack floor
	// and the delivered record's entries as stored (copy sequences, by
	// the copy's stream key).
	copyFloor   uint64
	copyEntries map[string]uint64
	// copyDelivered and filters are the partition consumer's last
	// delivered copy sequence and its filter subjects.
	copyDelivered uint64
	filters       []string
	retries       []position.Retry
}

// ordered plans an ordered subscription, partition by partition: each
// partition consumer's ack floor, the delivered record's entries and the
// aside records translated from the copy's sequences; then its parked
// streams, from the park entries and their heads' dead letters.
func (r *reading) ordered(ctx context.Context, name string) (SubscriptionPlan, []*partitionState, error) {
	sp := SubscriptionPlan{Name: name, Ordered: true}
	if r.copy == nil {
		return sp, nil, nil // refused: no usable copy
	}
	var parts []*partitionState
	for p := range r.cfg.Partitions {
		durable := legacy.PartitionDurable(name, p)
		c, err := r.js.Consumer(ctx, r.copy.Name, durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.plan.refuse(name, p, "partition consumer %q is missing on %q: its floor is unknown (start the old version once to create it, or stop it again and check)", durable, r.copy.Name)
			continue
		}
		if err != nil {
			return sp, nil, fmt.Errorf("migrate: subscription %q: partition consumer %q: %w", name, durable, err)
		}
		info := c.CachedInfo()
		pp := PartitionPlan{Partition: p, CopyFloor: info.AckFloor.Stream, Pending: info.NumAckPending}
		if pp.Floor, err = r.copy.Floor(ctx, pp.CopyFloor); err != nil {
			return sp, nil, err
		}
		if pp.CopyFloor+1 < r.copy.First && info.Delivered.Stream < r.copy.First {
			sp.Notes = append(sp.Notes, fmt.Sprintf("partition %d: its floor (copy %d) is below the copy's first message (%d): events aged out of the copy before it took them", p, pp.CopyFloor, r.copy.First))
		}
		ps := &partitionState{sub: name, p: p, floor: pp.Floor, entries: map[string]position.Entry{}, copyFloor: pp.CopyFloor,
			copyDelivered: info.Delivered.Stream, filters: legacy.Filters(info.Config)}
		stale, err := r.delivered(ctx, &sp, ps)
		if err != nil {
			return sp, nil, err
		}
		if stale {
			msgs, err := legacy.ListTaken(ctx, r.copy.Stream, legacy.Filters(info.Config), pp.CopyFloor+1, info.Delivered.Stream)
			if err != nil {
				return sp, nil, err
			}
			if n := uint64(len(msgs)); n > uint64(pp.Pending) {
				sp.Resent += n - uint64(pp.Pending)
			}
		}
		if err := r.asides(ctx, &sp, ps); err != nil {
			return sp, nil, err
		}
		pp.Settled = len(ps.entries)
		sp.Pending += pp.Pending
		sp.Partitions = append(sp.Partitions, pp)
		parts = append(parts, ps)
	}
	if len(sp.Partitions) > 0 {
		sp.Floor = slices.MinFunc(sp.Partitions, func(a, b PartitionPlan) int { return cmp.Compare(a.Floor, b.Floor) }).Floor
	}
	if err := r.parked(ctx, &sp, parts); err != nil {
		return sp, nil, err
	}
	if err := r.attempts(ctx, &sp, parts); err != nil {
		return sp, nil, err
	}
	return sp, parts, nil
}

// delivered translates partition ps's delivered record: each stream's
// last event settled above the copy floor becomes an entry (its events
// stream sequence, and the version the chain names after it). It reports
// stale when a record exists that cannot be read, or is of another copy:
// what it says is lost, and what was acked above the floor is sent again.
func (r *reading) delivered(ctx context.Context, sp *SubscriptionPlan, ps *partitionState) (stale bool, err error) {
	if r.park == nil {
		return false, nil
	}
	key := legacy.DeliveredKey(ps.sub, ps.p)
	e, err := r.park.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("migrate: read %q of the park bucket: %w", key, err)
	}
	var rec legacy.DeliveredRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		sp.Notes = append(sp.Notes, fmt.Sprintf("partition %d: the delivered record %q cannot be read (%v): what it settled above the floor is sent again", ps.p, key, err))
		return true, nil
	}
	if rec.Copy != r.copyAt {
		sp.Notes = append(sp.Notes, fmt.Sprintf("partition %d: the delivered record %q is of a copy made before this one (the old engine does not read it either): what was settled above the floor is sent again", ps.p, key))
		return true, nil
	}
	ps.copyEntries = rec.Streams
	for _, copySeq := range rec.Streams {
		if copySeq <= ps.copyFloor {
			continue
		}
		m, err := r.copy.Msg(ctx, copySeq)
		if err != nil {
			return false, err
		}
		if m == nil {
			sp.Notes = append(sp.Notes, fmt.Sprintf("partition %d: the copy no longer holds the event at %d, settled above the floor: its stream's entry is dropped, the stream's predecessor is looked up again", ps.p, copySeq))
			continue
		}
		seq, err := r.copy.Origin(m)
		if err != nil {
			return false, err
		}
		stream := wire.StreamKey(legacy.EventsSubject(r.prefix, m.Subject))
		version, err := r.chainVersion(ctx, ps.sub, stream, m)
		if err != nil {
			return false, err
		}
		ps.entries[stream] = position.Entry{Seq: seq, Version: version}
	}
	return false, nil
}

// chainVersion is the version the version chain names after the settled
// event m of stream: its own (ce-streamversion) when it was delivered,
// the predecessor it carried when it was dead-lettered and not delivered
// since (the skipped-version record), noVersion when that is none or m
// carries no version.
func (r *reading) chainVersion(ctx context.Context, sub, stream string, m *jetstream.RawStreamMsg) (uint64, error) {
	v, err := strconv.ParseInt(m.Header.Get(wire.HeaderStreamVersion), 10, 64)
	if err != nil || v < 0 {
		return noVersion, nil
	}
	skipped, err := deadletter.ReadSkipped(ctx, r.park, sub, stream)
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if v = skipped.Previous(v); v < 0 {
		return noVersion, nil
	}
	return uint64(v), nil
}

// asides translates partition ps's aside records: a stream set aside is
// re-read from its record's From, or from its refused head when that
// never settled (above the floor and its stream's entry: it was pending,
// in its lane); a stream set aside because it is parked stays parked
// (parked refines it with its head).
func (r *reading) asides(ctx context.Context, sp *SubscriptionPlan, ps *partitionState) error {
	entries, err := legacy.ParkEntries(ctx, r.park, legacy.AsideKeyPrefix+ps.sub+"."+strconv.Itoa(ps.p)+".*")
	if err != nil {
		return err
	}
	for _, e := range entries {
		k := e.Key()
		var rec legacy.AsideRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Subject == "" {
			r.plan.refuse(ps.sub, ps.p, "the aside record %q cannot be read (%v): its stream's events from some point on were acked out and would be lost", k, err)
			continue
		}
		fromCopy := rec.From
		if !rec.Parked && rec.Head > ps.copyFloor && rec.Head < fromCopy && ps.copyEntries[wire.StreamKey(rec.Subject)] < rec.Head {
			fromCopy = rec.Head
		}
		from, err := r.copy.From(ctx, fromCopy)
		if err != nil {
			return err
		}
		a := position.Aside{Sub: ps.sub, Stream: wire.StreamKey(legacy.EventsSubject(r.prefix, rec.Subject)), From: from, State: StateStuck}
		if rec.Parked {
			a.State = StateParked
		}
		ps.asides = append(ps.asides, a)
	}
	return nil
}

// parked makes the subscription's parked streams parked asides, from
// their dead-lettered heads' events stream sequences (read from the dead
// letters), replacing an aside record of the same stream. A stream set
// aside as parked whose park entry is gone (replayed or skipped, its
// re-read not done) is re-read as a stuck one.
func (r *reading) parked(ctx context.Context, sp *SubscriptionPlan, parts []*partitionState) error {
	entries, err := legacy.ListParked(ctx, r.park, sp.Name)
	if err != nil {
		return err
	}
	byPartition := map[int]*partitionState{}
	for _, ps := range parts {
		byPartition[ps.p] = ps
	}
	var heads map[string]uint64 // dead-lettered event id → events stream sequence
	parkedAt := map[[2]string]bool{}
	for _, e := range entries {
		ps := byPartition[e.Partition]
		if ps == nil {
			continue // refused already, or out of range
		}
		if heads == nil {
			if heads, err = r.deadLetterSeqs(ctx, sp.Name); err != nil {
				return err
			}
		}
		stream := wire.StreamKey(e.Subject)
		from := heads[e.HeadEventID]
		if from == 0 {
			from = max(ps.floor, ps.entries[stream].Seq) // the head is its stream's last event settled
			sp.Notes = append(sp.Notes, fmt.Sprintf("partition %d: the parked head %s of %s has no dead letter left: parked from %d, its stream's last event settled", e.Partition, e.HeadEventID, e.Stream, from))
		}
		state := StateParked
		if e.OrderStuck {
			state = stateOrderStuck
		}
		ps.asides = slices.DeleteFunc(ps.asides, func(a position.Aside) bool { return a.Stream == stream })
		ps.asides = append(ps.asides, position.Aside{Sub: sp.Name, Stream: stream, From: from, State: state})
		parkedAt[[2]string{strconv.Itoa(e.Partition), stream}] = true
	}
	for _, ps := range parts {
		for i, a := range ps.asides {
			if a.State == StateParked && !parkedAt[[2]string{strconv.Itoa(ps.p), a.Stream}] {
				ps.asides[i].State = StateStuck
			}
		}
		slices.SortFunc(ps.asides, func(a, b position.Aside) int { return cmp.Compare(a.From, b.From) })
		for _, a := range ps.asides {
			sp.Asides = append(sp.Asides, StreamPlan{Partition: ps.p, Stream: a.Stream, From: a.From, State: a.State})
		}
	}
	for i := range sp.Asides {
		for _, e := range entries {
			if e.Partition == sp.Asides[i].Partition && wire.StreamKey(e.Subject) == sp.Asides[i].Stream {
				sp.Asides[i].Head = e.HeadEventID
			}
		}
	}
	return nil
}

// deadLetterSeqs maps the subscription's dead letters' event ids to their
// events stream sequences (Jsbridge-Dlq-Stream-Seq: the old engine names
// an ordered dead letter by its events stream sequence).
func (r *reading) deadLetterSeqs(ctx context.Context, sub string) (map[string]uint64, error) {
	out := map[string]uint64{}
	letters, err := r.dlq.List(ctx, sub)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, dl := range letters {
		out[dl.EventID] = max(out[dl.EventID], dl.StreamSeq)
	}
	return out, nil
}

// records builds the partition records from the ordered subscriptions'
// partitions: each subscription a member from its floor with its own
// entries, the record's floor the lowest of theirs (with no ordered
// subscription, the lowest unordered floor, so the readers do not start
// from the beginning of the events stream for nobody).
func (r *reading) records(parts []*partitionState) {
	if len(parts) == 0 && len(r.plan.Cursors) == 0 {
		return
	}
	recs := make([]position.Record, r.cfg.Partitions)
	set := make([]bool, r.cfg.Partitions)     // the floor is set
	ordered := make([]bool, r.cfg.Partitions) // by an ordered subscription
	for _, ps := range parts {
		rec := &recs[ps.p]
		if !set[ps.p] || ps.floor < rec.Floor {
			rec.Floor = ps.floor
		}
		set[ps.p], ordered[ps.p] = true, true
		if rec.Members == nil {
			rec.Members, rec.Ahead = map[string]uint64{}, map[string]map[string]position.Entry{}
		}
		rec.Members[ps.sub] = ps.floor
		own := map[string]position.Entry{}
		for k, e := range ps.entries {
			if e.Seq > ps.floor {
				own[k] = e
			}
		}
		if len(own) > 0 {
			rec.Ahead[ps.sub] = own
		}
		rec.Asides = append(rec.Asides, ps.asides...)
		rec.Retries = append(rec.Retries, ps.retries...)
	}
	for _, c := range r.plan.Cursors {
		if !ordered[c.Partition] && (!set[c.Partition] || c.Cursor.Floor < recs[c.Partition].Floor) {
			recs[c.Partition].Floor = c.Cursor.Floor
			set[c.Partition] = true
		}
	}
	for i := range recs {
		if len(recs[i].Ahead) == 0 {
			recs[i].Ahead = nil
		}
	}
	r.plan.Records = recs
}

// attempts carries the subscription's failed-attempt counts
// (legacy.AttemptsKey: a failing head's failed POSTs, across owners) into
// retries entries: each names its event by id, which is looked for among
// the events its partition consumer delivered above the floor (the head
// was pending there). A count whose event is not found there is not
// carried: that event starts its attempts again.
func (r *reading) attempts(ctx context.Context, sp *SubscriptionPlan, parts []*partitionState) error {
	entries, err := legacy.ParkEntries(ctx, r.park, legacy.AttemptsToken+"."+sp.Name+".*")
	if err != nil || len(entries) == 0 {
		return err
	}
	counts := map[string]uint64{} // by event id
	for _, e := range entries {
		k := e.Key()
		id, err := hex.DecodeString(k[strings.LastIndexByte(k, '.')+1:])
		n, perr := strconv.ParseUint(string(e.Value()), 10, 64)
		if err != nil || perr != nil {
			sp.Notes = append(sp.Notes, fmt.Sprintf("the failed-attempt count %q (%q) cannot be read: not carried", k, e.Value()))
			continue
		}
		counts[string(id)] = n
	}
	for _, ps := range parts {
		if len(counts) == 0 {
			break
		}
		msgs, err := legacy.ListTaken(ctx, r.copy.Stream, ps.filters, ps.copyFloor+1, ps.copyDelivered)
		if err != nil {
			return err
		}
		for _, t := range msgs {
			m, err := r.copy.Msg(ctx, t.Seq)
			if err != nil {
				return err
			}
			if m == nil {
				continue
			}
			n, ok := counts[m.Header.Get(wire.HeaderMsgID)]
			if !ok {
				continue
			}
			origin, err := r.copy.Origin(m)
			if err != nil {
				return err
			}
			ps.retries = append(ps.retries, position.Retry{Sub: sp.Name, Seq: origin, Attempts: n})
			delete(counts, m.Header.Get(wire.HeaderMsgID))
		}
	}
	if sp.Attempts = len(counts); sp.Attempts > 0 {
		sp.Notes = append(sp.Notes, fmt.Sprintf("%d failed-attempt counts name no event pending above a floor: not carried, those events start their attempts again", sp.Attempts))
	}
	return nil
}
