package reader

// Test accessors: what the tests read of a Reader that the engine does
// not.

// ConsumerHost names the server hosting the reader's current consumer
// ("" when unknown), for the tests that shut it down.
func (r *Reader) ConsumerHost() string {
	if info := r.oc.CachedInfo(); info != nil && info.Cluster != nil {
		return info.Cluster.Leader
	}
	return ""
}

// Head returns the last sequence the reader read live (handed on or
// dropped); from - 1 before the first.
func (r *Reader) Head() uint64 { return r.head }

// Unpartitioned returns how many subjects the reader passed over because
// they were no event's (not three tokens after the prefix).
func (r *Reader) Unpartitioned() uint64 { return r.unpartitioned }

// Cursor makes a cursor as NewCursor does, on r's connection and
// configuration.
func (r *Reader) Cursor(filters []string, from, to uint64) (*Cursor, error) {
	return NewCursor(r.js, r.cfg, filters, from, to)
}
