// Package ordercopy is the consumer engine's room for the partitioned
// copy of the events stream that ordered subscriptions read
// (wire.OrderedStream): the configuration a new copy gets (StreamConfig),
// its creation or the checks of an existing one (Provision), its
// retention rules and how close a held event is to leaving it (RiskOf,
// RiskError), and Watch, which reads its lag and size. It imports nothing
// of the engine above it.
package ordercopy

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// StreamConfig is the configuration a new partitioned copy of the
// events stream (ecfg) is created with, as the consumer creates it: named
// wire.OrderedStream(ecfg.Name), sourcing it with the partition transform
// for partitions partitions, file storage, limits retention with
// retentionFactor times the events stream's MaxAge and MaxBytes (none
// for none), S2 compression (compression), AllowDirect (successor
// look-ups), and replicas replicas (0: the events stream's). The events stream's subjects must be one
// "<prefix>.>" for a prefix other than wire.DefaultEventsPrefix to be
// used. The bench measures the copy it describes.
func StreamConfig(ecfg jetstream.StreamConfig, partitions, replicas int) jetstream.StreamConfig {
	if replicas == 0 {
		replicas = ecfg.Replicas
	}
	src, dest := wire.OrderedTransform(EventsPrefix(ecfg), partitions)
	return jetstream.StreamConfig{
		Name:        wire.OrderedStream(ecfg.Name),
		Description: "jsbridge: the events of " + ecfg.Name + " with a partition token, for ordered webhook delivery",
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      copyMaxAge(ecfg.MaxAge),
		MaxBytes:    copyMaxBytes(ecfg.MaxBytes),
		Compression: compression,
		Replicas:    replicas,
		// The version chain's look-ups start with a direct get
		// (deadletter.LastVersionBefore).
		AllowDirect: true,
		Sources: []*jetstream.StreamSource{{
			Name:              ecfg.Name,
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: src, Destination: dest}},
		}},
	}
}

// compression is how the copy's file store compresses its blocks:
// S2. JetStream compresses a block once it is full (8 MiB for a limits
// stream) and counts MaxBytes and state.bytes uncompressed, so it changes
// the disk the copy takes, not what its retention keeps. With
// CloudEvents-like JSON events the copy's disk per million events fell
// from 827 MB to 247 MB (the bench's storage row; docs/ordering.md, "The
// copy's storage").
const compression = jetstream.S2Compression

// EventsPrefix is the subject prefix of the events stream ecfg: the
// prefix of its one "<prefix>.>" subject, else wire.DefaultEventsPrefix.
func EventsPrefix(ecfg jetstream.StreamConfig) string {
	if len(ecfg.Subjects) == 1 && strings.HasSuffix(ecfg.Subjects[0], ".>") {
		return strings.TrimSuffix(ecfg.Subjects[0], ".>")
	}
	return wire.DefaultEventsPrefix
}
