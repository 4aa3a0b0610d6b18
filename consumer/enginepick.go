package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/migrate"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// EnginePick is the engine EngineAuto runs on a server, and why.
type EnginePick struct {
	// Engine is EngineShared or EngineDurables.
	Engine string `json:"engine"`
	// Reason says what on the server decided it, in a sentence.
	Reason string `json:"reason"`
	// Unmoved is true when the server holds a deployment of the durables
	// engine not yet moved (Engine is then EngineDurables): its layout
	// and no migrated key in the positions bucket, or an events stream
	// without AllowDirect. `consumer migrate` moves it
	// (docs/operations.md, "Moving to shared readers").
	Unmoved bool `json:"unmoved,omitempty"`
}

// PickEngine returns the engine a consumer with Config.Engine EngineAuto
// runs on js for the events stream stream (default DefaultStream):
// EngineShared, unless the server shows a deployment of the durables
// engine not yet moved (EnginePick.Unmoved): the events stream without
// AllowDirect, or the durables engine's layout (the partitioned copy, a
// subscription's durable consumer on stream) with no "migrated" key in
// the jsbridge_positions bucket. Then EngineDurables.
//
// Every replica of one deployment picks the same engine, since the rule
// reads only the server: the layout, AllowDirect and the migrated key
// change only under `consumer migrate` (which turns AllowDirect on, then
// writes the key, and runs with every replica of the durables engine
// stopped) and its cleanup (which deletes the layout once the shared
// engine ran, the key staying). A deployment's first replicas, on an
// empty server, all pick shared, which creates no layout of the other.
// Replicas of an earlier version, whose default was durables, do not
// follow the rule: beside them, on a server with no layout yet, pin
// the engine (docs/operations.md, "Which engine runs").
//
// Errors: the events stream missing (wrapping
// jetstream.ErrStreamNotFound: a caller waits for the bridge to create
// it) and the server's.
func PickEngine(ctx context.Context, js jetstream.JetStream, stream string) (EnginePick, error) {
	stream = or(stream, DefaultStream)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return EnginePick{}, fmt.Errorf("consumer: JetStream stream %q: %w", stream, err)
	}
	old, err := oldLayout(ctx, js, stream)
	if err != nil {
		return EnginePick{}, err
	}
	migrated := false
	if old != "" {
		if migrated, err = isMigrated(ctx, js); err != nil {
			return EnginePick{}, err
		}
	}
	switch {
	case old != "" && !migrated:
		return EnginePick{Engine: EngineDurables, Unmoved: true,
			Reason: fmt.Sprintf("%s and the %s bucket has no %q key: the durables engine runs until `consumer migrate` moves it", old, position.DefaultBucket, migrate.DoneKey)}, nil
	case !s.CachedInfo().Config.AllowDirect:
		return EnginePick{Engine: EngineDurables, Unmoved: true,
			Reason: fmt.Sprintf("the events stream %s does not allow direct gets (AllowDirect): the durables engine runs until `consumer migrate` (or `nats stream edit %s --allow-direct`) turns it on", stream, stream)}, nil
	case old != "":
		return EnginePick{Engine: EngineShared, Reason: fmt.Sprintf("%s, and `consumer migrate` moved it (the %s bucket's %q key)", old, position.DefaultBucket, migrate.DoneKey)}, nil
	}
	return EnginePick{Engine: EngineShared, Reason: "no layout of the durables engine on the server"}, nil
}

// oldLayout names what of the durables engine's layout is on the server
// for the events stream ("" when nothing): the partitioned copy, or the
// subscriptions migrate.Discover finds (their durable consumers).
func oldLayout(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	copyName := wire.OrderedStream(stream)
	switch _, err := js.Stream(ctx, copyName); {
	case err == nil:
		return fmt.Sprintf("the partitioned copy %s exists", copyName), nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return "", fmt.Errorf("consumer: JetStream stream %q: %w", copyName, err)
	}
	subs, err := migrate.Discover(ctx, js, stream)
	if err != nil {
		return "", fmt.Errorf("consumer: %w", err)
	}
	if len(subs) > 0 {
		return fmt.Sprintf("the durable consumer %q of %s exists (%d subscriptions of the durables engine)", subs[0].Name, stream, len(subs)), nil
	}
	return "", nil
}

// isMigrated reports whether the positions bucket holds migrate.DoneKey.
func isMigrated(ctx context.Context, js jetstream.JetStream) (bool, error) {
	kv, err := js.KeyValue(ctx, position.DefaultBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("consumer: positions bucket %s: %w", position.DefaultBucket, err)
	}
	switch _, err := kv.Get(ctx, migrate.DoneKey); {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("consumer: positions bucket %s: %w", position.DefaultBucket, err)
	}
	return true, nil
}
