package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/webhook"
)

// storeFlags say where the subscriptions bucket is and which keys seal
// its secrets; every `subscriptions` command and `run --subscriptions-from
// kv` take them.
type storeFlags struct {
	Bucket         string `name:"subscriptions-bucket" env:"JSBRIDGE_CONSUMER_SUBSCRIPTIONS_BUCKET" default:"${subscriptions_bucket}" help:"JetStream key-value bucket of the subscriptions managed at runtime; created on first use (default: ${default})."`
	BucketReplicas int    `name:"subscriptions-bucket-replicas" env:"JSBRIDGE_CONSUMER_SUBSCRIPTIONS_BUCKET_REPLICAS" default:"0" help:"Replica count of the subscriptions bucket when it is created; 0 follows --stream-replicas (default: ${default}, --stream-replicas)."`
	StreamReplicas int    `name:"stream-replicas" env:"JSBRIDGE_STREAM_REPLICAS" default:"1" help:"JetStream storage replica count (R) of what the consumer creates: the DLQ and attempts streams and the buckets (the subscriptions bucket too, unless --subscriptions-bucket-replicas is set); not a count of consumer processes: 1 on a standalone server, 3 on a cluster (at most the events stream's); existing ones keep their own, with a warning (default: ${default})."`
	SecretsKeyFile string `name:"secrets-key-file" env:"JSBRIDGE_CONSUMER_SECRETS_KEY_FILE" placeholder:"PATH" help:"File of the keys sealing the subscriptions' URLs, secrets and header values in the bucket, one <id>:<base64 32 bytes> per line (make one with subscriptions keygen); the first seals, all open (rotation: put the new key first) (default: none)."`
	SecretsKey     string `name:"secrets-key" env:"JSBRIDGE_CONSUMER_SECRETS_KEY" placeholder:"KEYS" help:"The keys of --secrets-key-file given inline, comma-separated; prefer the file or the environment variable: flags show in ps (default: none)."`
}

// storeConfig is the subscriptions bucket's configuration with keys: its
// replica count is --subscriptions-bucket-replicas when set, else
// --stream-replicas, so a bucket created on a cluster by `subscriptions
// add` keeps as many copies as the rest of what the consumer creates.
func (f *storeFlags) storeConfig(keys *consumer.SecretsKeyring) (consumer.SubscriptionStoreConfig, error) {
	replicas := f.BucketReplicas
	switch {
	case f.BucketReplicas < 0:
		return consumer.SubscriptionStoreConfig{}, fmt.Errorf("--subscriptions-bucket-replicas (JSBRIDGE_CONSUMER_SUBSCRIPTIONS_BUCKET_REPLICAS) %d: want 0 (follow --stream-replicas) or more", f.BucketReplicas)
	case f.BucketReplicas == 0 && f.StreamReplicas < 1:
		return consumer.SubscriptionStoreConfig{}, fmt.Errorf("--stream-replicas (JSBRIDGE_STREAM_REPLICAS) %d: want 1 or more", f.StreamReplicas)
	case f.BucketReplicas == 0:
		replicas = f.StreamReplicas
	}
	return consumer.SubscriptionStoreConfig{Bucket: f.Bucket, Replicas: replicas, Keys: keys}, nil
}

// keyring reads the keys; nil without any (reads are then redacted).
func (f *storeFlags) keyring() (*consumer.SecretsKeyring, error) {
	switch {
	case f.SecretsKeyFile != "":
		b, err := os.ReadFile(f.SecretsKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--secrets-key-file (JSBRIDGE_CONSUMER_SECRETS_KEY_FILE): %w", err)
		}
		k, err := consumer.ParseSecretsKeyring(string(b))
		if err != nil {
			return nil, fmt.Errorf("--secrets-key-file (JSBRIDGE_CONSUMER_SECRETS_KEY_FILE) %s: %w", f.SecretsKeyFile, err)
		}
		return k, nil
	case f.SecretsKey != "":
		k, err := consumer.ParseSecretsKeyring(f.SecretsKey)
		if err != nil {
			return nil, fmt.Errorf("--secrets-key (JSBRIDGE_CONSUMER_SECRETS_KEY): %w", err)
		}
		return k, nil
	}
	return nil, nil
}

// needKeyring is keyring, failing without keys.
func (f *storeFlags) needKeyring() (*consumer.SecretsKeyring, error) {
	k, err := f.keyring()
	if err == nil && k == nil {
		err = fmt.Errorf("%w: give --secrets-key-file (JSBRIDGE_CONSUMER_SECRETS_KEY_FILE) or JSBRIDGE_CONSUMER_SECRETS_KEY; make a key with: consumer subscriptions keygen", consumer.ErrNoSecretsKey)
	}
	return k, err
}

// subscriptionFields are a subscription's fields as flags, for add and
// update. Zero values mean: the engine's default (add), unchanged
// (update). Secrets come from files or environment variables; --secret
// itself is for tests and shows in ps.
type subscriptionFields struct {
	URL           string            `name:"url" help:"Endpoint URL (https, or http with --allow-http or --allow-private)."`
	Filter        []string          `name:"filter" help:"Filter subject(s), e.g. ${events_prefix}.order.>; repeatable or comma-separated."`
	SecretFile    []string          `name:"secret-file" placeholder:"PATH" help:"File holding a signing secret (whsec_ or whsk_); repeatable: several sign at once during a rotation. Replaces the stored secrets on update."`
	SecretEnv     []string          `name:"secret-env" placeholder:"VAR" help:"Environment variable holding a signing secret; repeatable, as --secret-file."`
	Secret        []string          `name:"secret" help:"A signing secret given inline (shows in ps: prefer --secret-file or --secret-env)."`
	Scheme        string            `name:"scheme" enum:",standard,hmac-sha256" default:"" help:"Signature scheme: standard or hmac-sha256 (default on add: standard)."`
	Body          string            `name:"body" enum:",structured,binary" default:"" help:"Body mode: structured or binary (default on add: structured)."`
	Header        map[string]string `name:"header" placeholder:"NAME=VALUE" help:"Extra request header; repeatable. Replaces the stored headers on update. Values are sealed like secrets."`
	HeaderEnv     map[string]string `name:"header-env" placeholder:"NAME=VAR" help:"Extra request header whose value is read from the environment variable VAR (the file's headers_env); repeatable, with --header. Replaces the stored headers on update."`
	Timeout       time.Duration     `name:"timeout" help:"Request timeout of one POST (default on add: 10s)."`
	AckWait       time.Duration     `name:"ack-wait" help:"Deprecated, ignored and not stored: the shared engine acks nothing, so nothing is redelivered after a wait. Removed in the next release."`
	MaxDeliver    int               `name:"max-deliver" help:"Attempts per event; -1: no limit (default on add: 10)."`
	BackOff       []time.Duration   `name:"backoff" help:"Delays before each retry; the last repeats (default on add: 1s,5s,30s,2m,5m)."`
	MaxInFlight   int               `name:"max-in-flight" help:"Concurrent deliveries per replica (default on add: 64)."`
	MaxAckPending int               `name:"max-ack-pending" help:"JetStream MaxAckPending (default on add: 1000, or --max-in-flight when larger)."`
	RateLimit     float64           `name:"rate-limit" placeholder:"PER_SECOND" help:"Most POSTs per second to the endpoint, per replica (the file's rate_limit); a 429 (or 503 with Retry-After) lowers it for a while (default on add: no limit)."`
	AllowPrivate  bool              `name:"allow-private" help:"Let the endpoint be on a loopback, private or link-local address, over plain http."`
	AllowHTTP     bool              `name:"allow-http" help:"Let the endpoint use plain http on a public address."`
	TLSClientCert string            `name:"tls-client-cert" placeholder:"PATH" help:"PEM client certificate for mutual TLS (a path on every replica); needs --tls-client-key."`
	TLSClientKey  string            `name:"tls-client-key" placeholder:"PATH" help:"PEM private key of --tls-client-cert (a path on every replica)."`
	TLSCA         string            `name:"tls-ca" placeholder:"PATH" help:"PEM CA bundle verifying the endpoint's certificate (a path on every replica)."`
	Ordering      string            `name:"ordering" enum:",stream,none" default:"" help:"stream (each source stream in order) or none (maximum parallelism) (default on add: stream)."`
	OnDeadLetter  string            `name:"on-dead-letter" enum:",park,skip" default:"" help:"With ordering stream: park or skip (default on add: park)."`
	Start         string            `name:"start" placeholder:"WHERE" help:"Where its durable consumers begin: new, all, time:<RFC 3339> or sequence:<n> (default on add: the events stream's next sequence, so every event stored from the add on; on update it cannot change)."`
}

// secrets reads the secrets the flags give, naming the flag and the file
// or variable on error; none when no secret flag is given.
func (f *subscriptionFields) secrets() ([]string, error) {
	out := append([]string(nil), f.Secret...)
	for _, p := range f.SecretFile {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
		out = append(out, strings.TrimSpace(string(b)))
	}
	for _, env := range f.SecretEnv {
		v := os.Getenv(env)
		if v == "" {
			return nil, fmt.Errorf("--secret-env: environment variable %s is empty", env)
		}
		out = append(out, v)
	}
	return out, nil
}

// apply sets on s every field the flags give (non-zero).
func (f *subscriptionFields) apply(s *consumer.Subscription) error {
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&s.URL, f.URL)
	var filters []string
	for _, v := range f.Filter {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				filters = append(filters, p)
			}
		}
	}
	if len(filters) > 0 {
		s.FilterSubjects = filters
	}
	secrets, err := f.secrets()
	if err != nil {
		return err
	}
	if len(secrets) > 0 {
		s.Secrets = secrets
	}
	if f.Scheme != "" {
		s.Scheme = webhook.Scheme(f.Scheme)
	}
	if f.Body != "" {
		s.Body = consumer.BodyMode(f.Body)
	}
	if len(f.Header) > 0 || len(f.HeaderEnv) > 0 {
		headers := map[string]string{}
		for k, v := range f.Header {
			headers[k] = v
		}
		for k, env := range f.HeaderEnv {
			v := os.Getenv(env)
			if v == "" {
				return fmt.Errorf("--header-env: environment variable %s for header %s is empty", env, k)
			}
			headers[k] = v
		}
		s.Headers = headers
	}
	if f.Timeout != 0 {
		s.Timeout = f.Timeout
	}
	if f.AckWait != 0 {
		s.AckWait = f.AckWait
	}
	if f.MaxDeliver != 0 {
		s.MaxDeliver = f.MaxDeliver
	}
	if len(f.BackOff) > 0 {
		s.BackOff = f.BackOff
	}
	if f.MaxInFlight != 0 {
		s.MaxInFlight = f.MaxInFlight
	}
	if f.MaxAckPending != 0 {
		s.MaxAckPending = f.MaxAckPending
	}
	if f.RateLimit != 0 {
		s.RateLimit = f.RateLimit
	}
	s.AllowPrivate = s.AllowPrivate || f.AllowPrivate
	s.AllowHTTP = s.AllowHTTP || f.AllowHTTP
	if f.TLSClientCert != "" || f.TLSClientKey != "" || f.TLSCA != "" {
		tlsf, err := tlsFiles(tlsFile{"--tls-client-cert", f.TLSClientCert}, tlsFile{"--tls-client-key", f.TLSClientKey}, tlsFile{"--tls-ca", f.TLSCA})
		if err != nil {
			return err
		}
		s.TLS = tlsf
	}
	if f.Ordering != "" {
		s.Ordering = consumer.Ordering(f.Ordering)
	}
	if f.OnDeadLetter != "" {
		s.OnDeadLetter = consumer.DeadLetterPolicy(f.OnDeadLetter)
	}
	if f.Start != "" {
		st, err := consumer.ParseStart(f.Start)
		if err != nil {
			return fmt.Errorf("--start: %w", err)
		}
		s.Start = st
	}
	return nil
}

// fromFile reads the one subscription of a subscriptions file (YAML or
// JSON, the --config format: a subscriptions: list), or the one named
// name when it holds several.
func fromFile(path, name string) (consumer.Subscription, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return consumer.Subscription{}, fmt.Errorf("--file: %w", err)
	}
	subs, _, err := parseSubscriptions(raw, "--file "+path)
	if err != nil {
		return consumer.Subscription{}, withFlagHints(err)
	}
	if len(subs) == 1 && (name == "" || subs[0].Name == name) {
		return subs[0], nil
	}
	for _, s := range subs {
		if s.Name == name {
			return s, nil
		}
	}
	if name == "" {
		return consumer.Subscription{}, fmt.Errorf("--file %s: %d subscriptions: name the one to use, or use subscriptions import", path, len(subs))
	}
	return consumer.Subscription{}, fmt.Errorf("--file %s: no subscription named %q", path, name)
}

// errConflictHint adds what to do to a conflict.
func errConflictHint(err error) error {
	if errors.Is(err, consumer.ErrConflict) {
		return fmt.Errorf("%w (another operator changed it: run subscriptions get, then redo the change)", err)
	}
	return withFlagHints(err)
}
