package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/breaker"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/flagdoc"
	"github.com/jsbridge/jsbridge/internal/ops"
)

// Every `consumer run` flag that maps to a consumer.Config field (or a
// subscription's) defaults to the consumer package's Default* value, so the
// defaults are defined once in effect: the kong tags keep literals for
// --help, and the README's table is checked against the flags
// (TestREADMEFlagTablesMatchTheCode), so README, --help and the package
// agree.
func TestRunFlagDefaultsAreTheConsumerDefaults(t *testing.T) {
	t.Parallel()
	app, err := kong.New(&cli{}, ops.WireVars())
	require.NoError(t, err)
	flags, err := flagdoc.Flags(app, "run")
	require.NoError(t, err)

	want := map[string]any{
		"stream":                consumer.DefaultStream,
		"dlq-stream":            consumer.DefaultDLQStream,
		"stream-replicas":       consumer.DefaultReplicas,
		"timeout":               consumer.DefaultTimeout,
		"ack-wait":              "", // deprecated, ignored: no default
		"max-deliver":           consumer.DefaultMaxDeliver,
		"backoff":               consumer.DefaultBackOff(),
		"max-in-flight":         consumer.DefaultMaxInFlight,
		"breaker-failures":      int(consumer.DefaultBreakerFailures),
		"breaker-open-timeout":  consumer.DefaultBreakerOpenTimeout,
		"breaker-min-requests":  int(breaker.DefaultMinRequests),
		"breaker-failure-ratio": strconv.FormatFloat(breaker.DefaultFailureRatio, 'g', -1, 64),
		"partitions":            consumer.DefaultPartitions,
		"lease-ttl":             consumer.DefaultLeaseTTL,
		"attempts-record":       string(consumer.AttemptsRecordFailures),
		// No flag default: 0 means consumer.DefaultMaxAckPending (or
		// --max-in-flight when larger), and waiting forever.
		"max-ack-pending": "",
		"startup-timeout": time.Duration(0),
	}
	for name, def := range want {
		f, ok := flags[name]
		require.True(t, ok, "consumer run has no --%s", name)
		var got any
		switch def.(type) {
		case time.Duration:
			got, err = time.ParseDuration(f.Default)
		case int:
			got, err = strconv.Atoi(f.Default)
		case string:
			got = f.Default
		case []time.Duration:
			var ds []time.Duration
			for _, s := range strings.Split(f.Default, ",") {
				d, perr := time.ParseDuration(s)
				if perr != nil {
					err = perr
					break
				}
				ds = append(ds, d)
			}
			got = ds
		default:
			t.Fatalf("--%s: no comparison for %T", name, def)
		}
		require.NoError(t, err, "--%s default %q", name, f.Default)
		require.Equal(t, def, got, "--%s: the flag's default is not the consumer package's", name)
	}
}
