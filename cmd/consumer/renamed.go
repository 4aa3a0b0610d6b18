package main

import "github.com/jsbridge/jsbridge/internal/ops"

// renamed are the flags and environment variables renamed in this
// release; the old names are accepted until the next one, with a warning.
// --replicas read as a count of consumer processes; JSBRIDGE_OPS_ADDR and
// JSBRIDGE_MAX_IN_FLIGHT meant different things to the bridge, so one
// environment file for both binaries set one of them wrong.
var renamed = []ops.Renamed{
	{Old: "--replicas", New: "--stream-replicas", Also: "JSBRIDGE_STREAM_REPLICAS"},
	{Old: "JSBRIDGE_REPLICAS", New: "JSBRIDGE_STREAM_REPLICAS", Also: "--stream-replicas"},
	{Old: "JSBRIDGE_OPS_ADDR", New: "JSBRIDGE_CONSUMER_OPS_ADDR", Also: "--ops-addr"},
	{Old: "JSBRIDGE_MAX_IN_FLIGHT", New: "JSBRIDGE_CONSUMER_MAX_IN_FLIGHT", Also: "--max-in-flight"},
}
