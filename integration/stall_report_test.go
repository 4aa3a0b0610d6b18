package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/event"
)

// stallReportLines bounds a stall report: a soak's failure message must
// stay readable beside the consumers' output.
const stallReportLines = 100

// stallReport is what a stalled ordered receiver's failure prints first:
// one line per partition of the positions bucket (its record's owner,
// epoch, floor, streams set aside, retries and cursors), then one line
// per stream the receiver stopped short in (its last processed version
// beside head, the stream's last version), at most stallReportLines
// lines in all. What it cannot read it says in a line.
func stallReport(t *testing.T, js jetstream.JetStream, pool *pgxpool.Pool, schema string, rc *orderedReceiver, streams int, head int64) string {
	t.Helper()
	var lines []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lines = append(lines, partitionRecordLines(ctx, js)...)
	short, err := shortStreams(ctx, pool, schema, rc, streams, head)
	if err != nil {
		lines = append(lines, fmt.Sprintf("receiver: reading the event versions failed: %v", err))
	}
	lines = append(lines, fmt.Sprintf("receiver %s: %d of %d streams stopped short of version %d:", rc.name, len(short), streams, head))
	lines = append(lines, short...)
	if len(lines) > stallReportLines {
		lines = append(lines[:stallReportLines-1], fmt.Sprintf("… %d lines more", len(lines)-stallReportLines+1))
	}
	return strings.Join(lines, "\n")
}

// partitionRecordLines reads the positions bucket's partitions, one line
// each, in partition order.
func partitionRecordLines(ctx context.Context, js jetstream.JetStream) []string {
	parts, err := consumer.ReadSharedPositions(ctx, js)
	if err != nil {
		return []string{fmt.Sprintf("partition records: reading the positions bucket failed: %v", err)}
	}
	lines := make([]string, 0, len(parts))
	for _, p := range parts {
		r := p.Record
		lines = append(lines, fmt.Sprintf("p%d: owner=%s epoch=%d floor=%d streams=%d asides=%d retries=%d cursors=%d updated %v ago",
			p.Partition, r.Owner, r.Epoch, r.Floor, len(r.Streams), len(r.Asides), len(r.Retries), len(p.Cursors), time.Since(p.Updated).Round(time.Second)))
	}
	return lines
}

// shortStreams lists the streams order-0 … order-(streams-1) whose last
// version rc processed is below head, one line each ("order-7: last 41,
// head 63 (partition 3)"; last -1: none processed), in stream order.
func shortStreams(ctx context.Context, pool *pgxpool.Pool, schema string, rc *orderedReceiver, streams int, head int64) ([]string, error) {
	rows, err := pool.Query(ctx, "SELECT id, stream, version FROM "+schema+".events")
	if err != nil {
		return nil, err
	}
	versions := map[string]streamVersion{}
	for rows.Next() {
		var id int64
		var sv streamVersion
		if err := rows.Scan(&id, &sv.stream, &sv.version); err != nil {
			rows.Close()
			return nil, err
		}
		versions[event.FormatID(id)] = sv
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	last, partitions := rc.lastVersions(versions)
	var lines []string
	for s := range streams {
		key := fmt.Sprintf("order-%d", s)
		v, ok := last[key]
		if !ok {
			v = -1
		}
		if v < head {
			p := partitions[key]
			if p == "" {
				p = "?"
			}
			lines = append(lines, fmt.Sprintf("%s: last %d, head %d (partition %s)", key, v, head, p))
		}
	}
	return lines, nil
}

// lastVersions returns, by stream, the highest version rc processed of the
// events versions knows (event id → stream and version), and the
// partition its POSTs named (the Jsbridge-Partition header; the last
// first POST of the stream's).
func (rc *orderedReceiver) lastVersions(versions map[string]streamVersion) (last map[string]int64, partitions map[string]string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	partitions = map[string]string{}
	for _, p := range rc.firstPosts {
		if sv, ok := versions[p.id]; ok && p.partition != "" {
			partitions[sv.stream] = p.partition
		}
	}
	last = map[string]int64{}
	for _, id := range rc.processed {
		sv, ok := versions[id]
		if !ok {
			continue
		}
		if v, seen := last[sv.stream]; !seen || sv.version > v {
			last[sv.stream] = sv.version
		}
	}
	return last, partitions
}
