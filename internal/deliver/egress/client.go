package egress

import (
	"fmt"
	"net/http"
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
// addresses at dial time.
func Guarded(c *http.Client) (*http.Client, error) {
	out := *c
	switch t := c.Transport.(type) {
	case nil:
		out.Transport = guarded(http.DefaultTransport.(*http.Transport))
	case *http.Transport:
		out.Transport = guarded(t)
	default:
		return nil, fmt.Errorf("Config.HTTPClient.Transport is a %T, not an *http.Transport: the private-address check cannot be installed (set AllowPrivate to use it as is)", t)
	}
	return &out, nil
}
