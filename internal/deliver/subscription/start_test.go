package subscription_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

func TestParseStartReadsWhatStringWrites(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 1, 12, 30, 0, 500, time.UTC)
	for in, want := range map[string]subscription.Start{
		"":                                  {Policy: subscription.StartNew},
		"new":                               {Policy: subscription.StartNew},
		"all":                               {Policy: subscription.StartAll},
		"time:2026-11-01T12:30:00.0000005Z": subscription.StartAtTime(at),
		"time: 2026-11-01T13:30:00.0000005+01:00": subscription.StartAtTime(at.In(time.FixedZone("", 3600))),
		"sequence:42": subscription.StartAtSequence(42),
		"sequence: 7": subscription.StartAtSequence(7),
	} {
		got, err := subscription.ParseStart(in)
		require.NoError(t, err, in)
		require.Equal(t, want.Policy, got.Policy, in)
		require.True(t, want.Time.Equal(got.Time), in)
		require.Equal(t, want.Sequence, got.Sequence, in)
		again, err := subscription.ParseStart(got.String())
		require.NoError(t, err)
		require.Equal(t, got.String(), again.String())
	}
	for _, bad := range []string{"old", "time:yesterday", "sequence:0", "sequence:-1", "sequence", "time:"} {
		_, err := subscription.ParseStart(bad)
		require.ErrorIs(t, err, subscription.ErrInvalidStart, bad)
		require.ErrorContains(t, err, strconv.Quote(bad))
	}
	err := subscription.Subscription{Name: "s", FilterSubjects: []string{"events.>"}, URL: "https://h.example/", Secrets: []string{secret},
		Start: subscription.Start{Policy: subscription.StartSequence}}.Validate()
	require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
	require.ErrorContains(t, err, "Start")
}

// Start.validate, through Validate: a start that names a policy needs its
// argument, and an unknown policy is refused by name.
func TestValidateStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		start subscription.Start
		want  string
	}{
		{subscription.Start{Policy: subscription.StartTime}, "Start: time start without a time"},
		{subscription.Start{Policy: subscription.StartSequence}, "Start: sequence start at 0"},
		{subscription.Start{Policy: "latest"}, `Start: "latest" (want "new", "all", "time" or "sequence")`},
	} {
		s := sub("orders", "https://hooks.example/in")
		s.Start = tc.start
		err := s.Validate()
		require.ErrorIs(t, err, subscription.ErrInvalidSubscription, tc.want)
		require.ErrorContains(t, err, tc.want)
	}
	for _, ok := range []subscription.Start{{}, {Policy: subscription.StartAll}, subscription.StartAtTime(time.Unix(1, 0)), subscription.StartAtSequence(1)} {
		s := sub("orders", "https://hooks.example/in")
		s.Start = ok
		require.NoError(t, s.Validate(), ok.String())
	}
}

// ApplyStart turns each start into the durable consumer's deliver policy
// and records it; the zero Start is StartNew.
func TestApplyStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		start  subscription.Start
		policy jetstream.DeliverPolicy
		seq    uint64
		time   *time.Time
		record string
	}{
		{subscription.Start{}, jetstream.DeliverNewPolicy, 0, nil, "new"},
		{subscription.Start{Policy: subscription.StartNew}, jetstream.DeliverNewPolicy, 0, nil, "new"},
		{subscription.Start{Policy: subscription.StartAll}, jetstream.DeliverAllPolicy, 0, nil, "all"},
		{subscription.StartAtTime(at), jetstream.DeliverByStartTimePolicy, 0, &at, "time:2026-11-01T00:00:00Z"},
		{subscription.StartAtSequence(42), jetstream.DeliverByStartSequencePolicy, 42, nil, "sequence:42"},
	} {
		var cfg jetstream.ConsumerConfig
		subscription.ApplyStart(&cfg, tc.start)
		require.Equal(t, tc.policy, cfg.DeliverPolicy, tc.record)
		require.Equal(t, tc.seq, cfg.OptStartSeq, tc.record)
		require.Equal(t, tc.time, cfg.OptStartTime, tc.record)
		require.Equal(t, map[string]string{subscription.StartMetadataKey: tc.record}, cfg.Metadata)
		got, ok := subscription.RecordedStart(cfg)
		require.True(t, ok)
		require.Equal(t, tc.record, got)
		require.Equal(t, tc.record, subscription.ReportedStart(cfg), "a recorded start is reported as recorded")
	}
	// RecordStart keeps the other metadata.
	cfg := jetstream.ConsumerConfig{Metadata: map[string]string{"other": "x"}}
	subscription.RecordStart(&cfg, subscription.StartAtSequence(7))
	require.Equal(t, map[string]string{"other": "x", subscription.StartMetadataKey: "sequence:7"}, cfg.Metadata)
}

// KeepStart makes an update keep the existing durable's start: its
// deliver policy, its recorded start and the extra keys asked for, even
// when the new config says otherwise or has no metadata; a key the
// existing durable lacks is dropped from the update.
func TestKeepStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	have := jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &at,
		Metadata: map[string]string{subscription.StartMetadataKey: "time:2026-11-01T00:00:00Z", "chain": "17", "unrelated": "have"},
	}
	var upd jetstream.ConsumerConfig
	subscription.ApplyStart(&upd, subscription.StartAtSequence(5))
	upd.Metadata["chain"] = "99"
	upd.Metadata["mine"] = "upd"
	subscription.KeepStart(&upd, have, "chain")
	require.Equal(t, jetstream.DeliverByStartTimePolicy, upd.DeliverPolicy)
	require.Equal(t, &at, upd.OptStartTime)
	require.Zero(t, upd.OptStartSeq)
	require.Equal(t, map[string]string{subscription.StartMetadataKey: "time:2026-11-01T00:00:00Z", "chain": "17", "mine": "upd"}, upd.Metadata,
		"the start and the extra key come from have; other keys stay the update's")

	// An existing durable from before starts were recorded: nothing is
	// recorded on the update either, and its deliver policy stays.
	old := jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	upd = jetstream.ConsumerConfig{}
	subscription.ApplyStart(&upd, subscription.StartAtSequence(5))
	subscription.KeepStart(&upd, old, "chain")
	require.Equal(t, jetstream.DeliverAllPolicy, upd.DeliverPolicy)
	require.Zero(t, upd.OptStartSeq)
	_, ok := subscription.RecordedStart(upd)
	require.False(t, ok)

	// A config without metadata gets the map it needs.
	upd = jetstream.ConsumerConfig{}
	subscription.KeepStart(&upd, have)
	require.Equal(t, map[string]string{subscription.StartMetadataKey: "time:2026-11-01T00:00:00Z"}, upd.Metadata)
}

// ReportedStart reads a durable without a recorded start from its
// deliver policy, marked as not recorded.
func TestReportedStartNotRecorded(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		cfg  jetstream.ConsumerConfig
		want string
	}{
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}, "all (not recorded)"},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}, "new (not recorded)"},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 9}, "sequence:9 (not recorded)"},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &at}, "time:2026-11-01T00:00:00Z (not recorded)"},
	} {
		require.Equal(t, tc.want, subscription.ReportedStart(tc.cfg))
	}
}

// CheckStart refuses a start that differs from the recorded one, naming
// both, the durable, the stream and how to reset; the same start and a
// durable without a recorded start pass.
func TestCheckStart(t *testing.T) {
	t.Parallel()
	var cfg jetstream.ConsumerConfig
	subscription.ApplyStart(&cfg, subscription.StartAtSequence(42))
	require.NoError(t, subscription.CheckStart("orders", subscription.StartAtSequence(42), cfg, "orders", "EVENTS", "nats consumer rm EVENTS orders"))
	require.NoError(t, subscription.CheckStart("orders", subscription.Start{Policy: subscription.StartAll}, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}, "orders", "EVENTS", "-"),
		"a durable from before starts were recorded is accepted")
	require.NoError(t, subscription.CheckStart("orders", subscription.StartAtSequence(3), jetstream.ConsumerConfig{}, "orders", "EVENTS", "-"),
		"whatever the start asked for")

	err := subscription.CheckStart("orders", subscription.Start{}, cfg, "orders_p3", "EVENTS_ORDERED", "nats consumer rm EVENTS_ORDERED orders_p3")
	require.ErrorIs(t, err, subscription.ErrStartChanged)
	for _, want := range []string{`subscription "orders"`, `start "new"`, `durable consumer "orders_p3"`, `JetStream stream "EVENTS_ORDERED"`,
		`created with start "sequence:42"`, "nats consumer rm EVENTS_ORDERED orders_p3"} {
		require.ErrorContains(t, err, want)
	}
	require.NotContains(t, strconv.Quote(err.Error()), `\n`)
}
