package startup

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// embeddedServerName is the server name of the bridge's embedded NATS
// server (embedded.ServerName; a test keeps the two equal): the consumer
// cannot tell it apart otherwise.
const embeddedServerName = "jsbridge-embedded"

// ReplicasWarning returns the start-up warning for a binary that creates
// its JetStream streams or durable consumers with one replica (replicas 1
// or less) on a server other than the bridge's embedded one, or "" when
// there is nothing to say. serverName and cluster are the connected
// server's name and cluster name (nats.Conn's ConnectedServerName and
// ConnectedClusterName; cluster "" for a standalone server). With one
// replica a stream lives on one server: while that server is down it takes
// no writes, and its disk holds the only copy.
func ReplicasWarning(replicas int, serverName, cluster string) string {
	if replicas > 1 || serverName == embeddedServerName {
		return ""
	}
	if cluster != "" {
		return fmt.Sprintf("--stream-replicas %d on JetStream cluster %q: what this binary creates lives on one server; "+
			"while it is down it takes no events, and its disk holds the only copy; use --stream-replicas 3", replicas, cluster)
	}
	return fmt.Sprintf("--stream-replicas %d on a standalone NATS server: its disk holds the only copy of what this binary creates; "+
		"for copies that survive the loss of a server run a JetStream cluster and use --stream-replicas 3", replicas)
}

// MemoryStorageWarning returns the start-up warning for a JetStream stream
// kept in memory, or "" for file storage. holds says what the stream
// holds, for the message ("events not delivered yet", "dead letters"). A
// memory stream loses everything when its server restarts, and nothing
// puts it back: the bridge has advanced its watermarks past the events.
func MemoryStorageWarning(stream, holds string, storage jetstream.StorageType) string {
	if storage != jetstream.MemoryStorage {
		return ""
	}
	return fmt.Sprintf("JetStream stream %s uses memory storage: its %s are lost when the NATS server restarts; "+
		"recreate it with file storage (nats stream add %s --storage file ...)", stream, holds, stream)
}
