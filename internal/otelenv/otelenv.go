// Package otelenv turns the standard OpenTelemetry environment variables
// into the tracer provider the binaries hand to the bridge and the
// consumer. Only cmd/ imports it: it pulls in the SDK and the OTLP/HTTP
// exporter, which the public packages never do.
package otelenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ErrUnsupported is returned (wrapped) by TracerProvider for an exporter or
// OTLP protocol this build does not include; the error names the variable
// and its value.
var ErrUnsupported = errors.New("unsupported OpenTelemetry setting")

// Settings is what the environment asks for.
type Settings struct {
	// On is whether spans are exported.
	On bool
	// Why says what turned exporting on or left it off, for the start-up
	// log, e.g. "OTEL_TRACES_EXPORTER=otlp".
	Why string
}

// Read decides from getenv (os.Getenv in the binaries) whether traces are
// exported. Off by default. On when OTEL_TRACES_EXPORTER is "otlp", or
// when it is unset and OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set. Off when OTEL_SDK_DISABLED is
// "true" or OTEL_TRACES_EXPORTER is "none". Any other exporter, and an OTLP
// protocol other than http/protobuf (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
// else OTEL_EXPORTER_OTLP_PROTOCOL), is an error wrapping ErrUnsupported.
func Read(getenv func(string) string) (Settings, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return Settings{Why: "OTEL_SDK_DISABLED=true"}, nil
	}
	exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	var s Settings
	switch exp {
	case "none":
		return Settings{Why: "OTEL_TRACES_EXPORTER=none"}, nil
	case "otlp":
		s = Settings{On: true, Why: "OTEL_TRACES_EXPORTER=otlp"}
	case "":
		for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
			if getenv(k) != "" {
				s = Settings{On: true, Why: k + " is set"}
				break
			}
		}
		if !s.On {
			return Settings{Why: "no OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT"}, nil
		}
	default:
		return Settings{}, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q: want otlp or none", ErrUnsupported, exp)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		v := strings.TrimSpace(getenv(k))
		if v == "" {
			continue
		}
		if v != "http/protobuf" {
			return Settings{}, fmt.Errorf("%w: %s=%q: this build exports OTLP over http/protobuf only (port 4318)", ErrUnsupported, k, v)
		}
		break
	}
	return s, nil
}

// TracerProvider returns the tracer provider the environment asks for (see
// Read) and a shutdown that flushes the spans still batched (call it on
// exit, with a deadline). Off, it is a no-op provider and shutdown does
// nothing. On, it is an SDK provider with a batch span processor
// (OTEL_BSP_* apply), the sampler of OTEL_TRACES_SAMPLER (default: parent
// based, always on), the resource of OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES (service.name defaults to service), and an
// OTLP/HTTP exporter configured by OTEL_EXPORTER_OTLP_* (endpoint, headers,
// timeout, certificates). The exporter connects lazily: a collector that
// is down loses spans, never blocks or fails the process.
func TracerProvider(ctx context.Context, service string, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, Settings, error) {
	s, err := Read(getenv)
	if err != nil || !s.On {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, s, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, s, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName(service)),
		resource.Environment(),
	)
	if err != nil {
		return nil, nil, s, fmt.Errorf("OpenTelemetry resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, s, nil
}

// Start is TracerProvider from the process environment for a binary: it
// logs whether spans are exported and why, and returns a stop that flushes
// the spans still batched (at most 5 s; a collector that is down loses
// them, with a warning).
func Start(ctx context.Context, service string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	tp, shutdown, s, err := TracerProvider(ctx, service, os.Getenv)
	if err != nil {
		return nil, nil, err
	}
	log.Info("tracing", "export", s.On, "why", s.Why)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("tracing: spans not flushed at exit", "error", err)
		}
	}, nil
}
