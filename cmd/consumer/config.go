package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/webhook"
)

// fileConfig is the subscriptions file (YAML). Unknown fields are errors.
type fileConfig struct {
	// Breaker applies to every endpoint's circuit breaker: breakers are per
	// endpoint (subscriptions sharing one share its breaker), so their
	// settings are per file, not per subscription.
	Breaker       fileBreaker        `yaml:"breaker"`
	Subscriptions []fileSubscription `yaml:"subscriptions"`
}

type fileBreaker struct {
	ConsecutiveFailures uint32   `yaml:"consecutive_failures"`
	FailureRatio        float64  `yaml:"failure_ratio"`
	MinRequests         uint32   `yaml:"min_requests"`
	Interval            duration `yaml:"interval"`
	OpenTimeout         duration `yaml:"open_timeout"`
	HalfOpenProbes      uint32   `yaml:"half_open_probes"`
}

type fileSubscription struct {
	Name           string            `yaml:"name"`
	FilterSubjects []string          `yaml:"filter_subjects"`
	URL            string            `yaml:"url"`
	SecretsEnv     []string          `yaml:"secrets_env"`
	SecretsFile    []string          `yaml:"secrets_file"`
	Scheme         string            `yaml:"scheme"`
	Body           string            `yaml:"body"`
	Headers        map[string]string `yaml:"headers"`
	HeadersEnv     map[string]string `yaml:"headers_env"`
	Timeout        duration          `yaml:"timeout"`
	AckWait        duration          `yaml:"ack_wait"` // deprecated, ignored: consumer.New warns
	MaxDeliver     int               `yaml:"max_deliver"`
	BackOff        []duration        `yaml:"backoff"`
	MaxInFlight    int               `yaml:"max_in_flight"`
	MaxAckPending  int               `yaml:"max_ack_pending"`
	RateLimit      float64           `yaml:"rate_limit"`
	AllowPrivate   bool              `yaml:"allow_private"`
	AllowHTTP      bool              `yaml:"allow_http"`
	TLS            fileTLS           `yaml:"tls"`
	Ordering       string            `yaml:"ordering"`
	OnDeadLetter   string            `yaml:"on_dead_letter"`
	Start          fileStart         `yaml:"start"`
}

// fileStart is a subscription's start: a scalar (new, all,
// "time:<RFC 3339>", "sequence:<n>") or a mapping with one key,
// {time: <RFC 3339>} or {sequence: <n>}.
type fileStart struct{ consumer.Start }

func (s *fileStart) UnmarshalYAML(n *yaml.Node) error {
	v := n.Value
	if n.Kind == yaml.MappingNode {
		if len(n.Content) != 2 {
			return fmt.Errorf("line %d: start: want one of new, all, {time: <RFC 3339>} or {sequence: <n>}", n.Line)
		}
		v = n.Content[0].Value + ":" + n.Content[1].Value
	}
	st, err := consumer.ParseStart(v)
	if err != nil {
		return fmt.Errorf("line %d: start: %w", n.Line, err)
	}
	s.Start = st
	return nil
}

// fileTLS is a subscription's tls block: PEM files for mutual TLS and the
// endpoint's CA bundle.
type fileTLS struct {
	ClientCertFile string `yaml:"client_cert_file"`
	ClientKeyFile  string `yaml:"client_key_file"`
	CAFile         string `yaml:"ca_file"`
}

// tlsFile is a TLS file's path and the name the user gave it by (a YAML
// key or a flag).
type tlsFile struct{ name, path string }

// tlsFiles checks that each file given is readable, naming it by where
// (the YAML key or the flag) and its path, and returns them for deliver,
// which parses them at start.
func tlsFiles(cert, key, ca tlsFile) (consumer.TLSFiles, error) {
	for _, f := range []tlsFile{cert, key, ca} {
		if f.path == "" {
			continue
		}
		if _, err := os.ReadFile(f.path); err != nil {
			return consumer.TLSFiles{}, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	if (cert.path == "") != (key.path == "") {
		return consumer.TLSFiles{}, fmt.Errorf("%s and %s go together: set both or neither", cert.name, key.name)
	}
	return consumer.TLSFiles{ClientCertFile: cert.path, ClientKeyFile: key.path, CAFile: ca.path}, nil
}

// duration is a time.Duration written as a Go duration string ("10s").
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (e.g. 500ms, 10s, 2m)", n.Line, n.Value)
	}
	*d = duration(v)
	return nil
}

// loadSubscriptions reads a subscriptions file: the subscriptions, with
// secrets and header values read from the environment and files, and the
// breaker settings (zero fields: breaker defaults).
func loadSubscriptions(path string) ([]consumer.Subscription, breaker.Settings, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, breaker.Settings{}, fmt.Errorf("--config: %w", err)
	}
	return parseSubscriptions(raw, "--config "+path)
}

// parseSubscriptions reads a subscriptions file's content raw, named where
// in errors ("--config <path>"), as loadSubscriptions does.
func parseSubscriptions(raw []byte, where string) ([]consumer.Subscription, breaker.Settings, error) {
	var bs breaker.Settings
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var fc fileConfig
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return nil, bs, fmt.Errorf("%s: %w", where, err)
	}
	if len(fc.Subscriptions) == 0 {
		return nil, bs, fmt.Errorf("%s: no subscriptions", where)
	}
	bs = breaker.Settings{
		ConsecutiveFailures: fc.Breaker.ConsecutiveFailures, FailureRatio: fc.Breaker.FailureRatio,
		MinRequests: fc.Breaker.MinRequests, Interval: time.Duration(fc.Breaker.Interval),
		OpenTimeout: time.Duration(fc.Breaker.OpenTimeout), HalfOpenProbes: fc.Breaker.HalfOpenProbes,
	}
	subs := make([]consumer.Subscription, 0, len(fc.Subscriptions))
	for i, fs := range fc.Subscriptions {
		where := fmt.Sprintf("%s: subscriptions[%d] (%q)", where, i, fs.Name)
		var secrets []string
		for _, env := range fs.SecretsEnv {
			v := os.Getenv(env)
			if v == "" {
				return nil, bs, fmt.Errorf("%s: secrets_env: environment variable %s is empty", where, env)
			}
			secrets = append(secrets, v)
		}
		for _, f := range fs.SecretsFile {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, bs, fmt.Errorf("%s: secrets_file: %w", where, err)
			}
			secrets = append(secrets, strings.TrimSpace(string(b)))
		}
		headers := map[string]string{}
		for k, v := range fs.Headers {
			headers[k] = v
		}
		for k, env := range fs.HeadersEnv {
			v := os.Getenv(env)
			if v == "" {
				return nil, bs, fmt.Errorf("%s: headers_env: environment variable %s for header %s is empty", where, env, k)
			}
			headers[k] = v
		}
		tlsf, err := tlsFiles(
			tlsFile{"tls.client_cert_file", fs.TLS.ClientCertFile},
			tlsFile{"tls.client_key_file", fs.TLS.ClientKeyFile},
			tlsFile{"tls.ca_file", fs.TLS.CAFile})
		if err != nil {
			return nil, bs, fmt.Errorf("%s: %w", where, err)
		}
		sub := consumer.Subscription{
			Name: fs.Name, FilterSubjects: fs.FilterSubjects, URL: fs.URL, Secrets: secrets,
			Scheme: webhook.Scheme(fs.Scheme), Body: consumer.BodyMode(fs.Body), Headers: headers,
			Timeout: time.Duration(fs.Timeout), AckWait: time.Duration(fs.AckWait),
			MaxDeliver: fs.MaxDeliver, MaxInFlight: fs.MaxInFlight, MaxAckPending: fs.MaxAckPending,
			RateLimit:    fs.RateLimit,
			AllowPrivate: fs.AllowPrivate, AllowHTTP: fs.AllowHTTP, TLS: tlsf,
			Ordering: consumer.Ordering(fs.Ordering), OnDeadLetter: consumer.DeadLetterPolicy(fs.OnDeadLetter),
			Start: fs.Start.Start,
		}
		for _, b := range fs.BackOff {
			sub.BackOff = append(sub.BackOff, time.Duration(b))
		}
		// Refused here, naming the file and the entry: an endpoint on
		// localhost or a private address without allow_private, say,
		// would otherwise dead-letter every event.
		if err := sub.Validate(); err != nil {
			return nil, bs, fmt.Errorf("%s: %w", where, withFlagHints(err))
		}
		subs = append(subs, sub)
	}
	return subs, bs, nil
}

// withFlagHints adds to a configuration error the flags and subscriptions
// file keys that change what it refuses: the library names its fields,
// the binary its flags.
func withFlagHints(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, consumer.ErrForbiddenAddress):
		return fmt.Errorf("%w (to allow it: --allow-private, or allow_private: true on the subscription in the subscriptions file)", err)
	case errors.Is(err, consumer.ErrPlainHTTP):
		return fmt.Errorf("%w (--allow-http, allow_http: true in the subscriptions file, for a public address; --allow-private, allow_private: true, for a private one)", err)
	}
	return err
}
