package forward

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodeAck reads every answer as encoding/json does; the flat PubAcks
// without it.
func TestDecodeAckAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		data string
		flat bool // read without encoding/json
	}{
		{`{"stream":"EVENTS","seq":42}`, true},
		{`{"stream":"EVENTS","domain":"hub","seq":7,"duplicate":true}`, true},
		{` { "stream" : "EVENTS" , "seq" : 3 , "duplicate" : false } `, true},
		{`{"stream":"EVENTS","seq":18446744073709551615}`, true},
		{`{"stream":"EVENTS","seq":9,"batch":"abc12","count":3}`, true},
		{`{"type":"gap","last_seq":3,"seq":5}`, false},
		{`{"type":"err","seq":2,"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}`, false},
		{`{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled"},"stream":"EVENTS","seq":0}`, false},
		{`{"stream":"EV\"ENTS","seq":1}`, false},
		{`{"stream":"a,b","seq":1}`, false},
		{`{"stream":"EVENTS","seq":1,}`, false},
		{`{"stream":"EVENTS","seq":-1}`, false},
		{`{"stream":"EVENTS","seq":1.5}`, false},
		{`{}`, true},
		{`not json`, false},
	} {
		var want batchAck
		wantErr := json.Unmarshal([]byte(c.data), &want)
		var flat batchAck
		require.Equal(t, c.flat, decodeFlatAck([]byte(c.data), &flat), c.data)
		var got batchAck
		err := decodeAck([]byte(c.data), &got)
		if wantErr != nil {
			require.Error(t, err, c.data)
			continue
		}
		require.NoError(t, err, c.data)
		require.Equal(t, want, got, c.data)
	}
}

// replySeq reads the batch sequence of a fast batch's reply subject
// (after "<inbox>.<batch id>."), 0 for any other.
func TestReplySeq(t *testing.T) {
	t.Parallel()
	for rest, want := range map[string]int{
		"500.fail.3.2.$FI": 3,
		"500.fail.12":      12,
		"500.fail.1.0.$FI": 1,
		"500.fail":         0,
		"500.fail.x.1.$FI": 0,
		"":                 0,
	} {
		require.Equal(t, want, replySeq(rest), rest)
	}
}
