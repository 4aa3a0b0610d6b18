package pull

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Nak returns msg to JetStream for redelivery after delay, logging a
// failure to log.
func Nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration) {
	if err := msg.NakWithDelay(delay); err != nil {
		log.Warn("nak failed; JetStream will redeliver after AckWait", slog.Any("error", err))
	}
}
