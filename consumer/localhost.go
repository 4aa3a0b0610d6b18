package consumer

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// checkLocalhost refuses, when s is loaded, a URL whose host is
// "localhost" or a name under ".localhost" (any case, with or without the
// final dot) unless AllowPrivate is set: RFC 6761 reserves those names
// for loopback, so every delivery would be refused when dialled and
// dead-lettered. (IP literals in the forbidden ranges are refused by the
// engine's Validate; other names are checked when dialled, after DNS.)
// The error wraps ErrForbiddenAddress and names the subscription, the
// field and the value; the callers add ErrInvalidConfig.
func (s Subscription) checkLocalhost() error {
	if s.AllowPrivate {
		return nil
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		return nil // the engine's Validate reports it
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host != "localhost" && !strings.HasSuffix(host, ".localhost") {
		return nil
	}
	return fmt.Errorf("%w %q: URL: %q: %w: %s is loopback (a localhost name, RFC 6761)",
		subscription.ErrInvalidSubscription, s.Name, breaker.Endpoint(s.URL), ErrForbiddenAddress, u.Hostname())
}
