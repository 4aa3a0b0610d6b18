package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jsbridge/jsbridge/bridge"
)

// configFlags maps the fields of bridge.Config and bridge.VerifyConfig to
// the flags that set them: the library names fields, `bridge` names flags.
var configFlags = map[string]string{
	"Schema": "--schema", "EventsTable": "--events-table", "Stream": "--stream", "SubjectPrefix": "--subject-prefix",
	"Source": "--source", "DuplicateWindow": "--duplicate-window", "Replicas": "--replicas", "Owner": "--owner",
	"Lease": "--lease", "ClaimLimit": "--claim-limit", "FetchLimit": "--fetch-limit", "PollInterval": "--poll-interval",
	"MaxRetries": "--max-retries", "MaxInFlight": "--max-in-flight", "PublishTimeout": "--publish-timeout",
	"ShutdownGrace": "--shutdown-grace", "SettleTimeout": "--settle-timeout",
	"VerifyConfig.PageSize": "--page-size", "VerifyConfig.PublishTimeout": "--publish-timeout",
}

// flagNames prefixes an error wrapping bridge.ErrInvalidConfig with the
// flag that sets the field it names (`--lease: invalid bridge config:
// Lease 500µs is below 1ms`); other errors are returned as they are.
func flagNames(err error) error {
	if !errors.Is(err, bridge.ErrInvalidConfig) {
		return err
	}
	_, rest, ok := strings.Cut(err.Error(), bridge.ErrInvalidConfig.Error()+": ")
	if !ok {
		return err
	}
	field, _, _ := strings.Cut(rest, " ")
	if flag, ok := configFlags[field]; ok {
		return fmt.Errorf("%s: %w", flag, err)
	}
	return err
}
