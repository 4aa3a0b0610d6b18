package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/store"
)

// configFlags maps the fields of bridge.Config and bridge.VerifyConfig,
// and the store's options, to the flags that set them: the libraries name
// fields and options, `bridge` names flags.
var configFlags = map[string]string{
	"Config.Schema": "--schema", "Config.EventsTable": "--events-table", "Config.Stream": "--stream",
	"Config.SubjectPrefix": "--subject-prefix", "Config.Source": "--source", "Config.DuplicateWindow": "--duplicate-window",
	"Config.Replicas": "--stream-replicas", "Config.MaxAge": "--max-age", "Config.MaxBytes": "--max-bytes", "Config.MaxMsgsPerSubject": "--max-msgs-per-subject", "Config.Compress": "--compression",
	"Config.Owner": "--owner", "Config.Lease": "--lease", "Config.ClaimLimit": "--claim-limit",
	"Config.FetchLimit": "--fetch-limit", "Config.PollInterval": "--poll-interval", "Config.Linger": "--linger", "Config.MaxRetries": "--max-retries",
	"Config.MaxInFlight": "--max-in-flight", "Config.PublishTimeout": "--publish-timeout",
	"Config.ShutdownGrace": "--shutdown-grace", "Config.SettleTimeout": "--settle-timeout",
	"VerifyConfig.PageSize": "--page-size", "VerifyConfig.PublishTimeout": "--publish-timeout",
	"VerifyConfig.Stream": "--jetstream-stream", "VerifyConfig.SubjectPrefix": "--subject-prefix", "VerifyConfig.Source": "--source",
	"WithSchema": "--schema", "WithEventsTable": "--events-table",
}

// configField finds the field or option a configuration error names.
var configField = regexp.MustCompile(`\b(?:Config\.|VerifyConfig\.)?[A-Z]\w*|\bWith[A-Z]\w*`)

// flagNames prefixes an error wrapping bridge.ErrInvalidConfig or
// store.ErrInvalidConfig with the flag that sets the field or option it
// names (`--lease: invalid bridge config: Config.Lease 500µs is below
// 1ms`); other errors are returned as they are.
func flagNames(err error) error {
	var sentinel error
	switch {
	case errors.Is(err, bridge.ErrInvalidConfig):
		sentinel = bridge.ErrInvalidConfig
	case errors.Is(err, store.ErrInvalidConfig):
		sentinel = store.ErrInvalidConfig
	default:
		return err
	}
	_, rest, ok := strings.Cut(err.Error(), sentinel.Error()+": ")
	if !ok {
		return err
	}
	for _, name := range configField.FindAllString(rest, -1) {
		if flag, ok := configFlags[name]; ok {
			return fmt.Errorf("%s: %w", flag, err)
		}
	}
	return err
}
