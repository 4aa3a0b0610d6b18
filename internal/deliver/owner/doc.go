// Package owner is what a consumer replica runs to own partitions: its
// membership heartbeat, the rendezvous share of the partitions among the
// live replicas (Share), a lease per partition (KV Create, renewed every
// TTL/4 with Update on its revision, released by Delete), an epoch per
// claim that only grows (Epochs), and the lease fence a sender asks
// before each POST (Fence). The members and the leases are read from one
// long-lived watch of the lease bucket (MemberView). The shared engine
// (docs/design/next-engine.md, D3) runs one Owner per replica, for every
// partition and every subscription together.
package owner
