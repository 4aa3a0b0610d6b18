package startup

import "fmt"

// ReplicasWarning returns the start-up warning for a binary that creates
// its JetStream streams with one replica (replicas 1 or less) on a server
// that is not its own embedded one, or "" when there is nothing to say.
// cluster is the connected server's cluster name (nats.Conn's
// ConnectedClusterName; "" for a standalone server). With one replica a
// stream lives on one server: while that server is down the stream takes
// no writes, and its disk holds the only copy.
func ReplicasWarning(replicas int, embedded bool, cluster string) string {
	if replicas > 1 || embedded {
		return ""
	}
	if cluster != "" {
		return fmt.Sprintf("--replicas %d on JetStream cluster %q: the streams created live on one server; "+
			"while it is down they take no events, and its disk holds their only copy; use --replicas 3", replicas, cluster)
	}
	return fmt.Sprintf("--replicas %d on a standalone NATS server: its disk holds the only copy of the streams created; "+
		"for copies that survive the loss of a server run a JetStream cluster and use --replicas 3", replicas)
}
