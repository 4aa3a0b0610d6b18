package reader

// ConsumerHost names the server hosting the reader's current consumer
// ("" when unknown), for the tests that shut it down.
func (r *Reader) ConsumerHost() string {
	if info := r.oc.CachedInfo(); info != nil && info.Cluster != nil {
		return info.Cluster.Leader
	}
	return ""
}
