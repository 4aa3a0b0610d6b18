package deliver

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// copyMsg is an event of a stream set aside, read again from the
// partitioned copy: the head of line delivers it as a pulled one. It is
// no delivery of the partition consumer: acking it records it settled
// (after asides.settle moved the record past it), and Nak, InProgress and
// Term do nothing (the record keeps it for the next re-read).
type copyMsg struct {
	raw   *jetstream.RawStreamMsg
	md    jetstream.MsgMetadata
	acked atomic.Bool
}

func newCopyMsg(raw *jetstream.RawStreamMsg) *copyMsg {
	return &copyMsg{raw: raw, md: jetstream.MsgMetadata{
		Sequence: jetstream.SequencePair{Stream: raw.Sequence}, NumDelivered: 1, Timestamp: raw.Time,
	}}
}

// isReread reports whether m was read again from the copy (copyMsg).
func isReread(m jetstream.Msg) bool {
	_, ok := m.(*copyMsg)
	return ok
}

func (m *copyMsg) Metadata() (*jetstream.MsgMetadata, error) { md := m.md; return &md, nil }
func (m *copyMsg) Data() []byte                              { return m.raw.Data }
func (m *copyMsg) Headers() nats.Header                      { return m.raw.Header }
func (m *copyMsg) Subject() string                           { return m.raw.Subject }
func (m *copyMsg) Reply() string                             { return "" }
func (m *copyMsg) Ack() error                                { m.acked.Store(true); return nil }
func (m *copyMsg) DoubleAck(context.Context) error           { m.acked.Store(true); return nil }
func (m *copyMsg) Nak() error                                { return nil }
func (m *copyMsg) NakWithDelay(time.Duration) error          { return nil }
func (m *copyMsg) InProgress() error                         { return nil }
func (m *copyMsg) Term() error                               { return nil }
func (m *copyMsg) TermWithReason(string) error               { return nil }
