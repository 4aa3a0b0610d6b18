package otelenv

import (
	"context"
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func TestRead(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  map[string]string
		on   bool
		err  bool
	}{
		{"nothing set: off", nil, false, false},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, false},
		{"endpoint alone turns it on", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true, false},
		{"traces endpoint alone", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true, false},
		{"none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false, false},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false, false},
		{"http/protobuf", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, true, false},
		{"grpc refused", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, true},
		{"traces protocol overrides", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, false},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := Read(func(k string) string { return tc.env[k] })
			if tc.err {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("Read = %+v, %v; want ErrUnsupported", s, err)
				}
				return
			}
			if err != nil || s.On != tc.on || s.Why == "" {
				t.Fatalf("Read = %+v, %v; want on=%v with a reason", s, err, tc.on)
			}
		})
	}
}

func TestTracerProviderOffIsNoop(t *testing.T) {
	t.Parallel()
	tp, shutdown, s, err := TracerProvider(context.Background(), "test", func(string) string { return "" })
	if err != nil || s.On {
		t.Fatalf("TracerProvider = %+v, %v", s, err)
	}
	_, span := tp.Tracer("x").Start(context.Background(), "s")
	if span.IsRecording() {
		t.Error("the default provider records spans")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestTracerProviderOnIsSDK(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
	tp, shutdown, s, err := TracerProvider(context.Background(), "test", func(k string) string { return env[k] })
	if err != nil || !s.On {
		t.Fatalf("TracerProvider = %+v, %v", s, err)
	}
	if _, ok := tp.(*sdktrace.TracerProvider); !ok {
		t.Fatalf("provider is %T, want the SDK's", tp)
	}
	_, span := tp.Tracer("x").Start(context.Background(), "s")
	if !span.IsRecording() {
		t.Error("the SDK provider does not record")
	}
	span.End()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a collector that is not there must not hold up the exit
	_ = shutdown(ctx)
}
