package fanout

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// bus is an embedded JetStream with the positions bucket.
type bus struct {
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	clock *clockwork.FakeClock
}

func setup(t *testing.T) *bus {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := position.Bucket(t.Context(), js, "", 1)
	require.NoError(t, err)
	return &bus{js: js, kv: kv, clock: clockwork.NewFakeClock()}
}

// claim claims partition 0 for owner under epoch and runs its commit
// loop until stop (or cleanup).
func (b *bus) claim(t *testing.T, owner string, epoch uint64) (p *position.Partition, stop func()) {
	t.Helper()
	p, err := position.Claim(t.Context(), b.js, b.kv, position.Config{Owner: owner, Epoch: epoch, Archetype: base.New(b.clock, nil, "")})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return p, stop
}

// event is the event at seq of stream ("order-1"), version v, in
// category "order".
func event(seq uint64, stream string, v int) reader.Event {
	return reader.Event{Seq: seq, Subject: wire.Subject(wire.DefaultEventsPrefix, stream, "Placed"),
		Header: nats.Header{wire.HeaderStreamVersion: {strconv.Itoa(v)}}}
}

// events makes n events over streams order-0 … order-<streams-1>, round
// robin, each stream's versions from 0, sequences from first.
func events(first uint64, n, streams int) []reader.Event {
	var out []reader.Event
	for i := range n {
		out = append(out, event(first+uint64(i), fmt.Sprintf("order-%d", i%streams), i/streams))
	}
	return out
}

// sent is one attempt a recorder saw.
type sent struct {
	seq      uint64
	stream   string
	previous int64
}

// recorder is a Sender that records every attempt and answers with
// answer (Delivered when nil).
type recorder struct {
	mu     sync.Mutex
	got    map[string][]sent
	answer func(d Delivery) Settlement
}

func newRecorder(answer func(Delivery) Settlement) *recorder {
	return &recorder{got: map[string][]sent{}, answer: answer}
}

func (r *recorder) Attempt(ctx context.Context, d Delivery) Settlement {
	s := Settlement{Act: Delivered}
	if r.answer != nil {
		s = r.answer(d)
	}
	if ctx.Err() == nil && s.Act != Retry {
		r.mu.Lock()
		r.got[d.Subscription] = append(r.got[d.Subscription], sent{d.Event.Seq, wire.StreamKey(d.Event.Subject), d.Previous})
		r.mu.Unlock()
	}
	return s
}

func (r *recorder) of(sub string) []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[sub])
}

func (r *recorder) seqs(sub string) []uint64 {
	var out []uint64
	for _, s := range r.of(sub) {
		out = append(out, s.seq)
	}
	return out
}

// eventually polls cond briefly, for 10 s at most.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 2*time.Millisecond, msg)
}

// inOrder asserts that got holds every sequence of want once, each
// stream's in ascending order.
func inOrder(t *testing.T, got []sent, want []reader.Event) {
	t.Helper()
	seqs := make([]uint64, 0, len(got))
	last := map[string]uint64{}
	for _, s := range got {
		require.Greater(t, s.seq, last[s.stream], "stream %s went out of order", s.stream)
		last[s.stream] = s.seq
		seqs = append(seqs, s.seq)
	}
	var ws []uint64
	for _, e := range want {
		ws = append(ws, e.Seq)
	}
	slices.Sort(seqs)
	require.Equal(t, ws, seqs, "every event once")
}

// store is a CursorReader over events in memory (the events of one
// partition, ascending).
type store struct {
	mu  sync.Mutex
	all []reader.Event
}

func (s *store) add(evs ...reader.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, evs...)
}

func (s *store) Read(_ context.Context, r cursor.Read) ([]reader.Event, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := member.Entry{Member: member.Member{Filters: r.Filters}}
	var out []reader.Event
	for _, e := range s.all {
		if e.Seq <= r.After || e.Seq > r.To || !m.Takes(e.Subject) {
			continue
		}
		if len(out) == r.Max {
			return out, out[len(out)-1].Seq, nil
		}
		out = append(out, e)
	}
	return out, r.To, nil
}

// catchUp runs CatchUp rounds until nobody is behind (10 s at most).
func catchUp(t *testing.T, f *Partition) {
	t.Helper()
	eventually(t, func() bool {
		n, err := f.CatchUp(t.Context())
		if err != nil {
			t.Errorf("CatchUp: %v", err)
			return true
		}
		return n == 0
	}, "every cursor rejoins")
}
