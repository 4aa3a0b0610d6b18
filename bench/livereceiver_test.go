package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// The receiver counts a signed CloudEvent once per subscription, and
// refuses a bad signature.
func TestLiveReceiverVerifiesAndCounts(t *testing.T) {
	secret, err := webhook.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	lr, err := newLiveReceiver(secret, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(lr.mux())
	defer srv.Close()
	signer, err := webhook.NewSigner(webhook.SchemeStandard, secret)
	if err != nil {
		t.Fatal(err)
	}
	body := liveData(time.Now())
	post := func(sign bool) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hook/ordered", bytes.NewReader(body))
		for k, v := range map[string]string{wire.HeaderSpecVersion: "1.0", wire.HeaderID: "42", wire.HeaderSource: "test", wire.HeaderType: "LiveEvent", wire.HeaderTime: time.Now().Format(time.RFC3339Nano)} {
			req.Header.Set(k, v)
		}
		req.Header.Set(wire.HeaderContentType, "application/json")
		if sign {
			signer.Sign(req.Header, "42", time.Now(), body)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(true); got != http.StatusNoContent {
		t.Fatalf("signed POST: status %d, want 204", got)
	}
	if got := post(true); got != http.StatusNoContent {
		t.Fatalf("second signed POST: status %d, want 204", got)
	}
	if got := post(false); got != http.StatusUnauthorized {
		t.Fatalf("unsigned POST: status %d, want 401", got)
	}
	if lr.count("ordered") != 1 || lr.count("bare") != 0 || lr.rejected.Load() != 1 {
		t.Fatalf("counts: ordered %d, bare %d, rejected %d; want 1, 0, 1", lr.count("ordered"), lr.count("bare"), lr.rejected.Load())
	}
}

// The total counts distinct (subscription, event) pairs over every
// subscription, and the subscriptions with one, until a reset.
func TestLiveReceiverTotalCountsPairs(t *testing.T) {
	secret, err := webhook.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	lr, err := newLiveReceiver(secret, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(lr.mux())
	defer srv.Close()
	signer, err := webhook.NewSigner(webhook.SchemeStandard, secret)
	if err != nil {
		t.Fatal(err)
	}
	post := func(sub, id string) {
		body := liveData(time.Now())
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hook/"+sub, bytes.NewReader(body))
		for k, v := range map[string]string{wire.HeaderSpecVersion: "1.0", wire.HeaderID: id, wire.HeaderSource: "test", wire.HeaderType: "LiveEvent", wire.HeaderTime: time.Now().Format(time.RFC3339Nano)} {
			req.Header.Set(k, v)
		}
		req.Header.Set(wire.HeaderContentType, "application/json")
		signer.Sign(req.Header, id, time.Now(), body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("POST %s %s: status %d", sub, id, resp.StatusCode)
		}
	}
	post("a", "1")
	post("a", "1") // a retry: the same pair
	post("a", "2")
	post("b", "1")
	resp, err := http.Get(srv.URL + liveTotalPath)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "3 2" {
		t.Fatalf("total %q, want \"3 2\"", b)
	}
	resp, err = http.Post(srv.URL+liveResetPath, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if lr.pairs != 0 || len(lr.receipts) != 0 {
		t.Fatalf("after a reset: %d pairs, %d subscriptions", lr.pairs, len(lr.receipts))
	}
}
