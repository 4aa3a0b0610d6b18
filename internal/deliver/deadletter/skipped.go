package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// The version chain (Jsbridge-Previous-Version, docs/ordering.md) names
// on each ordered webhook the version of its stream the subscription
// delivered before it. A dead-lettered version was not delivered: the
// stream's next event must name the dead-lettered one's own predecessor,
// unless the dead letter is replayed first. The engine records each
// dead-lettered version of an ordered subscription with the predecessor
// it carried (RecordSkipped) before it settles the original; Replay forgets
// it once the endpoint accepted it (ForgetSkipped), before the stream is
// unparked; skip and unpark leave it. Whoever owns the stream then, on
// whichever replica, steps over it (Skipped.Previous).

// NoPrevious is a SkippedVersion's Previous when the subscription had
// delivered no version of the stream before it (Jsbridge-Previous-Version
// "none").
const NoPrevious int64 = -1

// maxSkipped is how many skipped versions a stream's record keeps, the
// newest: only the latest few are ever stepped over (an older one is
// behind a version delivered since).
const maxSkipped = 32

// Skipped is the KV record (wire.SkippedKey, in the positions bucket) of the versions of
// one stream an ordered subscription dead-lettered and has not delivered
// since, oldest first, at most 32.
type Skipped struct {
	Versions []SkippedVersion `json:"versions"`
}

// SkippedVersion is one dead-lettered version and the predecessor its
// webhook carried (NoPrevious: none).
type SkippedVersion struct {
	Version  int64 `json:"version"`
	Previous int64 `json:"previous"`
}

// Previous returns the predecessor to name after version v of the stream
// was the last one before an event: v itself when v was not skipped,
// else the predecessor v carried (which was delivered, or NoPrevious).
func (s Skipped) Previous(v int64) int64 {
	for range len(s.Versions) + 1 { // a chain of skips, never a cycle
		i := slices.IndexFunc(s.Versions, func(sv SkippedVersion) bool { return sv.Version == v })
		if i < 0 || v == NoPrevious {
			return v
		}
		v = s.Versions[i].Previous
	}
	return v
}

// ReadSkipped returns the skipped versions of the stream with stream key
// streamKey (wire.StreamKey of its events-stream subject) of
// subscription, from the bucket kv; none when it has no record.
func ReadSkipped(ctx context.Context, kv jetstream.KeyValue, subscription, streamKey string) (Skipped, error) {
	s, _, err := readSkipped(ctx, kv, wire.SkippedKey(subscription, streamKey))
	return s, err
}

func readSkipped(ctx context.Context, kv jetstream.KeyValue, key string) (Skipped, uint64, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Skipped{}, 0, nil
	}
	if err != nil {
		return Skipped{}, 0, fmt.Errorf("deadletter: read skipped versions %q: %w", key, err)
	}
	var s Skipped
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return Skipped{}, 0, fmt.Errorf("deadletter: skipped versions %q: %w", key, err)
	}
	return s, e.Revision(), nil
}

// RecordSkipped records in the bucket kv that version (whose webhook
// carried previous, NoPrevious for none) of the stream with stream key
// streamKey was dead-lettered by subscription and not delivered. Recording
// it twice keeps one entry.
func RecordSkipped(ctx context.Context, kv jetstream.KeyValue, subscription, streamKey string, version, previous int64) error {
	return updateSkipped(ctx, kv, wire.SkippedKey(subscription, streamKey), func(s *Skipped) bool {
		s.Versions = slices.DeleteFunc(s.Versions, func(sv SkippedVersion) bool { return sv.Version == version })
		s.Versions = append(s.Versions, SkippedVersion{Version: version, Previous: previous})
		if n := len(s.Versions); n > maxSkipped {
			s.Versions = s.Versions[n-maxSkipped:]
		}
		return true
	})
}

// ForgetSkipped removes version of the stream with stream key streamKey
// from subscription's skipped versions in the bucket kv: it was
// delivered after all (a replayed dead letter). Nothing to remove is no
// error.
func ForgetSkipped(ctx context.Context, kv jetstream.KeyValue, subscription, streamKey string, version int64) error {
	return updateSkipped(ctx, kv, wire.SkippedKey(subscription, streamKey), func(s *Skipped) bool {
		n := len(s.Versions)
		s.Versions = slices.DeleteFunc(s.Versions, func(sv SkippedVersion) bool { return sv.Version == version })
		return len(s.Versions) != n
	})
}

// updateSkipped applies change to the record at key (compare and set,
// retried while another writer wins); change returns false when it
// changed nothing. An emptied record is deleted.
func updateSkipped(ctx context.Context, kv jetstream.KeyValue, key string, change func(*Skipped) bool) error {
	for tries := 0; ; tries++ {
		s, rev, err := readSkipped(ctx, kv, key)
		if err != nil {
			return err
		}
		if !change(&s) {
			return nil
		}
		switch {
		case len(s.Versions) == 0 && rev != 0:
			err = kv.Delete(ctx, key, jetstream.LastRevision(rev))
		case len(s.Versions) == 0:
			return nil
		default:
			v, merr := json.Marshal(s)
			if merr != nil {
				return merr
			}
			if rev == 0 {
				_, err = kv.Create(ctx, key, v)
			} else {
				_, err = kv.Update(ctx, key, v, rev)
			}
		}
		if err == nil {
			return nil
		}
		if tries >= 5 || !isConflict(err) {
			return fmt.Errorf("deadletter: write skipped versions %q: %w", key, err)
		}
	}
}

// isConflict reports whether a KV write lost a compare and set.
func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}
