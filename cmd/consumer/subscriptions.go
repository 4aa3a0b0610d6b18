package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
)

// subscriptionsCmd manages the subscriptions bucket: replicas run with
// --subscriptions-from kv apply every change within about a second
// (docs/subscriptions-kv.md).
type subscriptionsCmd struct {
	Add    subsAddCmd    `cmd:"" help:"Add a subscription (from flags, or one from a YAML/JSON --file); it starts on every replica, by default with the events stored from the add on."`
	Update subsUpdateCmd `cmd:"" help:"Change a subscription: the flags given replace those fields (or --file replaces it all); compare-and-set on its revision."`
	Get    subsGetCmd    `cmd:"" help:"Show a subscription (secrets and header values redacted) and, when it is disabled, why and since when."`
	List   subsListCmd   `cmd:"" help:"List the subscriptions: name, state, disabled (reason and since, from the endpoint health bucket), ordering, filters, endpoint, revision, key id, last change."`
	Delete subsDeleteCmd `cmd:"" help:"Delete a subscription: every replica stops it and its durable consumers are deleted."`
	Pause  subsPauseCmd  `cmd:"" help:"Pause a subscription: replicas stop pulling, its durable consumers keep their position."`
	Resume subsResumeCmd `cmd:"" help:"Resume a paused subscription where it stopped."`
	Import subsImportCmd `cmd:"" help:"Add or replace the subscriptions of a subscriptions file (the --config YAML) in the bucket."`
	Export subsExportCmd `cmd:"" help:"Print the bucket's subscriptions as a subscriptions file (YAML); secrets only into files of --secrets-dir."`
	Keygen subsKeygenCmd `cmd:"" help:"Print a new key line for --secrets-key-file."`
	Reseal subsResealCmd `cmd:"" help:"Seal every subscription again with the first key of --secrets-key-file (after a key rotation), each at its revision."`

	// Enable and disable (health.go): the endpoint's disabled state.
	subscriptionsHealthCmds `embed:""`
}

// startOfAdd is the start of a subscription added without one: the
// events stream's next sequence, so that every event stored from the add
// on is delivered, whenever the replicas apply it (a sequence is the
// server's, where a time would be this machine's clock); the time of the
// add when the events stream does not exist yet.
func startOfAdd(ctx context.Context, js jetstream.JetStream, stream string) (consumer.Start, error) {
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return consumer.StartAtTime(time.Now().UTC()), nil
	}
	if err != nil {
		return consumer.Start{}, fmt.Errorf("JetStream stream %s: %w", stream, err)
	}
	return consumer.StartAtSequence(s.CachedInfo().State.LastSeq + 1), nil
}

// openStore connects and opens the bucket with f's keys (nil: redacted);
// close the connection after use.
func openStore(ctx context.Context, g *Globals, f *storeFlags, keys *consumer.SecretsKeyring) (*nats.Conn, jetstream.JetStream, *consumer.SubscriptionStore, error) {
	nc, js, err := connect(g)
	if err != nil {
		return nil, nil, nil, err
	}
	scfg, err := f.storeConfig(keys)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	s, err := consumer.OpenSubscriptionStore(ctx, js, scfg)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return nc, js, s, nil
}

type subsAddCmd struct {
	storeFlags         `embed:""`
	subscriptionFields `embed:""`
	Name               string `arg:"" optional:"" help:"Subscription name ([A-Za-z0-9_-]+), also its durable consumer's; with --file, which of its subscriptions."`
	File               string `name:"file" short:"f" type:"existingfile" help:"Subscriptions file (YAML or JSON, the --config format) holding the subscription; flags given override its fields."`
	Paused             bool   `name:"paused" help:"Add it paused."`

	out io.Writer // stdout; tests set it
}

func (c *subsAddCmd) Run(ctx context.Context, g *Globals) error {
	keys, err := c.needKeyring()
	if err != nil {
		return err
	}
	var s consumer.Subscription
	if c.File != "" {
		if s, err = fromFile(c.File, c.Name); err != nil {
			return err
		}
	}
	if c.Name != "" {
		s.Name = c.Name
	}
	startGiven := c.Start != "" || (c.File != "" && s.Start.Policy != "")
	if err := c.apply(&s); err != nil {
		return err
	}
	nc, js, store, err := openStore(ctx, g, &c.storeFlags, keys)
	if err != nil {
		return err
	}
	defer nc.Close()
	if !startGiven {
		if s.Start, err = startOfAdd(ctx, js, g.Stream); err != nil {
			return err
		}
	}
	rev, err := store.Create(ctx, s, c.Paused)
	if err != nil {
		return errConflictHint(err)
	}
	fmt.Fprintf(out(c.out), "subscription %s added (revision %d, start %s, %s)\n", s.Name, rev, s.Start, state(c.Paused))
	return nil
}

type subsUpdateCmd struct {
	storeFlags         `embed:""`
	subscriptionFields `embed:""`
	Name               string `arg:"" help:"Subscription name."`
	File               string `name:"file" short:"f" type:"existingfile" help:"Subscriptions file holding the subscription's new version (secrets included); flags given override its fields. Its start must be the stored one."`
	Revision           uint64 `name:"revision" help:"Update only if the subscription is still at this revision (from get or list); default: the revision read now."`

	out io.Writer
}

func (c *subsUpdateCmd) Run(ctx context.Context, g *Globals) error {
	keys, err := c.needKeyring()
	if err != nil {
		return err
	}
	nc, _, store, err := openStore(ctx, g, &c.storeFlags, keys)
	if err != nil {
		return err
	}
	defer nc.Close()
	cur, err := store.Get(ctx, c.Name)
	if err != nil {
		return err
	}
	s := cur.Subscription
	if c.File != "" {
		if s, err = fromFile(c.File, c.Name); err != nil {
			return err
		}
		s.Name = c.Name
		if s.Start.Policy == "" {
			s.Start = cur.Start
		}
	}
	if err := c.apply(&s); err != nil {
		return err
	}
	if s.Start.String() != cur.Start.String() {
		return fmt.Errorf("--start %q: subscription %q was created with start %q, which applies only when its durable consumers are created; to start elsewhere, delete it and add it again", s.Start, c.Name, cur.Start)
	}
	rev := c.Revision
	if rev == 0 {
		rev = cur.Revision
	}
	n, err := store.Update(ctx, s, cur.Paused, rev)
	if err != nil {
		return errConflictHint(err)
	}
	fmt.Fprintf(out(c.out), "subscription %s updated (revision %d)\n", c.Name, n)
	return nil
}

type subsPauseCmd struct {
	storeFlags `embed:""`
	Name       string `arg:"" help:"Subscription name."`
	out        io.Writer
}

func (c *subsPauseCmd) Run(ctx context.Context, g *Globals) error {
	return setPaused(ctx, g, &c.storeFlags, c.Name, true, c.out)
}

type subsResumeCmd struct {
	storeFlags `embed:""`
	Name       string `arg:"" help:"Subscription name."`
	out        io.Writer
}

func (c *subsResumeCmd) Run(ctx context.Context, g *Globals) error {
	return setPaused(ctx, g, &c.storeFlags, c.Name, false, c.out)
}

func setPaused(ctx context.Context, g *Globals, f *storeFlags, name string, paused bool, w io.Writer) error {
	nc, _, store, err := openStore(ctx, g, f, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	rev, err := store.SetPaused(ctx, name, paused, 0)
	if err != nil {
		return errConflictHint(err)
	}
	fmt.Fprintf(out(w), "subscription %s %s (revision %d)\n", name, state(paused), rev)
	return nil
}

type subsDeleteCmd struct {
	storeFlags `embed:""`
	Name       string `arg:"" help:"Subscription name."`
	Revision   uint64 `name:"revision" help:"Delete only if the subscription is still at this revision; default: whatever its revision."`
	out        io.Writer
}

func (c *subsDeleteCmd) Run(ctx context.Context, g *Globals) error {
	nc, _, store, err := openStore(ctx, g, &c.storeFlags, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := store.Delete(ctx, c.Name, c.Revision); err != nil {
		return errConflictHint(err)
	}
	fmt.Fprintf(out(c.out), "subscription %s deleted: the replicas stop it and delete its durable consumers\n", c.Name)
	return nil
}

type subsImportCmd struct {
	storeFlags `embed:""`
	File       string `arg:"" type:"existingfile" help:"Subscriptions file (the --config YAML, or JSON)."`
	out        io.Writer
}

// Run adds each subscription of the file, or replaces it when it exists
// (keeping its paused state; its start must be the stored one). Each is
// its own write: on an error, those before it are in the bucket.
func (c *subsImportCmd) Run(ctx context.Context, g *Globals) error {
	keys, err := c.needKeyring()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(c.File)
	if err != nil {
		return err
	}
	subs, _, err := parseSubscriptions(raw, c.File)
	if err != nil {
		return withFlagHints(err)
	}
	nc, _, store, err := openStore(ctx, g, &c.storeFlags, keys)
	if err != nil {
		return err
	}
	defer nc.Close()
	for _, s := range subs {
		cur, err := store.Get(ctx, s.Name)
		switch {
		case errors.Is(err, consumer.ErrSubscriptionNotFound):
			rev, err := store.Create(ctx, s, false)
			if err != nil {
				return fmt.Errorf("%s: %w", c.File, errConflictHint(err))
			}
			fmt.Fprintf(out(c.out), "subscription %s added (revision %d)\n", s.Name, rev)
		case err != nil:
			return err
		default:
			if s.Start.Policy == "" {
				s.Start = cur.Start // a start applies only at creation
			}
			rev, err := store.Update(ctx, s, cur.Paused, cur.Revision)
			if err != nil {
				return fmt.Errorf("%s: %w", c.File, errConflictHint(err))
			}
			fmt.Fprintf(out(c.out), "subscription %s replaced (revision %d)\n", s.Name, rev)
		}
	}
	return nil
}

type subsKeygenCmd struct {
	ID  string `name:"id" help:"Key id stored beside each sealed secret (default: k<UTC date and time>)."`
	out io.Writer
}

func (c *subsKeygenCmd) Run() error {
	id := c.ID
	if id == "" {
		id = "k" + time.Now().UTC().Format("20060102T150405")
	}
	line, err := consumer.GenerateSecretsKey(id)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "# a key sealing the subscriptions' secrets in the bucket: give it to every replica and operator (--secrets-key-file), first in the file; keep older keys after it until every subscription was written again")
	_, err = fmt.Fprintln(out(c.out), line)
	return err
}

func out(w io.Writer) io.Writer {
	if w == nil {
		return os.Stdout
	}
	return w
}

func state(paused bool) string {
	if paused {
		return "paused"
	}
	return "running"
}

type subsResealCmd struct {
	storeFlags `embed:""`
	out        io.Writer
}

// Run writes every subscription sealed with another key than the current
// one again, at the revision read (a subscription changed meanwhile is
// sealed by that change already, or by a second reseal).
func (c *subsResealCmd) Run(ctx context.Context, g *Globals) error {
	keys, err := c.needKeyring()
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
	n := 0
	for _, s := range subs {
		if s.KeyID == keys.Current() {
			continue
		}
		if _, err := store.Update(ctx, s.Subscription, s.Paused, s.Revision); err != nil {
			return errConflictHint(err)
		}
		n++
		fmt.Fprintf(out(c.out), "subscription %s: sealed with key %s (was %s)\n", s.Name, keys.Current(), s.KeyID)
	}
	fmt.Fprintf(out(c.out), "reseal: %d of %d subscription(s) sealed again with key %s\n", n, len(subs), keys.Current())
	return nil
}
