package jsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// GetRequest names the message a message get returns (nats-server
// jetstream_api.go JSApiMsgGetRequest): the message at Seq; the first at
// or after Seq whose subject matches NextFor (wildcards allowed); or the
// last whose subject matches LastFor.
type GetRequest struct {
	// Seq is a stream sequence: the message's own, or where NextFor
	// starts (0: the first).
	Seq uint64 `json:"seq,omitempty"`
	// NextFor is a subject filter: the first matching message at or
	// after Seq.
	NextFor string `json:"next_by_subj,omitempty"`
	// LastFor is a subject filter: the last matching message.
	LastFor string `json:"last_by_subj,omitempty"`
}

// Msg is a stored message as a message get returns it.
type Msg struct {
	// Subject is the subject it was stored under.
	Subject string
	// Seq is its stream sequence.
	Seq uint64
	// Header holds its headers as published (nil when none).
	Header nats.Header
	// Data is its body.
	Data []byte
	// Time is when the stream stored it.
	Time time.Time
}

// LeaderGet asks the leader of JetStream stream name for the message req
// names, by the message get API ($JS.API.STREAM.MSG.GET.<name>), which in
// a cluster only the stream's leader answers. A direct get may be
// answered by any replica, and nats-server 2.15 lets a follower serve
// them once it is 90 % caught up, so a follower lacking the newest
// messages answers an older one, or none; nats.go's Stream.GetMsg and
// GetLastMsgForSubject take a direct get whenever the stream has
// AllowDirect. found is false when no message matches (JetStream error
// 10037). A JetStream error is returned as a *jetstream.APIError (so
// errors.Is(err, jetstream.ErrStreamNotFound) holds for a missing
// stream); no leader (an election, a missing stream) gives nats.go's
// request error, such as nats.ErrNoResponders or ctx's.
func LeaderGet(ctx context.Context, js jetstream.JetStream, name string, req GetRequest) (m Msg, found bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Msg{}, false, err
	}
	answer, err := js.Conn().RequestWithContext(ctx, Subject(js, "STREAM.MSG.GET."+name), body)
	if err != nil {
		return Msg{}, false, fmt.Errorf("message get from the leader of %s: %w", name, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	switch err := json.Unmarshal(answer.Data, &resp); {
	case err != nil:
		return Msg{}, false, fmt.Errorf("message get from the leader of %s: answered %q: %w", name, answer.Data, err)
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return Msg{}, false, nil
	case resp.Error != nil:
		return Msg{}, false, fmt.Errorf("message get from the leader of %s: %w", name, resp.Error)
	case resp.Message == nil:
		return Msg{}, false, fmt.Errorf("message get from the leader of %s: answered %q: no message", name, answer.Data)
	}
	m = Msg{Subject: resp.Message.Subject, Seq: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return Msg{}, false, fmt.Errorf("message get from the leader of %s: message %d's headers: %w", name, m.Seq, err)
		}
	}
	return m, true, nil
}
