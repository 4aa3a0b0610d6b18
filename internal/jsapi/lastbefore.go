package jsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LastBefore returns the sequence and headers of the last message of
// JetStream stream name whose subject matches one of subjects, among
// sequences from (0: the first) to before-1, as the stream's leader has
// it (seq 0: none).
//
// Finding the last message before a sequence takes a direct get
// (multi_last with up_to_seq, nats-server 2.11+; the stream needs
// AllowDirect), and any replica may answer a direct get: in nats-server
// 2.15 a follower serves them once it is 90 % caught up, and a follower
// lacking the newest messages answers an older predecessor, or none. The
// leader's message get API ($JS.API.STREAM.MSG.GET, which only the
// leader answers) has no "last before" (last_by_subj takes no upper
// bound), but it has "first after": so the direct get's answer is a
// candidate, and the leader is asked for the first matching message
// after it (LeaderFirstAfter). None before `before` confirms it; one
// before takes its place and is confirmed in turn. One request more per
// look-up (per subject) when the candidate is right, one per message the
// answering follower lacked when not. Without a deadline on ctx, the
// look-up is bounded by 5 s.
func LastBefore(ctx context.Context, js jetstream.JetStream, name string, subjects []string, from, before uint64) (uint64, nats.Header, error) {
	if len(subjects) == 0 || before <= 1 || before <= from {
		return 0, nil, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	seq, hdr, err := DirectLastBefore(ctx, js, name, subjects, from, before)
	if err != nil {
		return 0, nil, err
	}
	for {
		next, nh, err := LeaderFirstAfter(ctx, js, name, subjects, max(seq+1, from))
		if err != nil {
			return 0, nil, fmt.Errorf("message get from the leader of %s: %w", name, err)
		}
		if next == 0 || next >= before {
			return seq, hdr, nil
		}
		seq, hdr = next, nh // the direct get's replica lacked it
	}
}

// DirectLastBefore returns the sequence and headers of the last message
// of JetStream stream name whose subject matches one of subjects, among
// sequences from (0: the first) to before-1, as the replica answering a
// direct get has it (seq 0: none): a candidate LastBefore confirms.
func DirectLastBefore(ctx context.Context, js jetstream.JetStream, name string, subjects []string, from, before uint64) (uint64, nats.Header, error) {
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Seq       uint64   `json:"seq,omitempty"`
		UpToSeq   uint64   `json:"up_to_seq"`
	}{subjects, from, before - 1})
	if err != nil {
		return 0, nil, err
	}
	nc := js.Conn()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, nil, fmt.Errorf("direct get from %s: %w", name, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(DirectGetSubject(js, name), inbox, req); err != nil {
		return 0, nil, fmt.Errorf("direct get from %s: %w", name, err)
	}
	var last *nats.Msg
	var lastSeq uint64
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return 0, nil, fmt.Errorf("direct get from %s: %w", name, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // end of the batch
			if last == nil {
				return 0, nil, nil
			}
			return lastSeq, last.Header, nil
		case "404":
			return 0, nil, nil
		default:
			return 0, nil, fmt.Errorf("direct get from %s: answered %s %s", name, status, m.Header.Get("Description"))
		}
		if len(m.Data) == 0 && m.Header == nil {
			return 0, nil, fmt.Errorf("direct get from %s: empty answer (no JetStream?)", name)
		}
		seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if last == nil || seq > lastSeq {
			last, lastSeq = m, seq
		}
	}
}

// LeaderFirstAfter returns the sequence and headers of the first message
// of JetStream stream name at or after sequence from whose subject
// matches one of subjects, read from the stream's leader (seq 0: none).
// It asks the message get API, $JS.API.STREAM.MSG.GET.<name> with
// next_by_subj, which in a cluster only the stream's leader answers,
// never a direct get (nats.go's Stream.GetMsg takes a direct get when the
// stream allows them, and any replica 90 % caught up may answer that).
func LeaderFirstAfter(ctx context.Context, js jetstream.JetStream, name string, subjects []string, from uint64) (uint64, nats.Header, error) {
	var first uint64
	var hdr nats.Header
	for _, subj := range subjects {
		req, err := json.Marshal(struct {
			Seq     uint64 `json:"seq,omitempty"`
			NextFor string `json:"next_by_subj"`
		}{from, subj})
		if err != nil {
			return 0, nil, err
		}
		m, err := js.Conn().RequestWithContext(ctx, Subject(js, "STREAM.MSG.GET."+name), req)
		if err != nil {
			return 0, nil, err
		}
		var resp struct {
			Error *struct {
				Code        int    `json:"code"`
				ErrCode     int    `json:"err_code"`
				Description string `json:"description"`
			} `json:"error"`
			Message *struct {
				Seq    uint64 `json:"seq"`
				Header []byte `json:"hdrs"`
			} `json:"message"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return 0, nil, fmt.Errorf("message get answered %q: %w", m.Data, err)
		}
		switch {
		case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
			continue
		case resp.Error != nil:
			return 0, nil, fmt.Errorf("message get answered %d %s", resp.Error.Code, resp.Error.Description)
		case resp.Message == nil:
			return 0, nil, fmt.Errorf("message get answered %q: no message", m.Data)
		}
		if first != 0 && resp.Message.Seq >= first {
			continue
		}
		h := nats.Header{}
		if len(resp.Message.Header) > 0 {
			if h, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
				return 0, nil, fmt.Errorf("message get answered bad headers: %w", err)
			}
		}
		first, hdr = resp.Message.Seq, h
	}
	return first, hdr, nil
}

// DirectGetSubject is the direct get API subject of JetStream stream name
// for js's API prefix or domain.
func DirectGetSubject(js jetstream.JetStream, name string) string {
	return Subject(js, "DIRECT.GET."+name)
}
