# jsbridge: `make run` shows the main job on one machine, `make test` runs
# every test (starting the throwaway local Postgres itself).
GO      ?= go
N       ?= 20000
RATE    ?= 30
# NATS_PORT: the embedded NATS server's port in `make run` (default 4222, so
# the nats CLI finds it); set it when 4222 is taken.
NATS_PORT ?=
# CLUSTER: run JetStream as an in-process cluster of this many nodes (e.g.
# CLUSTER=3, streams and consumers R3) instead of the bridge's embedded server.
CLUSTER ?=
BIN     := bin
# VERSION, COMMIT, DATE: what `bridge version` prints for a `make build`
# (release archives get them from goreleaser; see .goreleaser.yaml).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BUILDINFO := github.com/jsbridge/jsbridge/internal/buildinfo
LDFLAGS := -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT) -X $(BUILDINFO).date=$(DATE)

.PHONY: all build run demo test test-short soak bench bench-live bench-go vet docs pg-start pg-stop nats-cli clean release-snapshot image

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/bridge ./cmd/consumer ./examples/demo ./bench

## run: Postgres + bridge (embedded JetStream) + consumer + example receiver + producer, until Ctrl-C
run: build
	@$(BIN)/demo -mode run -rate $(RATE) -bin $(BIN) $(if $(NATS_PORT),-nats-port $(NATS_PORT)) $(if $(CLUSTER),-cluster $(CLUSTER))

## demo: the same for N events, then verify every one arrived once and in order
demo: build
	@$(BIN)/demo -mode check -n $(N) -bin $(BIN) -quiet $(if $(CLUSTER),-cluster $(CLUSTER))

# RACE_FIRST: the race tier's slowest packages (go test -json's elapsed, warm: internal/deliver 95-174 s,
# cmd/consumer 48 s, store and bridge 26 s each), named before the rest. go test starts test binaries
# strictly in the order of its package list, so, listed alphabetically, internal/deliver (the tier's
# critical path) started only after the 19 packages before it had built and started: 212 s into a
# 427 s tier. go test drops the second mention of a package.
RACE_FIRST := ./internal/deliver ./cmd/consumer ./store ./bridge ./drain ./webhook/pgstore

# NONRACE: how make test runs the tests without the race detector (integration/, the 1,000-subscription
# test, deploy/): built as the commands those tests start are built (static and -trimpath: integration's
# buildBinaries, deploy's staticBin, make image), so that a cold build cache compiles those packages
# once for the test binaries and the commands, not once per setting.
NONRACE := CGO_ENABLED=0 $(GO) test -trimpath

# SUBMAKE: make itself, named through a variable of its own so that `make -n test` only prints the test
# recipe: GNU make runs a recipe line that names $(MAKE) directly even under -n, which ran every test.
SUBMAKE = $(MAKE)

## test: every test (both tiers) against a real Postgres and JetStream: every package with the race
## detector, then integration/'s process-level tests without it. Those test the built binaries (not
## race-built) from outside; in their test process the race detector instruments only the embedded
## nats-server and the harness, at 4.4x the CPU (186 s vs 42 s for two replica tests), which starved the
## processes under test on 2 cores (an ordered test stalled at load 20). Then, without it too, the
## 1,000-subscription test, which skips under -race (1,000 pull consumers' heartbeats outrun a
## race-instrumented server). Last, deploy/ (the chart through helm's own packages, the image under runc,
## which scripts/runc installs, the compose file), without -race too: its tests run built binaries.
## PRECOMPILE: while the race tier runs, what the tests after it need (their test binaries, and the two
## commands integration/ builds) compiles beside it at the lowest priority, on the CPU the race tier's
## waiting tests leave idle; the race tier's end waits for it. On a cold build cache that takes the
## non-race compile (about 580 CPU-s) off the critical path; warm it costs a few links.
## The 30 min timeout is per test binary.
PRECOMPILE := CGO_ENABLED=0 nice -n 19 $(GO) test -trimpath -count=1 -run '^$$' ./integration/ ./deploy/ ./cmd/consumer/
test:
	@gobin=$$(scripts/need) && export PATH=$$gobin:$$PATH && url=$$(scripts/pg start) && export JSBRIDGE_TEST_DATABASE_URL=$$url && rc=0 && \
	{ $(PRECOMPILE) >/dev/null 2>&1 & pre=$$!; } && \
	$(GO) test -race -timeout 30m -count=1 $(RACE_FIRST) $$($(GO) list ./... | grep -v '/integration$$' | grep -v '/deploy$$') || rc=1; \
	wait $$pre; \
	$(NONRACE) -timeout 30m -count=1 ./integration/ || rc=1; \
	$(NONRACE) -timeout 30m -count=1 -run '^TestThousandSubscriptionsThroughTheCLI$$' ./cmd/consumer/ || rc=1; \
	$(NONRACE) -timeout 30m -count=1 ./deploy/ || rc=1; exit $$rc

## test-short: the quick tier: unit and in-process tests (real Postgres and embedded JetStream),
## no processes, kills or clusters (integration/ runs nothing with -short); well under 90 s warm
test-short:
	@gobin=$$(scripts/need) && export PATH=$$gobin:$$PATH && url=$$(scripts/pg start) && JSBRIDGE_TEST_DATABASE_URL=$$url $(GO) test -short -timeout 5m -count=1 ./...

## soak: the cluster failover test at the soak's sizes (JSBRIDGE_SOAK=1: 3 node processes, 100 streams at
## 300 events/s, 2 bridges, 2 ordered replicas, the EVENTS leader SIGKILLed every 8-12 s and restarted 5 s
## later, SOAK_KILLS times; about 5 min a run), and the freeze case (3 ordered replicas, one SIGSTOPped 4-7 s every
## 2-4 s while 120 events/s are written for 60 s: all delivered within 60 s of the writer stopping; make test runs
## it once too), SOAK_RUNS times
## in a row, stopping at the first failure; each run's figures printed, its log and the processes' in SOAK_LOGS/run-N
## (the ordered replicas' at debug: which settled copies were acked without a POST, which acks were not sent)
SOAK_RUNS  ?= 10
SOAK_KILLS ?= 20
SOAK_LOGS  ?= .data/soak
soak:
	@url=$$(scripts/pg start) && rm -rf $(SOAK_LOGS) && mkdir -p $(SOAK_LOGS) && \
	for i in $$(seq 1 $(SOAK_RUNS)); do \
	  dir=$(SOAK_LOGS)/run-$$i; mkdir -p $$dir; start=$$(date +%s); \
	  JSBRIDGE_SOAK=1 JSBRIDGE_SOAK_KILLS=$(SOAK_KILLS) JSBRIDGE_SOAK_LOGS=$$(cd $$dir && pwd) JSBRIDGE_TEST_DATABASE_URL=$$url \
	    $(GO) test -count=1 -timeout 30m -run '^(TestClusterFailoverStreamLeaderKilled|TestOrderedReplicasFrozenOverAndOverDeliverEverythingWithinAMinute)$$' -v ./integration/ > $$dir/test.log 2>&1; rc=$$?; \
	  echo "soak run $$i of $(SOAK_RUNS): exit $$rc after $$(( $$(date +%s) - start )) s"; \
	  grep -ho 'failover figures: .*\|ordered consumer: .*' $$dir/test.log | sed 's/^/  /'; \
	  if [ $$rc -ne 0 ]; then grep -h 'first POST of version\|Error:\|Messages:\|ack_pending=\|stopped short\|: last -\?[0-9]*, head [0-9]* (partition' $$dir/test.log | head -120 | sed 's/^/  /'; \
	    echo "soak: run $$i failed; its log and the processes' are in $$dir"; exit 1; fi; \
	done; echo "soak: $(SOAK_RUNS) runs passed"

## bench: the results table against the same machine's raw limits (QUICK=1: small sizes, under 3 minutes)
bench: build
	@$(BIN)/bench $(if $(QUICK),-quick,-out docs/benchmarks.md) -bin $(BIN)

## bench-live: the live rows alone, printed (the bridge and the bare reference at 100 and 1,000 events/s over
## 1,000 streams, 20 s each, Postgres durable; then the whole pipeline and the bare one at 500, 1,000 and
## 2,000 events/s over 10,000 skewed streams, and the highest rate each holds for 60 s; QUICK=1: 1,000/s
## alone, 8 s, no search); `make bench` runs them too
bench-live: build
	@$(BIN)/bench $(if $(QUICK),-quick) -only live,live-pipeline -bin $(BIN)

## bench-go: Go benchmarks of the hot paths (subjects, messages, signing, claim and ack SQL)
bench-go:
	@url=$$(scripts/pg start) && JSBRIDGE_TEST_DATABASE_URL=$$url $(GO) test -run '^$$' -bench . -benchmem ./...

vet:
	$(GO) vet ./...

## docs: regenerate docs/cli.md from both binaries' flag definitions (a test fails when it is stale)
docs:
	$(GO) generate ./cmd/bridge ./cmd/consumer

pg-start:
	@scripts/pg start

pg-stop:
	@scripts/pg stop

## nats-cli: build the nats CLI into bin/ from the module proxy (NATSCLI_VERSION; the proxy serves a named version, not @latest)
NATSCLI_VERSION ?= v0.3.0
nats-cli:
	@mkdir -p $(BIN) && dir=$$($(GO) mod download -json github.com/nats-io/natscli@$(NATSCLI_VERSION) | sed -n 's/.*"Dir": "\(.*\)".*/\1/p') && \
	  cd $$dir && GOFLAGS=-mod=mod $(GO) build -o $(CURDIR)/$(BIN)/nats ./nats && echo $(BIN)/nats

## release-snapshot: the release archives (linux and darwin, amd64 and arm64) and checksums.txt into
## dist/release/, offline (GOPROXY=off: the build uses only the module cache), publishing nothing.
## goreleaser is built from the module proxy the first time and kept in JSBRIDGE_TOOLS (as deploy's tests do);
## then TestReleaseSnapshot (build tag release, not in make test: goreleaser's cold build is too long for CI)
## checks the archives, the checksums and what the binaries say.
GORELEASER_VERSION ?= v2.15.1
JSBRIDGE_TOOLS     ?= $(HOME)/.cache/jsbridge-tools
GORELEASER         := $(JSBRIDGE_TOOLS)/goreleaser@$(GORELEASER_VERSION)
$(GORELEASER):
	@mkdir -p $(JSBRIDGE_TOOLS) && tmp=$$(mktemp -d $(JSBRIDGE_TOOLS)/.build-XXXXXX) && \
	  GOBIN=$$tmp $(GO) install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION) && mv $$tmp/goreleaser $@ && rmdir $$tmp

release-snapshot: $(GORELEASER)
	@$(GO) mod download
	GOPROXY=off GOFLAGS=-mod=readonly $(GORELEASER) release --snapshot --clean
	$(GO) test -tags release -count=1 -run '^TestReleaseSnapshot$$' ./deploy/

## image: the container image (bridge + consumer, static, CA certificates, user 65532) without a daemon:
## dist/image/oci (OCI layout) and dist/image/jsbridge.tar (`docker load -i` / `podman load -i`).
## IMAGE_PLATFORMS="linux/amd64 linux/arm64" adds platforms to the layout (the tarball holds the first).
IMAGE           ?= jsbridge:$(VERSION)
IMAGE_PLATFORMS ?= linux/$(shell $(GO) env GOARCH)
image:
	@rm -rf dist/image && for p in $(IMAGE_PLATFORMS); do \
	  CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' \
	    -o dist/image/bin/$${p%/*}_$${p#*/}/ ./cmd/bridge ./cmd/consumer || exit 1; done
	@$(GO) -C tools/mkimage run . -bin $(CURDIR)/dist/image/bin -platforms "$(IMAGE_PLATFORMS)" -tag $(IMAGE) \
	  -version $(VERSION) -revision $(COMMIT) -created $(DATE) \
	  -layout $(CURDIR)/dist/image/oci -tarball $(CURDIR)/dist/image/jsbridge.tar

clean:
	rm -rf $(BIN) .data dist
