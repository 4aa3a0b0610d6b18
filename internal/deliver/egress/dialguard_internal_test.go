package egress

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestForbiddenAddr(t *testing.T) {
	t.Parallel()
	for addr, forbidden := range map[string]bool{
		"127.0.0.1":              true,
		"127.1.2.3":              true,
		"::1":                    true,
		"10.0.0.1":               true,
		"172.16.5.4":             true,
		"192.168.1.1":            true,
		"169.254.169.254":        true, // cloud metadata
		"100.100.100.200":        true, // Alibaba metadata, shared space
		"fd00:ec2::254":          true, // AWS metadata over IPv6
		"fe80::1":                true,
		"0.0.0.0":                true,
		"::":                     true,
		"::ffff:127.0.0.1":       true, // IPv4-mapped
		"::ffff:169.254.169.254": true,
		"64:ff9b::a9fe:a9fe":     true, // NAT64 of 169.254.169.254
		"224.0.0.1":              true,
		"255.255.255.255":        true,
		"8.8.8.8":                false,
		"93.184.216.34":          false,
		"2606:4700:4700::1111":   false,
		"64:ff9b::808:808":       false, // NAT64 of 8.8.8.8
		"::ffff:1.1.1.1":         false,
	} {
		got := forbiddenAddr(netip.MustParseAddr(addr)) != ""
		require.Equal(t, forbidden, got, "%s", addr)
	}
}

func TestCheckDialAddress(t *testing.T) {
	t.Parallel()
	err := checkDialAddress("tcp", "169.254.169.254:80", nil)
	require.True(t, errors.Is(err, ErrForbiddenAddress), "%v", err)
	require.ErrorContains(t, err, "169.254.169.254 is link-local")
	require.NoError(t, checkDialAddress("tcp6", "[2606:4700:4700::1111]:443", nil))
}
