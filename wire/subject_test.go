package wire_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/wire"
)

func TestSubject(t *testing.T) {
	t.Parallel()
	cases := []struct {
		stream, name, want string
	}{
		{"order-42", "OrderPlaced", "events.order.order-42.OrderPlaced"},
		{"order", "OrderPlaced", "events.order.order.OrderPlaced"},
		{"order-42-x", "Order_Placed", "events.order.order-42-x.Order_Placed"},
		{"a.b-1", "x.y", "events.a%2Eb.a%2Eb-1.x%2Ey"},
		{"*-1", ">", "events.%2A.%2A-1.%3E"},
		{"my stream-1", "tab\there", "events.my%20stream.my%20stream-1.tab%09here"},
		{"100%-x", "%", "events.100%25.100%25-x.%25"},
		{"", "", "events.%.%.%"},
		{"-7", "E", "events.%.-7.E"},
		{"bestellung-ä", "Bestätigt", "events.bestellung.bestellung-%C3%A4.Best%C3%A4tigt"},
		{"ctl\x00\x7f-1", "\r\n", "events.ctl%00%7F.ctl%00%7F-1.%0D%0A"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			got := wire.Subject("events", tc.stream, tc.name)
			require.Equal(t, tc.want, got)
			requireValidSubject(t, got)
			stream, name, err := wire.ParseSubject("events", got)
			require.NoError(t, err)
			require.Equal(t, tc.stream, stream)
			require.Equal(t, tc.name, name)
		})
	}
}

func TestSubjectMultiTokenPrefix(t *testing.T) {
	t.Parallel()
	subj := wire.Subject("acme.prod.events", "order-1", "Placed")
	require.Equal(t, "acme.prod.events.order.order-1.Placed", subj)
	stream, name, err := wire.ParseSubject("acme.prod.events", subj)
	require.NoError(t, err)
	require.Equal(t, "order-1", stream)
	require.Equal(t, "Placed", name)
}

func TestEscapeTokenKeepsSafeBytes(t *testing.T) {
	t.Parallel()
	s := "ABCxyz019_-"
	require.Equal(t, s, wire.EscapeToken(s))
	require.Equal(t, wire.EmptyToken, wire.EscapeToken(""))
	// Every byte outside [A-Za-z0-9_-] is escaped, and comes back.
	for b := 0; b < 256; b++ {
		in := string([]byte{byte(b)})
		tok := wire.EscapeToken(in)
		if isSafe(byte(b)) {
			require.Equal(t, in, tok)
		} else {
			require.Equal(t, fmt.Sprintf("%%%02X", b), tok)
		}
		back, err := wire.UnescapeToken(tok)
		require.NoError(t, err)
		require.Equal(t, in, back)
	}
}

func TestUnescapeTokenRejectsNonCanonical(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{
		"",       // empty token is never produced
		"a.b",    // unescaped dot
		"*",      // wildcard
		">",      // wildcard
		"a b",    // whitespace
		"%2e",    // lowercase hex
		"%41",    // 'A' needs no escaping
		"%2",     // truncated
		"ab%",    // truncated
		"%%",     // not an escape
		"%G0",    // not hex
		"ä",      // raw non-ASCII
		"x%2Ey%", // truncated at end
	} {
		_, err := wire.UnescapeToken(tok)
		require.ErrorIs(t, err, wire.ErrInvalidSubject, "token %q", tok)
	}
}

func TestParseSubjectErrors(t *testing.T) {
	t.Parallel()
	for _, subj := range []string{
		"other.order.order-1.Placed",          // wrong prefix
		"events",                              // no tokens
		"events.order.order-1",                // too few tokens
		"events.order.order-1.Placed.extra",   // too many tokens
		"events.order.order-1.a%2e",           // non-canonical escape
		"events.invoice.order-1.Placed",       // category is not the stream's
		"events.order.order-1.",               // empty name token
		"eventsX.order.order-1.Placed",        // prefix not followed by a dot
		"events.order%2Dx.order%2Dx-1.Placed", // '-' never escaped
	} {
		_, _, err := wire.ParseSubject("events", subj)
		require.ErrorIs(t, err, wire.ErrInvalidSubject, "subject %q", subj)
		require.ErrorContains(t, err, subj)
	}
}

func TestFilters(t *testing.T) {
	t.Parallel()
	require.Equal(t, "events.order.>", wire.CategoryFilter("events", "order"))
	require.Equal(t, "events.a%2Eb.>", wire.CategoryFilter("events", "a.b"))
	require.Equal(t, "events.order.order-42.>", wire.StreamFilter("events", "order-42"))
	require.Equal(t, "events.*.*.OrderConfirmed", wire.NameFilter("events", "OrderConfirmed"))
	require.Equal(t, "events.*.*.%3E", wire.NameFilter("events", ">"))
}

func FuzzSubjectRoundTrip(f *testing.F) {
	for _, s := range [][2]string{
		{"order-42", "OrderPlaced"}, {"", ""}, {"a.b", "*"}, {">", " \t"},
		{"%", "%25"}, {"ä-ö", "\x00"}, {"-", "--"}, {"\xff\xfe", "x.y.z"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, stream, name string) {
		subj := wire.Subject("events", stream, name)
		requireValidSubject(t, subj)
		gotStream, gotName, err := wire.ParseSubject("events", subj)
		require.NoError(t, err)
		require.Equal(t, stream, gotStream)
		require.Equal(t, name, gotName)
		for _, s := range []string{stream, name} {
			tok := wire.EscapeToken(s)
			back, err := wire.UnescapeToken(tok)
			require.NoError(t, err)
			require.Equal(t, s, back)
		}
	})
}

// requireValidSubject checks that subj is a literal NATS subject of exactly
// the prefix plus three tokens: no empty token, no wildcard, no whitespace or
// control byte, printable ASCII only.
func requireValidSubject(t *testing.T, subj string) {
	t.Helper()
	toks := strings.Split(subj, ".")
	require.Len(t, toks, 4, "subject %q", subj)
	for _, tok := range toks {
		require.NotEmpty(t, tok, "subject %q", subj)
		require.NotEqual(t, "*", tok, "subject %q", subj)
		require.NotEqual(t, ">", tok, "subject %q", subj)
		for _, r := range tok {
			require.True(t, r < unicode.MaxASCII && r > ' ' && r != 0x7f, "subject %q has byte %q", subj, r)
			require.NotContains(t, "*>", string(r), "subject %q", subj)
		}
	}
}

func isSafe(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '_' || b == '-'
}

func BenchmarkSubject(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = wire.Subject("events", "order-42", "OrderPlaced")
		}
	})
	b.Run("escaped", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = wire.Subject("events", "bestellung-ä.1", "Bestätigt *")
		}
	})
}

func ExampleSubject() {
	fmt.Println(wire.Subject("events", "order-42", "OrderPlaced"))
	fmt.Println(wire.Subject("events", "cart-a.b", "Item Added"))
	stream, name, _ := wire.ParseSubject("events", "events.cart.cart-a%2Eb.Item%20Added")
	fmt.Printf("%q %q\n", stream, name)
	// Output:
	// events.order.order-42.OrderPlaced
	// events.cart.cart-a%2Eb.Item%20Added
	// "cart-a.b" "Item Added"
}

func TestStreamKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, "events.order.order-42", wire.StreamKey("events.order.order-42.OrderPlaced"))
	require.Equal(t, wire.StreamKey(wire.Subject("events", "order-42", "A")), wire.StreamKey(wire.Subject("events", "order-42", "B")))
	require.NotEqual(t, wire.StreamKey(wire.Subject("events", "order-4", "A.2")), wire.StreamKey(wire.Subject("events", "order-4.A", "2")))
	require.Equal(t, "plain", wire.StreamKey("plain"))
}

func TestCategory(t *testing.T) {
	t.Parallel()
	require.Equal(t, "order", wire.Category("order-42"))
	require.Equal(t, "order", wire.Category("order-42-x"))
	require.Equal(t, "cart", wire.Category("cart"))
	require.Equal(t, "", wire.Category("-x"))
}

func TestDLQSubjects(t *testing.T) {
	t.Parallel()
	orig := wire.Subject("events", "order-42", "Placed")
	require.Equal(t, "dlq.billing.events.order.order-42.Placed", wire.DLQSubject(wire.DefaultDLQPrefix, "billing", orig))
	require.Equal(t, "dlq.billing.unknown", wire.DLQSubject("dlq", "billing", ""))
	require.Equal(t, "dlq.billing.>", wire.DLQFilter("dlq", "billing"))
	require.Equal(t, "dlq.>", wire.DLQFilter("dlq", ""))
	require.Equal(t, "billing:42", wire.DLQMsgID("billing", "42"))
}

func TestValidatePrefix(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"events", "acme.prod.events"} {
		require.NoError(t, wire.ValidatePrefix(ok), ok)
	}
	for _, bad := range []string{"", "a..b", ".a", "a.", "a.*", "a.>", "a b", "a\x01"} {
		require.ErrorIs(t, wire.ValidatePrefix(bad), wire.ErrInvalidPrefix, "%q", bad)
	}
}

func TestIntersectFilters(t *testing.T) {
	for _, c := range []struct {
		a, b, want string
		ok         bool
	}{
		{"events.*.*.OrderPlaced", "events.order.order-42.*", "events.order.order-42.OrderPlaced", true},
		{"events.>", "events.order.order-42.*", "events.order.order-42.*", true},
		{"events.order.order-42.*", "events.>", "events.order.order-42.*", true},
		{"events.order.>", "events.*.order-42.*", "events.order.order-42.*", true},
		{"events.invoice.>", "events.order.order-42.*", "", false},
		{"events.*.*.OrderPlaced", "events.order.order-42.OrderShipped", "", false},
		{"events.a.b", "events.a.b", "events.a.b", true},
		{"events.a", "events.a.b", "", false},
		{"events.a.>", "events.a", "", false},
		{">", "a.*", "a.*", true},
		{"a.*.>", "a.b.>", "a.b.>", true},
	} {
		got, ok := wire.IntersectFilters(c.a, c.b)
		require.Equal(t, c.ok, ok, "%q ∩ %q", c.a, c.b)
		require.Equal(t, c.want, got, "%q ∩ %q", c.a, c.b)
	}
}
