package egress

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// NoRedirects returns a copy of c (or of the default client when c is nil)
// that returns 3xx responses instead of following them.
func NoRedirects(c *http.Client) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	} else {
		out.Transport = defaultTransport()
	}
	out.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &out
}

// Guarded returns a copy of c whose transport refuses forbidden
// addresses at dial time and uses no proxy (a proxy would dial the
// endpoint itself, past the check).
func Guarded(c *http.Client) (*http.Client, error) {
	t, err := transportOf(c, "the private-address check cannot be installed (set AllowPrivate to use it as is)")
	if err != nil {
		return nil, err
	}
	t.Proxy = nil
	t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second, Control: checkDialAddress}).DialContext
	t.DialTLSContext = nil
	t.Dial = nil //nolint:staticcheck // cleared so DialContext is used
	t.DialTLS = nil
	out := *c
	out.Transport = t
	return &out, nil
}

// transportOf returns a clone of c's transport (nil: of
// http.DefaultTransport), or an error saying what cannot be done when it
// is not an *http.Transport.
func transportOf(c *http.Client, what string) (*http.Transport, error) {
	switch t := c.Transport.(type) {
	case nil:
		return http.DefaultTransport.(*http.Transport).Clone(), nil
	case *http.Transport:
		return t.Clone(), nil
	}
	return nil, fmt.Errorf("Config.HTTPClient.Transport is a %T, not an *http.Transport: %s", c.Transport, what)
}
