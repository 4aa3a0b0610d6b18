package pull

import "github.com/nats-io/nats.go/jetstream"

// parsedMsg is a pulled message whose metadata is parsed once.
type parsedMsg struct {
	jetstream.Msg
	md  *jetstream.MsgMetadata
	err error
}

// ParsedOnce returns m with its metadata (parsed from its reply subject,
// which allocates) parsed now, once: a delivery asks for it several times
// per message (its attempt number, its stream and delivery sequences, the
// attempt's record). Metadata on the result returns what was parsed; the
// caller must not change it.
func ParsedOnce(m jetstream.Msg) jetstream.Msg {
	md, err := m.Metadata()
	return &parsedMsg{Msg: m, md: md, err: err}
}

// Metadata returns the metadata parsed when the message was pulled.
func (m *parsedMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, m.err }
