package egress

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// ErrForbiddenAddress is returned (wrapped) when an endpoint resolves to an
// address a subscription without AllowPrivate may not reach: loopback,
// private (RFC 1918, RFC 4193), shared (RFC 6598), link-local (which
// includes the cloud metadata address 169.254.169.254), unspecified,
// multicast or otherwise reserved. The check runs on the address actually
// dialled (net.Dialer.Control), after DNS resolution, so a name that
// resolves (or re-resolves, DNS rebinding) to such an address is refused
// too. A delivery refused this way is a permanent failure: it is
// dead-lettered at once and no request is sent.
var ErrForbiddenAddress = errors.New("endpoint address not allowed (a subscription with AllowPrivate may reach it)")

// forbiddenPrefixes are the ranges netip's predicates do not cover.
var forbiddenPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),         // "this network" (RFC 791)
	netip.MustParsePrefix("100.64.0.0/10"),     // shared address space, CGNAT; Alibaba metadata 100.100.100.200 (RFC 6598)
	netip.MustParsePrefix("192.0.0.0/24"),      // IETF protocol assignments (RFC 6890)
	netip.MustParsePrefix("198.18.0.0/15"),     // benchmarking (RFC 2544)
	netip.MustParsePrefix("240.0.0.0/4"),       // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),      // NAT64 (RFC 6052): checked by its embedded IPv4 address below
	netip.MustParsePrefix("64:ff9b:1::/48"),    // local-use NAT64 (RFC 8215)
	netip.MustParsePrefix("2001:db8::/32"),     // documentation
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS metadata over IPv6 (inside fc00::/7 too)
}

// forbiddenAddr reports why addr may not be dialled without AllowPrivate,
// or "" when it may.
func forbiddenAddr(addr netip.Addr) string {
	addr = addr.Unmap()
	switch {
	case addr.IsLoopback():
		return "loopback"
	case addr.IsPrivate():
		return "private"
	case addr.IsLinkLocalUnicast():
		return "link-local (cloud metadata)"
	case addr.IsLinkLocalMulticast(), addr.IsInterfaceLocalMulticast(), addr.IsMulticast():
		return "multicast"
	case addr.IsUnspecified():
		return "unspecified"
	}
	if addr.Is6() && netip.MustParsePrefix("64:ff9b::/96").Contains(addr) {
		b := addr.As16()
		if why := forbiddenAddr(netip.AddrFrom4([4]byte(b[12:16]))); why != "" {
			return why + " via NAT64"
		}
		return ""
	}
	for _, p := range forbiddenPrefixes {
		if p.Contains(addr) {
			return "reserved"
		}
	}
	return ""
}

// checkDialAddress is a net.Dialer Control hook: it refuses a connection to
// a forbidden address before the connect system call.
func checkDialAddress(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse dialled address %q", ErrForbiddenAddress, address)
	}
	if why := forbiddenAddr(ap.Addr()); why != "" {
		return fmt.Errorf("%w: %s is %s", ErrForbiddenAddress, ap.Addr(), why)
	}
	return nil
}

// CheckLiteralHost refuses, at start, a URL host that is a forbidden IP
// literal; names are checked when dialled.
func CheckLiteralHost(host string) error {
	addr, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		return nil
	}
	if why := forbiddenAddr(addr); why != "" {
		return fmt.Errorf("%s is %s", addr, why)
	}
	return nil
}

// Idle connections the webhook transport keeps for reuse. Many
// subscriptions often point at one receiver host, each with its own
// POSTs in flight: with fewer kept (64 per host), most were closed after
// their POST and dialled again (21 % of the consumer's CPU with 1,000
// subscriptions on one receiver). An idle one costs a few KB and closes
// after IdleConnTimeout (90 s).
const (
	idleConnsPerHost = 1024
	idleConns        = 4096
)

// defaultTransport is the webhook transport: keep-alive, connect and TLS
// handshake timeouts. It uses no proxy: a proxy would dial the endpoint
// itself, past the address check.
func defaultTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          idleConns,
		MaxIdleConnsPerHost:   idleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}
