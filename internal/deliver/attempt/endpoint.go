package attempt

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// endpoint is a subscription's parsed URL and how its POSTs are sent.
// Every attempt used to parse the URL again (http.NewRequest) and to go
// through http.Client.Do, which copies the request's headers for the
// redirects it might follow (makeHeadersCopier: a map and a slice per
// header on every request) although deliver never follows one. When the
// client adds nothing Do would add, the request goes straight to its
// transport: no cookie jar, no Client.Timeout (Subscription.Timeout bounds
// every attempt through its context anyway) and no userinfo in the URL
// (Do turns it into an Authorization header).
type endpoint struct {
	url *url.URL
	// direct is the client's transport when a POST may skip Client.Do,
	// else nil.
	direct http.RoundTripper
	// op and shown are url.Error's Op and URL, as Client.Do gives them.
	op, shown string
}

// newEndpoint parses raw (a validated Subscription.URL) for client.
func newEndpoint(raw string, client *http.Client) (endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, fmt.Errorf("URL: %w", err)
	}
	ep := endpoint{url: u, op: "Post", shown: u.String()}
	if client.Jar == nil && client.Timeout == 0 && u.User == nil {
		ep.direct = client.Transport
		if ep.direct == nil {
			ep.direct = http.DefaultTransport
		}
	}
	return ep, nil
}

// newRequest is the POST of body with hdr to the endpoint, on ctx. Its
// GetBody is nil: see Sender.post.
func (ep endpoint) newRequest(ctx context.Context, hdr http.Header, body []byte) *http.Request {
	req := &http.Request{
		Method:        http.MethodPost,
		URL:           ep.url,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        hdr,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          ep.url.Host,
	}
	if len(body) == 0 {
		req.Body = http.NoBody
	}
	return req.WithContext(ctx)
}

// do sends req with client, or straight to the endpoint's transport when
// it may. Errors are Client.Do's: a *url.Error naming the method and the
// URL, http.ErrSchemeMismatch for a plain HTTP answer to https.
func (ep endpoint) do(client *http.Client, req *http.Request) (*http.Response, error) {
	if ep.direct == nil {
		return client.Do(req)
	}
	resp, err := ep.direct.RoundTrip(req)
	if err != nil {
		if tlsErr, ok := err.(tls.RecordHeaderError); ok && string(tlsErr.RecordHeader[:]) == "HTTP/" {
			err = http.ErrSchemeMismatch
		}
		return nil, &url.Error{Op: ep.op, URL: ep.shown, Err: err}
	}
	if resp == nil {
		return nil, &url.Error{Op: ep.op, URL: ep.shown, Err: errors.New("http: the transport returned no Response and no error")}
	}
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	return resp, nil
}
