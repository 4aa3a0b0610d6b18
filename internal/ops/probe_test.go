package ops

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
)

// runProbe runs `probe <url>` as a binary's command line would.
func runProbe(t *testing.T, url string) (string, error) {
	t.Helper()
	var cli struct {
		Probe ProbeCmd `cmd:""`
	}
	var out bytes.Buffer
	app, err := kong.New(&cli, kong.Writers(&out, &out))
	require.NoError(t, err)
	kctx, err := app.Parse([]string{"probe", url})
	require.NoError(t, err)
	kctx.BindTo(context.Background(), (*context.Context)(nil))
	err = kctx.Run()
	return out.String(), err
}

func TestProbeExitsZeroOnlyOn2xx(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			http.Error(w, "waiting for: jetstream\nmore", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	t.Cleanup(srv.Close)

	out, err := runProbe(t, srv.URL+"/healthz")
	require.NoError(t, err)
	require.Equal(t, "200 OK: ok\n", out)

	_, err = runProbe(t, srv.URL+"/readyz")
	require.ErrorContains(t, err, "503 Service Unavailable: waiting for: jetstream")

	srv.Close()
	_, err = runProbe(t, srv.URL+"/healthz")
	require.Error(t, err)
}
