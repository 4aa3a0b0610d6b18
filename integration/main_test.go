package integration

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

var (
	binDir   string
	buildErr error
)

// TestMain builds the binaries the tests run as processes before any test
// starts, so the build never eats into a test's own timeout. Started with
// envServeNATSDir set, the test binary is a NATS server instead (see
// natsProc); with envServeNodeName set, a node of a JetStream cluster (see
// natsCluster).
//
// Every test here is of the process-level tier (processes, SIGKILL and
// SIGSTOP, clusters, a Postgres standby, waits of seconds): with -short
// (`make test-short`, the quick tier) the package builds nothing and runs
// nothing, and says so.
func TestMain(m *testing.M) {
	if os.Getenv(envServeNodeName) != "" {
		os.Exit(serveNATSNode())
	}
	if dir := os.Getenv(envServeNATSDir); dir != "" {
		os.Exit(serveNATS(dir, os.Getenv(envServeNATSPort)))
	}
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration: process-level tests, not run with -short (make test runs them)")
		os.Exit(0)
	}
	binDir, buildErr = buildBinaries()
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinaries builds bridge and consumer as `make image` and deploy's
// tests build them: static (CGO_ENABLED=0) and -trimpath. make test runs
// this package's and deploy's test binaries with the same two settings,
// so a cold build cache compiles the commands' packages once for all of
// them rather than once per setting (the race tier's are apart anyway).
func buildBinaries() (string, error) {
	dir, err := os.MkdirTemp("", "jsbridge-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "../cmd/bridge", "../cmd/consumer")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return dir, fmt.Errorf("go build: %v\n%s", err, out.String())
	}
	return dir, nil
}
