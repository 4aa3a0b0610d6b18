package subscription

import (
	"fmt"
	"net/http"

	"github.com/jsbridge/jsbridge/internal/deliver/egress"
)

// Client returns the HTTP client of subscription s: open (no
// redirects) as it is with AllowPrivate; without it, the guarded copy of
// open, made once in *safe and shared; with TLS files, a client of its
// own (its TLS settings and connection pool), guarded on top unless
// AllowPrivate (the guard keeps TLSClientConfig). Errors: the TLS files
// (wrapping ErrInvalidSubscription) and the guard's.
func Client(open *http.Client, safe **http.Client, s Subscription) (*http.Client, error) {
	tlsCfg, err := s.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalidSubscription, s.Name, err)
	}
	switch {
	case tlsCfg != nil:
		client, err := egress.WithTLS(open, tlsCfg)
		if err == nil && !s.AllowPrivate {
			client, err = egress.Guarded(client)
		}
		if err != nil {
			return nil, fmt.Errorf("subscription %q: %w", s.Name, err)
		}
		return client, nil
	case !s.AllowPrivate:
		if *safe == nil {
			g, err := egress.Guarded(open)
			if err != nil {
				return nil, fmt.Errorf("subscription %q: %w", s.Name, err)
			}
			*safe = g
		}
		return *safe, nil
	}
	return open, nil
}
