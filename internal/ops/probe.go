package ops

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// ProbeCmd is the `probe` subcommand of every binary: a health check for
// images that have no shell and no curl (compose healthcheck, Docker
// HEALTHCHECK). It GETs URL and exits 0 on a 2xx answer, 1 otherwise,
// printing the status and the body's first line (what /readyz waits for).
type ProbeCmd struct {
	URL     string        `arg:"" name:"url" help:"URL to GET, e.g. http://127.0.0.1:9464/readyz (the ops port's /readyz or /healthz)."`
	Timeout time.Duration `name:"timeout" default:"3s" help:"How long the request may take (default: ${default})."`
}

// Run GETs p.URL; an answer that is not 2xx, or none within p.Timeout, is
// an error naming the URL and the status.
func (p *ProbeCmd) Run(ctx context.Context, kctx *kong.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return fmt.Errorf("probe %q: %w", p.URL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("probe %s: %s: %s", p.URL, resp.Status, line)
	}
	_, err = fmt.Fprintf(kctx.Stdout, "%s: %s\n", resp.Status, line)
	return err
}
