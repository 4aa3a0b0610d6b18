package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// A subscription whose URL host is literally loopback, private or a
// localhost name is refused when the configuration is loaded, naming the
// subscription, the field and the value, instead of dead-lettering every
// event when dialled; with AllowPrivate it is accepted.
func TestLocalOrPrivateURLRefusedAtLoad(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url     string
		refused bool
	}{
		{"https://localhost/hook", true},
		{"https://LocalHost.:8443/hook", true},
		{"https://api.localhost/hook", true},
		{"https://127.0.0.1:8080/hook", true},
		{"https://[::1]:8080/hook", true},
		{"https://10.1.2.3/hook", true},
		{"https://192.168.0.10/hook", true},
		{"https://169.254.169.254/latest", true},
		{"https://example.com/hook", false},
		{"https://localhost.example.com/hook", false},
		{"https://notlocalhost/hook", false},
		{"https://93.184.216.34/hook", false},
	} {
		t.Run(c.url, func(t *testing.T) {
			t.Parallel()
			s := consumer.Subscription{Name: "orders", FilterSubjects: []string{"events.>"}, URL: c.url, Secrets: []string{"whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}
			cfg := consumer.Config{Subscriptions: []consumer.Subscription{s}}
			if !c.refused {
				require.NoError(t, s.Validate())
				require.NoError(t, cfg.Validate())
				return
			}
			for _, err := range []error{s.Validate(), cfg.Validate()} {
				require.ErrorIs(t, err, consumer.ErrInvalidConfig)
				require.ErrorIs(t, err, consumer.ErrForbiddenAddress)
				require.Contains(t, err.Error(), `"orders"`)
				require.Contains(t, err.Error(), "URL: \""+c.url+"\"")
			}
			require.Contains(t, cfg.Validate().Error(), "Subscriptions[0]")
			_, err := consumer.New(stubJS{}, cfg)
			require.ErrorIs(t, err, consumer.ErrForbiddenAddress, "New refuses it too")

			s.AllowPrivate = true
			require.NoError(t, s.Validate())
			require.NoError(t, consumer.Config{Subscriptions: []consumer.Subscription{s}}.Validate())
		})
	}
}
