package reader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// direct reads stretches of the events stream by batched direct gets,
// for the catch-up and the cursors: the stream and configuration they
// share, nothing that changes.
type direct struct {
	js  jetstream.JetStream
	cfg Config
}

// scan is one read of the events stream forward from a sequence up to a
// target, by one subject filter ("" for every subject).
type scan struct {
	filter string
	next   uint64 // the next sequence to read
	short  int    // answers in a row that ended below the target
}

// read returns the events of sc's filter in [sc.next, to] that one
// answer held, in stream order, and moves sc.next past what the answer
// covered: to + 1 once the filter has nothing more at or below to. It may
// return no event and still have moved.
//
// Why an answer can be believed: a replica's store is a prefix of the
// leader's (it applies the stream's log in order), so an answer holding
// an event past to, from any replica, holds every event of the filter up
// to to; and an answer of a full batch says nothing of what follows it.
// Any other answer ended below to: either the filter has nothing more up
// to to, or the replica that answered lags (a follower serves direct
// gets once it is 90 % caught up: nats-server jetstream_cluster.go
// monitorStream). It is never taken for the end: after ShortReads such
// answers in a row the stream's leader is asked (readLeader), which
// alone knows.
func (d direct) read(ctx context.Context, sc *scan, to uint64) ([]Event, error) {
	if sc.next > to {
		return nil, nil
	}
	if sc.short >= d.cfg.ShortReads {
		return d.readLeader(ctx, sc, to)
	}
	msgs, err := d.batch(ctx, sc.filter, sc.next)
	if err != nil {
		return nil, err
	}
	var evs []Event
	next := sc.next
	for _, m := range msgs {
		ev, err := d.event(m)
		if err != nil {
			return nil, err // sc unmoved: read again
		}
		if ev.Seq > to {
			sc.next, sc.short = to+1, 0
			return d.events(evs), nil
		}
		if ev.Seq >= next {
			evs = append(evs, ev)
			next = ev.Seq + 1
		}
	}
	sc.next = next
	if len(msgs) == d.cfg.Batch {
		sc.short = 0
	} else {
		sc.short++
	}
	return d.events(evs), nil
}

// readLeader reads the first event of sc's filter at or after sc.next
// from the stream's leader ($JS.API.STREAM.MSG.GET with next_by_subj,
// which only the leader answers): none, or none at or below to, ends the
// scan. After an event the next short answer comes back here at once, as
// long as the replicas lag. A leader that does not answer is ErrBehind.
func (d direct) readLeader(ctx context.Context, sc *scan, to uint64) ([]Event, error) {
	filter := sc.filter
	if filter == "" {
		filter = ">"
	}
	wait, cancel := context.WithTimeout(ctx, d.cfg.ReadTimeout)
	defer cancel()
	m, found, err := jsapi.LeaderGet(wait, d.js, d.cfg.Stream, jsapi.GetRequest{Seq: sc.next, NextFor: filter})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return nil, fmt.Errorf("%w: %s: %d direct gets from %d answered below %d, and the leader: %w",
			ErrBehind, d.cfg.Stream, sc.short, sc.next, to, err)
	case !found || m.Seq > to:
		sc.next, sc.short = to+1, 0
		return nil, nil
	}
	sc.next, sc.short = m.Seq+1, d.cfg.ShortReads-1
	d.cfg.Logger.Debug("the events stream's leader answered what its replicas' direct gets did not",
		slog.String("stream", d.cfg.Stream), slog.String("filter", filter), slog.Uint64("seq", m.Seq))
	return d.events([]Event{{Seq: m.Seq, Subject: m.Subject, Partition: d.partition(m.Subject), Header: m.Header,
		Data: m.Data, Time: m.Time}}), nil
}

// events drops the events of evs whose subject is no event's (not three
// tokens after the prefix), logging them.
func (d direct) events(evs []Event) []Event {
	kept := evs[:0]
	for _, ev := range evs {
		if ev.Partition < 0 {
			d.cfg.Logger.Debug("passed over a subject of no event", slog.String("subject", ev.Subject),
				slog.Uint64("seq", ev.Seq))
			continue
		}
		kept = append(kept, ev)
	}
	return kept
}

// partition is wire.SubjectPartition of subject, -1 for a subject of no
// event.
func (d direct) partition(subject string) int {
	p, ok := wire.SubjectPartition(d.cfg.Prefix, subject, d.cfg.Partitions)
	if !ok {
		return -1
	}
	return p
}

// batch asks the events stream's direct get for up to Batch messages from
// sequence from, of subject filter or by sequence alone when filter is ""
// (jetstream_api.go JSApiMsgGetRequest, "seq", "next_by_subj" and
// "batch"; stream.go getDirectRequest loads each with LoadNextMsg; any
// replica with AllowDirect may answer), and returns the messages of the
// answer, up to its end (status 204) or a not-found (404: nothing at or
// after from on the replica that answered). An answer cut short by
// ReadTimeout returns what came.
func (d direct) batch(ctx context.Context, filter string, from uint64) ([]*nats.Msg, error) {
	nc := d.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("direct get of %s: %w", d.cfg.Stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj,omitempty"`
		Batch   int    `json:"batch"`
	}{from, filter, d.cfg.Batch})
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(jsapi.Subject(d.js, "DIRECT.GET."+d.cfg.Stream), inbox, req); err != nil {
		return nil, fmt.Errorf("direct get of %s: %w", d.cfg.Stream, err)
	}
	var out []*nats.Msg
	for {
		wait, cancel := context.WithTimeout(ctx, d.cfg.ReadTimeout)
		m, err := sub.NextMsgWithContext(wait)
		cancel()
		switch {
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			return out, nil // an answer cut short: what came is read, the rest asked again
		case errors.Is(err, nats.ErrNoResponders):
			return nil, fmt.Errorf("%w: %s", ErrNoDirectGet, d.cfg.Stream)
		case err != nil:
			return nil, fmt.Errorf("direct get of %s: %w", d.cfg.Stream, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
			out = append(out, m)
		case "204", "404":
			return out, nil
		default:
			return nil, fmt.Errorf("direct get of %s: answered %s %s", d.cfg.Stream, status, m.Header.Get("Description"))
		}
	}
}

// event is the Event of a direct get's message: the sequence, subject
// and time from the headers the server adds, which are taken off so that
// the headers are the message's own, as the live read hands them on. A
// subject of no event has Partition -1.
func (d direct) event(m *nats.Msg) (Event, error) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Event{}, fmt.Errorf("direct get of %s answered a message without a sequence: %w", d.cfg.Stream, err)
	}
	subject := m.Header.Get(jetstream.SubjectHeader)
	stored, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	h := nats.Header{}
	for k, v := range m.Header {
		switch k {
		case jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.SubjectHeader, jetstream.TimeStampHeaer,
			jetstream.LastSequenceHeader, wire.HeaderNumPending:
			continue
		}
		h[k] = v
	}
	return Event{Seq: seq, Subject: subject, Partition: d.partition(subject), Header: h, Data: m.Data, Time: stored, Envelope: new(Envelope)}, nil
}
