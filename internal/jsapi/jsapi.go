// Package jsapi spells the JetStream API subjects of the requests nats.go
// has no call for (a direct get in batches, a message get from the stream
// leader), for a JetStream context's domain or API prefix, and holds the
// JetStream plumbing several rooms share (KeyValue: open or create a
// bucket; Keys: list its keys; ReadAll: read a stream on a filter).
package jsapi

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Subject is the JetStream API subject ending in suffix (such as
// "STREAM.MSG.GET.<stream>" or "DIRECT.GET.<stream>") for js's API
// prefix or domain: "$JS.<domain>.API.<suffix>" with a domain,
// "<prefix>.<suffix>" with an API prefix (a trailing dot added when
// missing), "$JS.API.<suffix>" otherwise. For the requests nats.go has no
// call for (a direct get in batches, a message get from the stream
// leader).
func Subject(js jetstream.JetStream, suffix string) string {
	o := js.Options()
	prefix := jetstream.DefaultAPIPrefix
	switch {
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		prefix = o.APIPrefix
		if !strings.HasSuffix(prefix, ".") {
			prefix += "."
		}
	}
	return prefix + suffix
}
