// Package ops is the operations surface every jsbridge binary shares: the
// structured logger and the one ops port serving Prometheus metrics,
// /healthz and /readyz.
package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewLogger returns a slog logger writing to w in format "text" or "json" at
// level "debug", "info", "warn" or "error". Unknown values are errors naming
// the flag and the value.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}

// Check is one readiness check: nil when the dependency is usable.
type Check func(ctx context.Context) error

// Server is the ops HTTP server: GET /metrics (Prometheus text format),
// /healthz (200 while the process runs) and /readyz (200 when every named
// check passes, else 503 listing the failures, one "name: error" line
// each, sorted by name).
type Server struct {
	// Registry holds the binary's metrics, plus the Go and process collectors.
	Registry *prometheus.Registry

	// Pprof adds the net/http/pprof handlers under /debug/pprof/ when true
	// (set before Start). Default off: profiles reveal internals.
	Pprof bool

	mu     sync.Mutex
	checks map[string]Check
	srv    *http.Server
	ln     net.Listener
}

// NewServer returns a Server with a fresh registry. Start makes it listen.
func NewServer() *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Server{Registry: reg, checks: map[string]Check{}}
}

// AddCheck adds a named readiness check to /readyz.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Handler returns the ops routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry}))
	if s.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		s.mu.Lock()
		checks := make(map[string]Check, len(s.checks))
		for k, v := range s.checks {
			checks[k] = v
		}
		s.mu.Unlock()
		var failed []string
		for name, c := range checks {
			if err := c(ctx); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			}
		}
		if len(failed) > 0 {
			slices.Sort(failed)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, strings.Join(failed, "\n")+"\n")
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return mux
}

// Start listens on addr ("host:port"; empty disables the ops port) and
// serves in the background. It returns the bound address.
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--ops-addr %q: %w (choose another address with --ops-addr, or an empty one to turn the ops port off)", addr, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return ln.Addr().String(), nil
}

// Stop stops the ops server, waiting up to 2 s for open requests (a
// Prometheus scrape); for a defer at the end of a binary's run.
func (s *Server) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
}

// Shutdown stops the ops server, waiting up to ctx for open requests.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	if err := s.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
