package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// How the storage row reads what a stream takes: on disk, as JetStream
// counts it, and per message.

// storageSizes is one stream's size: on disk and as JetStream counts it.
type storageSizes struct {
	disk, state int64
	msgs        uint64
	// blocks is the disk its message blocks (*.blk) take, last the one
	// with the highest index: the block being written.
	blocks, last int64
}

// sealed is the disk the stream would take with its last block
// compressed like the others. JetStream compresses a block once it is
// full, so the one being written is not, which overstates a compressed
// stream by up to a block (8 MiB: 15 % of the copy of 200,000 events);
// per million events, at a steady size, it is amortised. For an
// uncompressed stream it is disk. state.bytes counts each message as its
// record in a block, so the sealed blocks' share of it over their disk is
// their compression ratio.
func (s storageSizes) sealed() int64 {
	raw, packed := s.state-s.last, s.blocks-s.last
	if s.last == 0 || packed <= 0 || raw <= packed*11/10 {
		return s.disk
	}
	return s.disk - s.last + s.last*packed/raw
}

// perMillion is sealed scaled to a million events, of events stored.
func (s storageSizes) perMillion(events int) string {
	return fmt.Sprintf("%.0f MB", float64(s.sealed())*1e6/float64(events)/1e6)
}

// streamSizes reads a stream's size: its directory under the server's
// store dir (every file, in bytes) and its state.
func streamSizes(ctx context.Context, js jetstream.JetStream, dir, name string) (storageSizes, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return storageSizes{}, err
	}
	st := s.CachedInfo().State
	sz := storageSizes{state: int64(st.Bytes), msgs: st.Msgs}
	var found bool
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || d.Name() != name || filepath.Base(filepath.Dir(path)) != "streams" {
			return err
		}
		found = true
		lastIndex := -1
		return filepath.WalkDir(path, func(_ string, f fs.DirEntry, err error) error {
			if err != nil || f.IsDir() {
				return err
			}
			info, err := f.Info()
			if err != nil {
				return err
			}
			sz.disk += info.Size()
			if index, ok := strings.CutSuffix(f.Name(), ".blk"); ok {
				sz.blocks += info.Size()
				if i, err := strconv.Atoi(index); err == nil && i > lastIndex {
					lastIndex, sz.last = i, info.Size()
				}
			}
			return nil
		})
	})
	if err == nil && !found {
		err = fmt.Errorf("no directory of stream %q under %s", name, dir)
	}
	return sz, err
}

// getHeaders are the headers a direct get adds to the message it
// returns; they are not stored.
var getHeaders = map[string]bool{jetstream.StreamHeader: true, jetstream.SequenceHeader: true, jetstream.TimeStampHeaer: true,
	jetstream.SubjectHeader: true, jetstream.LastSequenceHeader: true, wire.HeaderNumPending: true}

// printMessageSizes prints what one message of stream name takes: its
// subject, headers and data, the headers by name.
func printMessageSizes(ctx context.Context, js jetstream.JetStream, name, indent string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	m, err := s.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(">"))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		fmt.Printf("bench: storage: %s%s holds no message\n", indent, name)
		return nil
	}
	if err != nil {
		return err
	}
	var hdr int
	var each []string
	for k, vs := range m.Header {
		if getHeaders[k] {
			continue
		}
		for _, v := range vs {
			hdr += len(k) + len(v) + 4 // "k: v\r\n"
			if k == wire.HeaderSourceInfo || k == nats.MsgIdHdr {
				each = append(each, fmt.Sprintf("%s %d", k, len(k)+len(v)+4))
			}
		}
	}
	fmt.Printf("bench: storage: %s%s message: subject %d bytes, headers %d (%s), data %d\n",
		indent, name, len(m.Subject), hdr, strings.Join(each, ", "), len(m.Data))
	return nil
}
