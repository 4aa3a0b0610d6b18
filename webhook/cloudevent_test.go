package webhook_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// decodeOverHTTP sends req through a real HTTP server whose handler decodes
// the CloudEvent, and returns what it decoded.
func decodeOverHTTP(t *testing.T, header http.Header, body []byte) (event.CloudEvent, error) {
	t.Helper()
	type result struct {
		ce  event.CloudEvent
		err error
	}
	got := make(chan result, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			got <- result{err: err}
			return
		}
		ce, err := webhook.DecodeCloudEvent(r, b)
		got <- result{ce, err}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	r := <-got
	return r.ce, r.err
}

func sampleCloudEvent() event.CloudEvent {
	return event.CloudEvent{
		SpecVersion:     event.SpecVersion,
		ID:              "42",
		Source:          "/jsbridge/shop",
		Type:            "OrderPlaced",
		Subject:         "order-7",
		Time:            "2026-11-22T14:00:00.123456789Z",
		DataContentType: event.ContentTypeJSON,
		StreamVersion:   3,
		CorrelationID:   "corr-1",
		CausationID:     "cause-1",
		Data:            json.RawMessage(`{"total":12.5}`),
	}
}

func TestDecodeCloudEventStructured(t *testing.T) {
	t.Parallel()
	want := sampleCloudEvent()
	body, err := json.Marshal(want)
	require.NoError(t, err)
	got, err := decodeOverHTTP(t, http.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8"}}, body)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

func TestDecodeCloudEventBinary(t *testing.T) {
	t.Parallel()
	want := sampleCloudEvent()
	want.Subject = "order 7%/ü" // needs percent-encoding on the wire
	h := http.Header{}
	h.Set(wire.HeaderSpecVersion, want.SpecVersion)
	h.Set(wire.HeaderID, want.ID)
	h.Set(wire.HeaderSource, want.Source)
	h.Set(wire.HeaderType, want.Type)
	h.Set(wire.HeaderSubject, "order%207%25/%C3%BC")
	h.Set(wire.HeaderTime, want.Time)
	h.Set(wire.HeaderStreamVersion, "3")
	h.Set(wire.HeaderCorrelationID, want.CorrelationID)
	h.Set(wire.HeaderCausationID, want.CausationID)
	h.Set(wire.HeaderContentType, event.ContentTypeJSON)
	got, err := decodeOverHTTP(t, h, want.Data)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

func TestDecodeCloudEventRejects(t *testing.T) {
	t.Parallel()
	noType := sampleCloudEvent()
	noType.Type = ""
	noTypeBody, err := json.Marshal(noType)
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		header  http.Header
		body    []byte
		notCE   bool
		message string
	}{
		"plain json":        {http.Header{"Content-Type": {"application/json"}}, []byte(`{}`), true, "no ce-specversion"},
		"batch":             {http.Header{"Content-Type": {"application/cloudevents-batch+json"}}, []byte(`[]`), true, "batch"},
		"missing attribute": {http.Header{"Content-Type": {"application/cloudevents+json"}}, noTypeBody, true, "attribute type"},
		"broken envelope":   {http.Header{"Content-Type": {"application/cloudevents+json"}}, []byte(`{"id":`), false, "structured body"},
		"bad streamversion": {http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"1"}, "Ce-Source": {"s"}, "Ce-Type": {"t"}, "Ce-Streamversion": {"three"}}, nil, false, `ce-streamversion "three"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := decodeOverHTTP(t, tc.header, tc.body)
			require.Error(t, err)
			require.Equal(t, tc.notCE, errorIsNotCE(err))
			require.Contains(t, err.Error(), tc.message)
		})
	}
}

func errorIsNotCE(err error) bool { return errors.Is(err, webhook.ErrNotCloudEvent) }
