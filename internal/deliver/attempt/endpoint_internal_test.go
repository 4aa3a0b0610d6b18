package attempt

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A POST straight to the transport sends what Client.Do sends (method,
// URL, query, headers, body, length), and a request the client would
// change (userinfo: an Authorization header; a cookie jar; a
// Client.Timeout) still goes through Client.Do.
func TestEndpointSendsWhatClientDoSends(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, uri, auth, hdr, body string
		length                       int64
	}
	got := make(chan seen, 1)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Header.Get("Authorization"), r.Header.Get("X-Test"), string(b), r.ContentLength}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	u, err := url.Parse(rc.URL)
	require.NoError(t, err)
	withUser := u.Scheme + "://alice:secret@" + u.Host + "/hook?x=1"

	for _, c := range []struct {
		name   string
		url    string
		client *http.Client
		direct bool
		auth   string
	}{
		{"plain", rc.URL + "/hook?x=1", &http.Client{}, true, ""},
		{"userinfo", withUser, &http.Client{}, false, "Basic YWxpY2U6c2VjcmV0"},
		{"jar", rc.URL + "/hook?x=1", &http.Client{Jar: jar}, false, ""},
		{"client timeout", rc.URL + "/hook?x=1", &http.Client{Timeout: time.Minute}, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep, err := newEndpoint(c.url, c.client)
			require.NoError(t, err)
			require.Equal(t, c.direct, ep.direct != nil, "straight to the transport")
			for _, body := range []string{`{"a":1}`, ""} {
				req := ep.newRequest(context.Background(), http.Header{"X-Test": {"yes"}}, []byte(body))
				resp, err := ep.do(c.client, req)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				require.Equal(t, http.StatusNoContent, resp.StatusCode)
				require.Equal(t, seen{http.MethodPost, "/hook?x=1", c.auth, "yes", body, int64(len(body))}, <-got)
			}
		})
	}
}

// A transport error reads as Client.Do's: a *url.Error naming the method
// and the URL, whose cause errors.Is finds.
func TestEndpointErrorIsClientDos(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens: connection refused
	raw := "http://" + addr + "/hook"
	client := &http.Client{}
	ep, err := newEndpoint(raw, client)
	require.NoError(t, err)
	require.NotNil(t, ep.direct)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, viaDo := client.Do(ep.newRequest(ctx, http.Header{}, []byte("{}")))
	_, direct := ep.do(client, ep.newRequest(ctx, http.Header{}, []byte("{}")))
	require.Error(t, direct)
	require.Equal(t, viaDo.Error(), direct.Error())
	var ue *url.Error
	require.True(t, errors.As(direct, &ue))
	require.True(t, errors.Is(direct, context.Canceled))

	_, direct = ep.do(client, ep.newRequest(context.Background(), http.Header{}, []byte("{}")))
	require.ErrorContains(t, direct, `Post "`+raw+`": dial tcp `+addr)
}
