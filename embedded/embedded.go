// Package embedded runs an in-process nats-server with JetStream: the server
// the tests use and the bridge's single-machine default. It listens on
// loopback, so the nats CLI can look inside while it runs.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrNotReady is returned by Start when the server does not accept
// connections within Config.StartTimeout.
var ErrNotReady = errors.New("embedded nats-server not ready")

// ErrPortInUse is returned by Start when Config.Port is taken by another
// program (address in use); the message names the host and port.
var ErrPortInUse = errors.New("embedded nats-server: address in use")

// ServerName is the server name of a server Start starts: clients (the
// consumer) see it as the connection's server name and know it is the
// bridge's embedded one.
const ServerName = "jsbridge-embedded"

// RandomPort asks Start for a free port chosen by the OS.
const RandomPort = -1

// Config configures an embedded server. The zero value is not usable: Dir is
// required.
type Config struct {
	// Dir is where JetStream keeps its file store. Required. Reusing a Dir
	// keeps the streams, messages and consumers of an earlier run.
	Dir string
	// Host is the listen address. Default "127.0.0.1" (loopback only).
	Host string
	// Port is the client port. 0 means the NATS default 4222; RandomPort (-1)
	// picks a free port (tests).
	Port int
	// MaxPayload is the largest message the server accepts, in bytes.
	// Default 0 means the server default (1 MiB).
	MaxPayload int32
	// MaxFileStore caps JetStream's file storage, in bytes (the server's
	// max_file_store): past it JetStream refuses writes with "insufficient
	// resources". Default 0: the server's default (75% of the disk).
	MaxFileStore int64
	// StartTimeout bounds the wait for the server to accept connections.
	// Default 10 s.
	StartTimeout time.Duration
	// Logging turns the server's own log (to stderr) on. Default off.
	Logging bool
}

// Server is a running embedded nats-server.
type Server struct {
	srv *server.Server
	cfg Config
}

// Start starts a server with JetStream enabled and waits until it accepts
// connections. It fails when Dir is empty, the port is taken, or the server
// is not ready within StartTimeout (ErrNotReady).
func Start(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("embedded: Config.Dir is required (JetStream store directory)")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.Port > 0 {
		// nats-server only logs a taken port and never becomes ready: say
		// it plainly, at once.
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: %w", ErrPortInUse, cfg.Host, cfg.Port, err)
		}
		_ = ln.Close()
	}
	opts := &server.Options{
		ServerName: ServerName,
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.Dir,
		MaxPayload: cfg.MaxPayload,
		NoSigs:     true,
		NoLog:      !cfg.Logging,
	}
	opts.JetStreamMaxStore = cfg.MaxFileStore
	opts.JetStreamLimits.DefaultMaxConsumers = UnlimitedConsumers
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: new server on %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	if cfg.Logging {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(cfg.StartTimeout) {
		srv.Shutdown()
		return nil, fmt.Errorf("%w after %s (host %s, port %d)", ErrNotReady, cfg.StartTimeout, cfg.Host, cfg.Port)
	}
	return &Server{srv: srv, cfg: cfg}, nil
}

// ClientURL returns the URL clients (and the nats CLI) connect to, e.g.
// "nats://127.0.0.1:4222".
func (s *Server) ClientURL() string { return s.srv.ClientURL() }

// Connect opens a client connection to the server with the given options.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: connect %s: %w", s.ClientURL(), err)
	}
	return nc, nil
}

// Shutdown stops the server and waits until it has stopped. JetStream data
// stays in Dir. Safe to call more than once.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
