package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
)

// shownSubscription is a subscription as get, list --json and export print
// it: the subscriptions file's keys (export's output imports back), the
// URL without userinfo and query and no secrets unless asked for.
type shownSubscription struct {
	Name           string            `yaml:"name" json:"name"`
	FilterSubjects []string          `yaml:"filter_subjects" json:"filter_subjects"`
	URL            string            `yaml:"url" json:"url"`
	Secrets        []string          `yaml:"secrets,omitempty" json:"secrets,omitempty"`
	SecretsFile    []string          `yaml:"secrets_file,omitempty" json:"secrets_file,omitempty"`
	Scheme         string            `yaml:"scheme,omitempty" json:"scheme,omitempty"`
	Body           string            `yaml:"body,omitempty" json:"body,omitempty"`
	Headers        map[string]string `yaml:"headers,omitempty" json:"headers,omitempty"`
	Timeout        string            `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	AckWait        string            `yaml:"ack_wait,omitempty" json:"ack_wait,omitempty"`
	MaxDeliver     int               `yaml:"max_deliver,omitempty" json:"max_deliver,omitempty"`
	BackOff        []string          `yaml:"backoff,omitempty" json:"backoff,omitempty"`
	MaxInFlight    int               `yaml:"max_in_flight,omitempty" json:"max_in_flight,omitempty"`
	MaxAckPending  int               `yaml:"max_ack_pending,omitempty" json:"max_ack_pending,omitempty"`
	RateLimit      float64           `yaml:"rate_limit,omitempty" json:"rate_limit,omitempty"`
	AllowPrivate   bool              `yaml:"allow_private,omitempty" json:"allow_private,omitempty"`
	AllowHTTP      bool              `yaml:"allow_http,omitempty" json:"allow_http,omitempty"`
	TLS            *fileTLS          `yaml:"tls,omitempty" json:"tls,omitempty"`
	Ordering       string            `yaml:"ordering,omitempty" json:"ordering,omitempty"`
	OnDeadLetter   string            `yaml:"on_dead_letter,omitempty" json:"on_dead_letter,omitempty"`
	Start          string            `yaml:"start,omitempty" json:"start,omitempty"`
}

// show is s as printed: with secrets (inline) and the full URL and header
// values only when reveal.
func show(s consumer.StoredSubscription, reveal bool) shownSubscription {
	v := shownSubscription{
		Name: s.Name, FilterSubjects: s.FilterSubjects, URL: breaker.Endpoint(s.URL), Scheme: string(s.Scheme), Body: string(s.Body),
		MaxDeliver: s.MaxDeliver, MaxInFlight: s.MaxInFlight, MaxAckPending: s.MaxAckPending, RateLimit: s.RateLimit,
		AllowPrivate: s.AllowPrivate, AllowHTTP: s.AllowHTTP, Ordering: string(s.Ordering), OnDeadLetter: string(s.OnDeadLetter),
	}
	if s.Start.Policy != "" {
		v.Start = s.Start.String()
	}
	if s.Timeout != 0 {
		v.Timeout = s.Timeout.String()
	}
	if s.AckWait != 0 {
		v.AckWait = s.AckWait.String()
	}
	for _, b := range s.BackOff {
		v.BackOff = append(v.BackOff, b.String())
	}
	if s.TLS != (consumer.TLSFiles{}) {
		v.TLS = &fileTLS{ClientCertFile: s.TLS.ClientCertFile, ClientKeyFile: s.TLS.ClientKeyFile, CAFile: s.TLS.CAFile}
	}
	if len(s.Headers) > 0 {
		v.Headers = map[string]string{}
		for k, h := range s.Headers {
			v.Headers[k] = "<redacted>"
			if reveal {
				v.Headers[k] = h
			}
		}
	}
	if reveal {
		v.URL, v.Secrets = s.URL, s.Secrets
	}
	return v
}

type subsGetCmd struct {
	storeFlags  `embed:""`
	Name        string `arg:"" help:"Subscription name."`
	JSON        bool   `name:"json" help:"Print JSON instead of YAML."`
	ShowSecrets bool   `name:"show-secrets" help:"Print the secrets, the full URL and the header values too (needs the secrets key)."`
	out         io.Writer
}

func (c *subsGetCmd) Run(ctx context.Context, g *Globals) error {
	keys, err := c.keyringFor(c.ShowSecrets)
	if err != nil {
		return err
	}
	nc, js, store, err := openStore(ctx, g, &c.storeFlags, keys)
	if err != nil {
		return err
	}
	defer nc.Close()
	s, err := store.Get(ctx, c.Name)
	if err != nil {
		return err
	}
	disabled, err := readDisabled(ctx, js)
	if err != nil {
		return err
	}
	w := out(c.out)
	l := listed(s, c.ShowSecrets, disabled)
	if c.JSON {
		return json.NewEncoder(w).Encode(l)
	}
	fmt.Fprintf(w, "# revision %d, %s, sealed with key %s, created %s, updated %s\n", s.Revision, state(s.Paused), s.KeyID,
		s.Created.Format(time.RFC3339), s.Updated.Format(time.RFC3339))
	if d := l.Disabled; d != nil {
		fmt.Fprintf(w, "# disabled (%s) since %s%s: nothing is sent to its endpoint until consumer subscriptions enable %s\n",
			d.Reason, d.Since.Format(time.RFC3339), lastErrorText(d.LastError), s.Name)
	}
	return yaml.NewEncoder(w).Encode(show(s, c.ShowSecrets))
}

// keyringFor reads the keys when reveal needs them (an error without);
// else none: reading needs no key.
func (f *storeFlags) keyringFor(reveal bool) (*consumer.SecretsKeyring, error) {
	if !reveal {
		return nil, nil
	}
	return f.needKeyring()
}

// listedSubscription is one line of list --json (and get --json).
type listedSubscription struct {
	Subscription shownSubscription `json:"subscription"`
	Paused       bool              `json:"paused"`
	// Disabled is set while the subscription is disabled (the key
	// disabled.<name> of the endpoint health bucket).
	Disabled *disabledState `json:"disabled,omitempty"`
	Revision uint64         `json:"revision"`
	KeyID    string         `json:"key_id"`
	Created  time.Time      `json:"created"`
	Updated  time.Time      `json:"updated"`
}

func listed(s consumer.StoredSubscription, reveal bool, disabled map[string]*disabledState) listedSubscription {
	return listedSubscription{Subscription: show(s, reveal), Paused: s.Paused, Disabled: disabled[s.Name],
		Revision: s.Revision, KeyID: s.KeyID, Created: s.Created, Updated: s.Updated}
}

type subsListCmd struct {
	storeFlags `embed:""`
	JSON       bool `name:"json" help:"One JSON object per line instead of a table."`
	out        io.Writer
}

func (c *subsListCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, store, err := openStore(ctx, g, &c.storeFlags, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	subs, err := store.List(ctx)
	if err != nil {
		return err
	}
	disabled, err := readDisabled(ctx, js)
	if err != nil {
		return err
	}
	w := out(c.out)
	if c.JSON {
		enc := json.NewEncoder(w)
		for _, s := range subs {
			if err := enc.Encode(listed(s, false, disabled)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tDISABLED\tORDERING\tFILTER\tENDPOINT\tREVISION\tKEY\tUPDATED")
	for _, s := range subs {
		ord := string(s.Ordering)
		if ord == "" {
			ord = string(consumer.DefaultOrdering)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.Name, state(s.Paused), disabled[s.Name].column(), ord, strings.Join(s.FilterSubjects, ","),
			breaker.Endpoint(s.URL), s.Revision, s.KeyID, s.Updated.Format(time.RFC3339))
	}
	return tw.Flush()
}

type subsExportCmd struct {
	storeFlags `embed:""`
	SecretsDir string `name:"secrets-dir" placeholder:"DIR" help:"Write each subscription's secrets to DIR/<name>.secret<N> (mode 0600) and refer to them with secrets_file, and print the full URL and header values, so that the output imports back (needs the secrets key). Default: no secrets, URL and header values redacted."`
	out        io.Writer
}

func (c *subsExportCmd) Run(ctx context.Context, g *Globals) error {
	reveal := c.SecretsDir != ""
	keys, err := c.keyringFor(reveal)
	if err != nil {
		return err
	}
	nc, _, store, err := openStore(ctx, g, &c.storeFlags, keys)
	if err != nil {
		return err
	}
	defer nc.Close()
	subs, err := store.List(ctx)
	if err != nil {
		return err
	}
	doc := struct {
		Subscriptions []shownSubscription `yaml:"subscriptions"`
	}{}
	for _, s := range subs {
		v := show(s, reveal)
		v.Secrets = nil
		if reveal {
			if err := os.MkdirAll(c.SecretsDir, 0o700); err != nil {
				return fmt.Errorf("--secrets-dir: %w", err)
			}
			for i, sec := range s.Secrets {
				p := filepath.Join(c.SecretsDir, fmt.Sprintf("%s.secret%d", s.Name, i))
				if err := os.WriteFile(p, []byte(sec+"\n"), 0o600); err != nil {
					return fmt.Errorf("--secrets-dir: %w", err)
				}
				v.SecretsFile = append(v.SecretsFile, p)
			}
		}
		doc.Subscriptions = append(doc.Subscriptions, v)
	}
	w := out(c.out)
	fmt.Fprintf(w, "# %d subscription(s) of bucket %s, exported %s", len(subs), store.Bucket(), time.Now().UTC().Format(time.RFC3339))
	if !reveal {
		fmt.Fprint(w, "; secrets, URL userinfo/query and header values withheld (--secrets-dir writes them)")
	}
	fmt.Fprintln(w)
	return yaml.NewEncoder(w).Encode(doc)
}
