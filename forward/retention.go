// Retention at reconciliation: a stream JetStream holds no message of,
// though some were forwarded, aged out by the JetStream stream's own
// limits, or was lost.

package forward

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// limitsExplainGone reports whether a JetStream stream's limits explain
// that none of a source stream's forwarded messages is left: the stream
// removes messages from the front by age, size or count (MaxAge, MaxBytes,
// MaxMsgs; MaxMsgsPerSubject always keeps a subject's last message) and
// its first sequence has moved past 1 (messages did leave it).
//
// A found last message below the watermark is never explained so: the
// front-removing limits take a source stream's messages oldest first, so
// its last message goes last.
func limitsExplainGone(cfg jetstream.StreamConfig, state jetstream.StreamState) bool {
	front := cfg.MaxAge > 0 || cfg.MaxBytes > 0 || cfg.MaxMsgs > 0
	return front && state.FirstSeq > 1
}

// noteGone logs, for a stream JetStream holds no message of although
// versions up to watermark were forwarded, whether the JetStream stream's
// limits aged them out (Info) or nothing explains it (Warn: lost, or
// deleted by someone; `bridge verify` tells). Either way the stream goes
// on after its watermark: with nothing left of it in JetStream, the next
// event leaves no hole behind a message a consumer could still read. A
// failed lookup is only logged.
func (f *Forwarder) noteGone(ctx context.Context, stream string, watermark int64) {
	lctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	s, err := f.jsStream(lctx, f.cfg.Prefix+".>")
	var info *jetstream.StreamInfo
	if err == nil {
		info, err = s.Info(lctx)
	}
	if err != nil {
		f.log.Debug("reconcile: JetStream holds none of the stream's forwarded events; its limits could not be read", "stream", stream, "watermark", watermark, "error", err)
		return
	}
	if limitsExplainGone(info.Config, info.State) {
		f.log.Info("reconcile: the stream's forwarded events aged out of JetStream by its limits; publishing after the watermark",
			"stream", stream, "watermark", watermark, "jetstream_stream", info.Config.Name, "retention", LimitsOf(info.Config).String())
		return
	}
	f.log.Warn(fmt.Sprintf("reconcile: JetStream holds none of the stream's forwarded events and the limits of JetStream stream %s do not explain it (lost, or deleted); "+
		"publishing after the watermark; check with: bridge verify --stream %s", info.Config.Name, stream),
		"stream", stream, "watermark", watermark, "jetstream_stream", info.Config.Name)
}
