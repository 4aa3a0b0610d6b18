package inspect

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// TraceConfig says where TraceEvent looks. Zero fields take the defaults
// of the streams they name.
type TraceConfig struct {
	// Stream and Prefix are the events stream and its subject prefix.
	// Defaults "EVENTS", "events".
	Stream, Prefix string
	// DLQStream and DLQPrefix are the dead-letter stream and its prefix.
	// Defaults "DLQ", "dlq".
	DLQStream, DLQPrefix string
	// AttemptsStream and AttemptsPrefix are the attempts stream and its
	// prefix. Defaults "JSBRIDGE_ATTEMPTS", "attempts".
	AttemptsStream, AttemptsPrefix string
	// SourceStream, when set, is the event's source stream (e.g.
	// "order-42"): when no attempt record says where the event is on the
	// events stream, its subjects are scanned for the event's Nats-Msg-Id.
	SourceStream string
}

// EventMessage is the event's message on the events stream.
type EventMessage struct {
	// Sequence and Subject locate it; PublishedAt is when JetStream stored it.
	Sequence    uint64    `json:"sequence"`
	Subject     string    `json:"subject"`
	PublishedAt time.Time `json:"published_at"`
	// Name, SourceStream and Version are ce-type, ce-subject and
	// ce-streamversion (decoded).
	Name         string `json:"name"`
	SourceStream string `json:"stream"`
	Version      int64  `json:"version"`
	// TraceParent is the message's traceparent header, "" when none.
	TraceParent string `json:"traceparent,omitempty"`
}

// EventTrace is everything JetStream holds about one event's deliveries.
type EventTrace struct {
	EventID string `json:"event_id"`
	// Message is the event on the events stream; nil when it was not found
	// (no attempt names it and no SourceStream was given, or it is gone:
	// the events stream's limits, a purge).
	Message *EventMessage `json:"message,omitempty"`
	// Attempts are the attempt records, by subscription, then attempt
	// number, then time. Records older than the attempts stream's max age
	// are gone; a success on the first attempt has none under
	// attemptlog.ModeFailures (Deliveries says it was settled).
	Attempts []attemptlog.Attempt `json:"attempts"`
	// DeadLetters are the event's dead letters (of any subscription).
	DeadLetters []deadletter.Stored `json:"dead_letters"`
	// Deliveries say where the event stands for each subscription whose
	// filter matches it, from the positions bucket, by subscription:
	// what tells an event delivered by a 2xx on its first attempt (no
	// attempt record under attemptlog.ModeFailures) from one never
	// delivered. Empty when Message is nil (the event was not found).
	Deliveries []Delivery `json:"deliveries"`
}

// TraceEvent collects what JetStream holds about event eventID: its
// attempt records (an ordered consumer on the attempts stream filtered to
// <prefix>.*.<event id>, which the stream's subject index serves without
// reading other events' records), its message on the events stream (by the
// sequence an attempt record names, else by scanning cfg.SourceStream's
// subjects), and its dead letters (filtered by the event's subject when
// known), and, once the message is found, where it stands for each
// subscription (see Delivery). A stream that does not exist contributes
// nothing; other errors are returned, wrapped.
func TraceEvent(ctx context.Context, js jetstream.JetStream, eventID string, cfg TraceConfig) (EventTrace, error) {
	cfg = cfg.withDefaults()
	t := EventTrace{EventID: eventID, Attempts: []attemptlog.Attempt{}, DeadLetters: []deadletter.Stored{}, Deliveries: []Delivery{}}
	err := readAll(ctx, js, cfg.AttemptsStream, wire.AttemptFilter(cfg.AttemptsPrefix, eventID), func(_ *jetstream.MsgMetadata, m jetstream.Msg) bool {
		var a attemptlog.Attempt
		if json.Unmarshal(m.Data(), &a) == nil && a.EventID == eventID {
			t.Attempts = append(t.Attempts, a)
		}
		return true
	})
	if err != nil {
		return t, err
	}
	slices.SortStableFunc(t.Attempts, func(a, b attemptlog.Attempt) int {
		return cmp.Or(strings.Compare(a.Subscription, b.Subscription), cmp.Compare(a.Attempt, b.Attempt), a.At.Compare(b.At))
	})

	for _, a := range t.Attempts {
		if a.StreamSeq == 0 {
			continue
		}
		if t.Message, err = eventAt(ctx, js, cfg.Stream, a.StreamSeq, eventID); err != nil {
			return t, err
		}
		if t.Message != nil {
			break
		}
	}
	if t.Message == nil && cfg.SourceStream != "" {
		err := readAll(ctx, js, cfg.Stream, wire.StreamFilter(cfg.Prefix, cfg.SourceStream), func(md *jetstream.MsgMetadata, m jetstream.Msg) bool {
			if m.Headers().Get(wire.HeaderMsgID) != eventID {
				return true
			}
			t.Message = eventMessage(md.Sequence.Stream, m.Subject(), md.Timestamp, m.Headers())
			return false
		})
		if err != nil {
			return t, err
		}
	}

	filter := wire.DLQFilter(cfg.DLQPrefix, "")
	if t.Message != nil {
		filter = wire.DLQSubject(cfg.DLQPrefix, "*", t.Message.Subject)
		d, err := deliveries(ctx, js, cfg, *t.Message)
		if err != nil {
			return t, err
		}
		t.Deliveries = append(t.Deliveries, d...)
	}
	err = readAll(ctx, js, cfg.DLQStream, filter, func(md *jetstream.MsgMetadata, m jetstream.Msg) bool {
		if m.Headers().Get(wire.HeaderDLQEventID) == eventID {
			t.DeadLetters = append(t.DeadLetters, deadletter.ParseStored(md.Sequence.Stream, md.Timestamp, m.Headers(), m.Data()))
		}
		return true
	})
	return t, err
}

func (c TraceConfig) withDefaults() TraceConfig {
	c.Stream = cmp.Or(c.Stream, wire.DefaultEventsStream)
	c.Prefix = cmp.Or(c.Prefix, wire.DefaultEventsPrefix)
	c.DLQStream = cmp.Or(c.DLQStream, wire.DefaultDLQStream)
	c.DLQPrefix = cmp.Or(c.DLQPrefix, wire.DefaultDLQPrefix)
	c.AttemptsStream = cmp.Or(c.AttemptsStream, wire.DefaultAttemptsStream)
	c.AttemptsPrefix = cmp.Or(c.AttemptsPrefix, wire.DefaultAttemptsPrefix)
	return c
}

// eventAt returns the message at seq of the events stream when its
// Nats-Msg-Id is eventID, nil when it is not (or gone).
func eventAt(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, eventID string) (*EventMessage, error) {
	// From the stream's leader: a direct get (nats.go's GetMsg when the
	// stream has AllowDirect) may be answered by a follower that has not
	// stored the event yet.
	m, ok, err := jsapi.LeaderGet(ctx, js, stream, jsapi.GetRequest{Seq: seq})
	if errors.Is(err, jetstream.ErrStreamNotFound) || (err == nil && !ok) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: get message %d of JetStream stream %q: %w", seq, stream, err)
	}
	if m.Header.Get(wire.HeaderMsgID) != eventID {
		return nil, nil
	}
	return eventMessage(m.Seq, m.Subject, m.Time, m.Header), nil
}

func eventMessage(seq uint64, subject string, at time.Time, h nats.Header) *EventMessage {
	dec := func(k string) string {
		v, err := wire.DecodeHeaderValue(h.Get(k))
		if err != nil {
			return h.Get(k)
		}
		return v
	}
	e := &EventMessage{Sequence: seq, Subject: subject, PublishedAt: at.UTC(), Name: dec(wire.HeaderType), SourceStream: dec(wire.HeaderSubject),
		TraceParent: h.Get(wire.HeaderTraceParent)}
	e.Version, _ = strconv.ParseInt(h.Get(wire.HeaderStreamVersion), 10, 64)
	return e
}

// readAll is jsapi.ReadAll of stream on filter; a stream that does not
// exist holds nothing.
func readAll(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func(*jetstream.MsgMetadata, jetstream.Msg) bool) error {
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect: trace: JetStream stream %q: %w", stream, err)
	}
	if err := jsapi.ReadAll(ctx, s, filter, fn); err != nil {
		return fmt.Errorf("inspect: trace: read JetStream stream %q (%s): %w", stream, filter, err)
	}
	return nil
}
