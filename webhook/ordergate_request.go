package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/wire"
)

// orderRequest is what the order gate reads from one request.
type orderRequest struct {
	source, stream string
	version        int64
	// previous is the chain's previous version (wire.HeaderPreviousVersion,
	// -1 for none); hasPrevious is false for a sender before the chain,
	// which the gate holds to last+1.
	previous    int64
	hasPrevious bool
	// owner is true when a partition's owner sent the request (partition
	// and epoch present); replay paths send neither.
	owner     bool
	epoch     uint64
	partition int // -1 unless owner
}

// fields returns the request's ordering fields as the sender signs them.
func (req orderRequest) fields() OrderFields {
	f := OrderFields{Stream: req.stream, Version: req.version, Previous: req.previous, Partition: -1}
	if !req.hasPrevious {
		f.Previous = -1
	}
	if req.owner {
		f.Partition, f.Epoch = req.partition, req.epoch
	}
	return f
}

// hasOrderHeaders reports whether h carries any ordering header: the
// chain's previous version, the partition or the lease epoch.
func hasOrderHeaders(h http.Header) bool {
	return h.Get(wire.HeaderPreviousVersion) != "" || h.Get(wire.HeaderPartition) != "" || h.Get(wire.HeaderLeaseEpoch) != ""
}

// isStructured reports whether the request is a structured-mode CloudEvent.
func isStructured(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get(wire.HeaderContentType))
	return err == nil && mt == event.ContentTypeCloudEventsJSON
}

// parseOrderRequest reads the ordering headers (the previous version; the
// partition and epoch, both or neither), and the source, stream and version
// from the ce-* headers (binary mode) or body (structured mode). Every
// error names the header or attribute and the value.
func parseOrderRequest(h http.Header, body []byte) (orderRequest, error) {
	req := orderRequest{previous: -1, partition: -1}
	if prev := h.Get(wire.HeaderPreviousVersion); prev != "" {
		v, err := wire.ParsePreviousVersion(prev)
		if err != nil {
			return req, err
		}
		req.previous, req.hasPrevious = v, true
	}
	p, e := h.Get(wire.HeaderPartition), h.Get(wire.HeaderLeaseEpoch)
	switch {
	case p == "" && e == "":
	case p == "":
		return req, fmt.Errorf("missing %s header (%s is %q)", wire.HeaderPartition, wire.HeaderLeaseEpoch, e)
	case e == "":
		return req, fmt.Errorf("missing %s header (%s is %q)", wire.HeaderLeaseEpoch, wire.HeaderPartition, p)
	default:
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return req, fmt.Errorf("bad %s %q: want a partition number >= 0", wire.HeaderPartition, p)
		}
		if req.epoch, err = strconv.ParseUint(e, 10, 64); err != nil {
			return req, fmt.Errorf("bad %s %q: want an unsigned 64-bit integer", wire.HeaderLeaseEpoch, e)
		}
		req.partition, req.owner = n, true
	}
	var err error
	if isStructured(h) {
		err = req.readEnvelope(body)
	} else {
		err = req.readHeaders(h)
	}
	if err != nil {
		return req, err
	}
	if req.version < 0 {
		return req, fmt.Errorf("bad streamversion %d: want >= 0", req.version)
	}
	if req.hasPrevious && req.previous >= req.version {
		return req, fmt.Errorf("bad %s %d: not below the stream version %d", wire.HeaderPreviousVersion, req.previous, req.version)
	}
	return req, nil
}

// readEnvelope reads source, subject and streamversion from a structured
// body.
func (req *orderRequest) readEnvelope(body []byte) error {
	var env struct {
		Source        *string         `json:"source"`
		Subject       *string         `json:"subject"`
		StreamVersion json.RawMessage `json:"streamversion"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("bad structured body: %v", err)
	}
	switch {
	case env.Source == nil || *env.Source == "":
		return errors.New(`missing attribute "source" in the structured body`)
	case env.Subject == nil || *env.Subject == "":
		return errors.New(`missing attribute "subject" in the structured body: the stream id`)
	case env.StreamVersion == nil:
		return errors.New(`missing attribute "streamversion" in the structured body`)
	}
	req.source, req.stream = *env.Source, *env.Subject
	v, err := strconv.ParseInt(string(env.StreamVersion), 10, 64)
	if err != nil {
		return fmt.Errorf("bad attribute \"streamversion\" %s: want an integer", env.StreamVersion)
	}
	req.version = v
	return nil
}

// readHeaders reads source, subject and streamversion from the ce-*
// headers of a binary-mode request.
func (req *orderRequest) readHeaders(h http.Header) error {
	req.source = headerValue(h, wire.HeaderSource)
	req.stream = headerValue(h, wire.HeaderSubject)
	v := h.Get(wire.HeaderStreamVersion)
	switch {
	case req.source == "":
		return fmt.Errorf("missing %s header", wire.HeaderSource)
	case req.stream == "":
		return fmt.Errorf("missing %s header: the stream id", wire.HeaderSubject)
	case v == "":
		return fmt.Errorf("missing %s header", wire.HeaderStreamVersion)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("bad %s %q: want an integer", wire.HeaderStreamVersion, v)
	}
	req.version = n
	return nil
}

// orderWriter passes a gated handler's answer through, recording the
// stream's new position (commit) when the status is 2xx, before the status
// reaches the sender: a sender that sees 2xx for v may send v+1 at once,
// and must find v recorded. If commit fails, the sender gets 500
// "order-store" instead and the handler's body is dropped.
type orderWriter struct {
	http.ResponseWriter
	commit func() error
	wrote  bool
	err    error // commit's failure
}

func (w *orderWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code >= 100 && code <= 199 {
		w.ResponseWriter.WriteHeader(code) // informational: the answer is still to come
		return
	}
	w.wrote = true
	if code >= 200 && code <= 299 {
		if w.err = w.commit(); w.err != nil {
			http.Error(w.ResponseWriter, "order-store", http.StatusInternalServerError)
			return
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *orderWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return len(b), nil // the 500 is out; the handler's body is dropped
	}
	return w.ResponseWriter.Write(b)
}

// Flush sends the status first (recording a 2xx), then flushes, so a
// handler that flushes before writing a status cannot send an unrecorded
// 200.
func (w *orderWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok && w.err == nil {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *orderWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish answers the implicit 200 of a handler that wrote nothing, so that
// it is recorded first too.
func (w *orderWriter) finish() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
}
