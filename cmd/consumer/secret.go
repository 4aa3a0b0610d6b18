package main

import (
	"fmt"
	"io"
	"os"

	"github.com/jsbridge/jsbridge/webhook"
)

// secretFields is the hint `consumer secret` gives for the subscriptions
// file: the fields of fileSubscription that take a secret (a test loads a
// file written as the hint says).
const secretFields = "secrets_env: [VAR] naming an environment variable that holds it, or secrets_file: [PATH] naming a file that holds it"

// secretCmd prints a new signing secret: what --secret (JSBRIDGE_SECRET)
// or a subscription's secrets take, and what the receiver verifies with.
type secretCmd struct {
	Ed25519 bool `name:"ed25519" help:"Print an ed25519 key pair instead (Standard Webhooks v1a): line 1 the whsk_ secret key the consumer signs with, line 2 the whpk_ public key receivers verify with."`
}

// Run prints the secret (or the key pair) to stdout, one per line, and
// what each is for to stderr, so $(consumer secret) is the secret alone.
func (c *secretCmd) Run() error {
	return c.write(os.Stdout, os.Stderr)
}

func (c *secretCmd) write(out, note io.Writer) error {
	if !c.Ed25519 {
		secret, err := webhook.GenerateSecret()
		if err != nil {
			return err
		}
		fmt.Fprintln(note, "# a Standard Webhooks HMAC secret (v1): give it to the consumer (JSBRIDGE_SECRET, or per subscription in the subscriptions file "+secretFields+") and to the receiver (webhook.NewVerifier); keep it secret")
		_, err = fmt.Fprintln(out, secret)
		return err
	}
	secretKey, publicKey, err := webhook.GenerateKeyPair()
	if err != nil {
		return err
	}
	fmt.Fprintln(note, "# a Standard Webhooks ed25519 key pair (v1a): line 1, the whsk_ secret key, is the consumer's alone (JSBRIDGE_SECRET, or per subscription in the subscriptions file "+secretFields+"); line 2, the whpk_ public key, is the receiver's (webhook.NewVerifier) and need not be secret")
	_, err = fmt.Fprintf(out, "%s\n%s\n", secretKey, publicKey)
	return err
}
