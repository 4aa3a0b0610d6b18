package nextengine

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"
)

// partLabel is the profiler label naming the part of this process a
// goroutine works for: a node ("n1" … "n3", set by startCluster), the
// publisher, a replica's client ("replica-a" …). A goroutine inherits
// its creator's labels, so a node's connections (client and route read
// and write loops) carry its name. But nats-server replaces the labels
// of the goroutines it starts with tags of its own (server.go
// startGoRoutine → setGoroutineLabels: "type", "account", "stream", …,
// no server name) for its Raft groups, streams and consumers: their
// samples go under serverPart, the servers' but no node's. What carries
// no label at all is the runtime's own (the garbage collector's
// background workers, the scheduler) and callbacks of time.AfterFunc.
const partLabel = "part"

// serverPart is cpuByPart's key for samples without partLabel but with
// labels of nats-server's own.
const serverPart = "servers, no node"

// cpuProfile runs f under a CPU profile of the process and returns the
// CPU time of each part (by partLabel, "" for goroutines without it) and
// of the whole process (getrusage) over the same time.
// When NEXTENGINE_PROFILES names a directory, the profile is also
// written there as name.pprof (go tool pprof -tagfocus part=n1 …).
func cpuProfile(name string, f func()) (parts map[string]time.Duration, process time.Duration, err error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return nil, 0, fmt.Errorf("cpu profile: %w", err)
	}
	c0 := cpu()
	f()
	pprof.StopCPUProfile()
	process = cpu() - c0
	if dir := os.Getenv("NEXTENGINE_PROFILES"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name+".pprof"), buf.Bytes(), 0o644); err != nil {
			return nil, 0, fmt.Errorf("cpu profile: %w", err)
		}
	}
	parts, err = cpuByPart(buf.Bytes(), partLabel)
	return parts, process, err
}

// cpuByPart sums the CPU time of a runtime/pprof CPU profile (gzipped
// profile.proto: samples with values [count, nanoseconds] and labels,
// strings by index into a table) by the value of label key; samples
// without it go under serverPart when they carry other labels, "" when
// they carry none.
func cpuByPart(prof []byte, key string) (map[string]time.Duration, error) {
	zr, err := gzip.NewReader(bytes.NewReader(prof))
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	type sample struct {
		values []int64
		labels [][2]uint64 // key, value: string table indexes
	}
	var samples []sample
	var strs []string
	err = pbFields(raw, func(field, wt int, v uint64, data []byte) error {
		switch field {
		case 2: // Profile.sample
			var s sample
			err := pbFields(data, func(field, wt int, v uint64, data []byte) error {
				switch field {
				case 2: // Sample.value, packed or not
					if wt != 2 {
						s.values = append(s.values, int64(v))
						return nil
					}
					return pbPacked(data, func(x uint64) { s.values = append(s.values, int64(x)) })
				case 3: // Sample.label
					var l [2]uint64
					err := pbFields(data, func(field, _ int, v uint64, _ []byte) error {
						if field == 1 || field == 2 { // Label.key, Label.str
							l[field-1] = v
						}
						return nil
					})
					s.labels = append(s.labels, l)
					return err
				}
				return nil
			})
			samples = append(samples, s)
			return err
		case 6: // Profile.string_table
			strs = append(strs, string(data))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	out := map[string]time.Duration{}
	for _, s := range samples {
		if len(s.values) < 2 {
			continue // not a CPU profile's [count, nanoseconds]
		}
		part := ""
		if len(s.labels) > 0 {
			part = serverPart
		}
		for _, l := range s.labels {
			if l[0] < uint64(len(strs)) && strs[l[0]] == key && l[1] < uint64(len(strs)) {
				part = strs[l[1]]
			}
		}
		out[part] += time.Duration(s.values[1])
	}
	return out, nil
}

var errProtobuf = errors.New("malformed protobuf")

// pbFields calls fn for each field of the protobuf message b, in order:
// its number, its wire type, and its value (varint and fixed-size types)
// or its bytes (length-delimited).
func pbFields(b []byte, fn func(field, wireType int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errProtobuf
		}
		b = b[n:]
		field, wt := int(tag>>3), int(tag&7)
		var v uint64
		var data []byte
		switch wt {
		case 0:
			if v, n = binary.Uvarint(b); n <= 0 {
				return errProtobuf
			}
			b = b[n:]
		case 1:
			if len(b) < 8 {
				return errProtobuf
			}
			v, b = binary.LittleEndian.Uint64(b), b[8:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return errProtobuf
			}
			data, b = b[n:n+int(l)], b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return errProtobuf
			}
			v, b = uint64(binary.LittleEndian.Uint32(b)), b[4:]
		default:
			return fmt.Errorf("%w: wire type %d", errProtobuf, wt)
		}
		if err := fn(field, wt, v, data); err != nil {
			return err
		}
	}
	return nil
}

// pbPacked calls fn for each varint of a packed repeated field.
func pbPacked(b []byte, fn func(uint64)) error {
	for len(b) > 0 {
		x, n := binary.Uvarint(b)
		if n <= 0 {
			return errProtobuf
		}
		fn(x)
		b = b[n:]
	}
	return nil
}

// TestCPUByPartSplitsByLabel checks the profile reader the experiments
// use: two goroutines spinning under two labels show up under their own
// names, each with about its share.
func TestCPUByPartSplitsByLabel(t *testing.T) {
	experiment(t)
	spin := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
	}
	parts, process, err := cpuProfile("labels", func() {
		done := make(chan struct{}, 2)
		for _, name := range []string{"x", "y"} {
			pprof.Do(t.Context(), pprof.Labels(partLabel, name), func(context.Context) {
				go func() {
					spin(300 * time.Millisecond)
					done <- struct{}{}
				}()
			})
		}
		<-done
		<-done
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("parts %v, process %v", parts, process)
	// On a loaded machine the spinners get what the scheduler gives them:
	// each label must show, and the two must hold most of the samples.
	var all time.Duration
	for _, d := range parts {
		all += d
	}
	if parts["x"] == 0 || parts["y"] == 0 || parts["x"]+parts["y"] < all/2 {
		t.Fatalf("labels not seen: %v", parts)
	}
}
