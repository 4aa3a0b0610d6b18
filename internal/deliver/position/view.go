package position

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/nats-io/nats.go/jetstream"
)

// Stored is one partition as the positions bucket holds it, read without
// claiming it: what `consumer status` shows of the shared engine, since
// the record's binary encoding is not readable with `nats kv get`.
type Stored struct {
	// Partition is N of pos.p<N>.
	Partition int `json:"partition"`
	// Revision and Updated are the record key's last write (0 and zero
	// when the partition has cursor keys and no record).
	Revision uint64    `json:"revision"`
	Updated  time.Time `json:"updated"`
	// Record is the decoded record (the zero Record when there is none).
	Record Record `json:"record"`
	// Cursors are the partition's cursor keys by subscription.
	Cursors map[string]Cursor `json:"cursors,omitempty"`
}

// ReadAll reads every partition record (pos.p<N>, with the members key
// it names) and cursor key (cur.<subscription>.p<N>) of the positions
// bucket kv, in partition order; other keys are passed over. It claims and writes nothing, and
// reads what the bucket's replica answering it holds, so a record being
// committed may show a commit behind. An empty bucket gives none.
// Errors: ErrCorrupt (wrapped, naming the key), and the bucket's.
func ReadAll(ctx context.Context, kv jetstream.KeyValue) ([]Stored, error) {
	keys, err := jsapi.Keys(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("position: %w", err)
	}
	byPartition := map[int]*Stored{}
	at := func(p int) *Stored {
		s := byPartition[p]
		if s == nil {
			s = &Stored{Partition: p}
			byPartition[p] = s
		}
		return s
	}
	for _, key := range keys {
		sub, p, ok := parseKey(key)
		if !ok {
			continue
		}
		if sub == "" {
			rec, e, err := readRecord(ctx, kv, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				continue // deleted since the listing
			case err != nil:
				return nil, err
			}
			s := at(p)
			s.Record, s.Revision, s.Updated = rec, e.Revision(), e.Created()
			continue
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("position: read %q of bucket %q: %w", key, kv.Bucket(), err)
		}
		s := at(p)
		c, err := record.DecodeCursor(e.Value())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if s.Cursors == nil {
			s.Cursors = map[string]Cursor{}
		}
		s.Cursors[sub] = c
	}
	out := make([]Stored, 0, len(byPartition))
	for _, s := range byPartition {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Stored) int { return cmp.Compare(a.Partition, b.Partition) })
	return out, ctx.Err()
}

// parseKey reads a record key ("pos.p<N>": sub "") or a cursor key
// ("cur.<sub>.p<N>") of the bucket.
func parseKey(key string) (sub string, p int, ok bool) {
	tokens := strings.Split(key, ".")
	switch {
	case len(tokens) == 2 && tokens[0] == "pos":
	case len(tokens) == 3 && tokens[0] == "cur" && tokens[1] != "":
		sub = tokens[1]
	default:
		return "", 0, false
	}
	n, found := strings.CutPrefix(tokens[len(tokens)-1], "p")
	if !found {
		return "", 0, false
	}
	p, err := strconv.Atoi(n)
	if err != nil || p < 0 {
		return "", 0, false
	}
	return sub, p, true
}

// readRecord reads record key and the members key it names, if any. A
// members key gone between the two reads was replaced by a commit since:
// the record is read again (three tries). Errors: jetstream.ErrKeyNotFound
// (unwrapped) when the record is not there, ErrCorrupt (wrapped, naming
// the key), and the bucket's.
func readRecord(ctx context.Context, kv jetstream.KeyValue, key string) (Record, jetstream.KeyValueEntry, error) {
	var err error
	for range 3 {
		var e jetstream.KeyValueEntry
		if e, err = kv.Get(ctx, key); err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return Record{}, nil, err
			}
			return Record{}, nil, fmt.Errorf("position: read %q of bucket %q: %w", key, kv.Bucket(), err)
		}
		rec, ref, derr := record.DecodeRecordRef(e.Value())
		if derr != nil {
			return Record{}, nil, fmt.Errorf("%s: %w", key, derr)
		}
		if ref.Key == "" {
			return rec, e, nil
		}
		var m jetstream.KeyValueEntry
		m, err = kv.Get(ctx, ref.Key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			err = fmt.Errorf("%s: %w: %w: %q", key, ErrCorrupt, errMembersGone, ref.Key)
			continue
		}
		if err != nil {
			return Record{}, nil, fmt.Errorf("position: read %q of bucket %q: %w", ref.Key, kv.Bucket(), err)
		}
		base, derr := record.DecodeMembers(ref.Key, m.Value())
		if derr == nil {
			derr = record.WithBase(&rec, ref, base)
		}
		if derr != nil {
			return Record{}, nil, fmt.Errorf("%s: %w", key, derr)
		}
		return rec, e, nil
	}
	return Record{}, nil, err
}
