package jsapi

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// ReadAll reads every message of stream s on filter, oldest first, with
// an ordered consumer, until fn returns false or none is left; it reads
// nothing when the stream holds none on filter. Errors are nats.go's,
// unwrapped: the caller names the stream's role.
func ReadAll(ctx context.Context, s jetstream.Stream, filter string, fn func(*jetstream.MsgMetadata, jetstream.Msg) bool) error {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil || len(info.State.Subjects) == 0 {
		return err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return err
	}
	for {
		m, err := oc.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if !fn(md, m) || md.NumPending == 0 {
			return nil
		}
	}
}
