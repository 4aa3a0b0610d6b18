package deliver

import (
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// fenceBuffer holds the partition's messages while it is behind its fence
// (a new owner, or a delivery lost on its way) until the fence passes, one per
// stream sequence.
type fenceBuffer struct {
	mu   sync.Mutex
	msgs map[uint64]jetstream.Msg
}

func (f *fenceBuffer) add(m jetstream.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.msgs == nil {
		f.msgs = map[uint64]jetstream.Msg{}
	}
	f.msgs[streamSeq(m)] = m
}

func (f *fenceBuffer) snapshot() []jetstream.Msg {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]jetstream.Msg, 0, len(f.msgs))
	for _, m := range f.msgs {
		out = append(out, m)
	}
	return out
}

// remove removes m from the buffer, unless another copy of its event
// replaced it meanwhile.
func (f *fenceBuffer) remove(m jetstream.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := streamSeq(m); f.msgs[s] == m {
		delete(f.msgs, s)
	}
}

// addSeqs adds the stream sequences of the buffered messages to seqs.
func (f *fenceBuffer) addSeqs(seqs map[uint64]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.msgs {
		seqs[s] = true
	}
}

// take empties the buffer and returns its messages in stream order.
func (f *fenceBuffer) take() []jetstream.Msg {
	f.mu.Lock()
	seqs := make([]uint64, 0, len(f.msgs))
	for s := range f.msgs {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	out := make([]jetstream.Msg, len(seqs))
	for i, s := range seqs {
		out[i] = f.msgs[s]
	}
	f.msgs = nil
	f.mu.Unlock()
	return out
}

// streamSeq is a message's sequence in the partitioned stream (0 when it
// has no metadata).
func streamSeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// consumerSeq is a message's delivery sequence on its durable consumer
// (0 when unknown).
func consumerSeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Consumer
	}
	return 0
}
