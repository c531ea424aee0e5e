# kubectl-etcdbackup — every setup step the project needs, on a fresh machine
# with only Go: `make demo` runs the product on the local sandbox cluster,
# `make test` runs every check CI runs.

SHELL := /bin/bash
GO ?= go
CACHE := $(CURDIR)/.cache
TOOLS_BIN := $(CACHE)/bin
MODULE := github.com/kubectl-etcdbackup/kubectl-etcdbackup
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X $(MODULE)/internal/version.Version=$(VERSION)
TEST_TIMEOUT ?= 30m
# One sandbox runs per machine, so the e2e packages run one after another
# (-p 1): a test waiting for the machine lock must not spend its own
# deadline on another package's sandbox.
E2E_TIMEOUT ?= 60m

# Every build make starts is static and path-free, as the images' and the
# release's are (CGO off, -trimpath), and so are the builds the demo and the
# tests start themselves (they inherit this environment): with one set of
# flags the Go build cache compiles each package once for the demo, vet,
# staticcheck, the tests and the images, where each further set cost a full
# compile of the dependency graph — minutes on a cold 2-core machine. Only
# the race detector needs cgo (the unit target turns it on for -race).
export CGO_ENABLED := 0
export GOFLAGS := -trimpath $(GOFLAGS)

include hack/tools.mk
include hack/kube.mk
include hack/s3.mk
include hack/age.mk
include hack/node.mk

.PHONY: all build test checks unit e2e node-deps lint cross-check windows-test generate check-generate demo sandbox bench fuzz tools clean dist krew-check promrules

all: build

## build: the plugin and the server into bin/
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

## images: OCI image archives of the server, agent and CLI (linux/amd64 and linux/arm64, no container engine) into dist/images/
images: $(IMAGES_TOOL)
	$(IMAGES_TOOL) product -version $(VERSION) -repo $(IMAGE_REPO) -platforms $(IMAGE_PLATFORMS) -out dist/images

## tools: code generators and linters, pinned by the modules under tools/
tools: $(TOOLS_BIN)/buf $(TOOLS_BIN)/protoc-gen-go $(TOOLS_BIN)/protoc-gen-go-grpc $(TOOLS_BIN)/staticcheck

$(TOOLS_BIN)/buf: tools/buf/go.mod tools/buf/go.sum
	cd tools/buf && $(GO) build -o $(TOOLS_BIN)/ github.com/bufbuild/buf/cmd/buf

$(TOOLS_BIN)/protoc-gen-go $(TOOLS_BIN)/protoc-gen-go-grpc &: tools/proto/go.mod tools/proto/go.sum
	cd tools/proto && $(GO) build -o $(TOOLS_BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

$(TOOLS_BIN)/staticcheck: tools/lint/go.mod tools/lint/go.sum
	cd tools/lint && $(GO) build -o $(TOOLS_BIN)/ honnef.co/go/tools/cmd/staticcheck

## generate: regenerate the gRPC code from api/**/*.proto
generate: $(TOOLS_BIN)/buf $(TOOLS_BIN)/protoc-gen-go $(TOOLS_BIN)/protoc-gen-go-grpc
	$(TOOLS_BIN)/buf lint
	$(TOOLS_BIN)/buf generate

## check-generate: fail when the checked-in generated code is stale (generates into a scratch directory: writes nothing in the tree)
check-generate: $(TOOLS_BIN)/buf $(TOOLS_BIN)/protoc-gen-go $(TOOLS_BIN)/protoc-gen-go-grpc
	$(TOOLS_BIN)/buf lint
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(TOOLS_BIN)/buf generate -o "$$tmp" && \
		want=$$(cd "$$tmp" && find api -name '*.pb.go' | sort) && have=$$(find api -name '*.pb.go' | sort) && \
		stale=$$(if [ "$$want" != "$$have" ]; then echo "files: $$(echo $$want) (have $$(echo $$have))"; fi; \
			for f in $$want; do cmp -s "$$tmp/$$f" "$$f" || echo "$$f"; done) && \
		if [ -n "$$stale" ]; then echo "generated code in api/ is stale: $$stale"; \
			echo "run 'make generate' and commit the result"; exit 1; fi

## lint: gofmt, go vet, staticcheck
lint: $(TOOLS_BIN)/staticcheck
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS_BIN)/staticcheck ./...

# The platforms the plugin is released for (hack/dist.sh reads the same file).
KREW_PLATFORMS := $(shell cat krew/platforms)
comma := ,
CROSSCHECK := $(TOOLS_BIN)/crosscheck
$(CROSSCHECK): tools/lint/go.mod tools/lint/go.sum tools/lint/crosscheck/main.go
	cd tools/lint && $(GO) build -o $(TOOLS_BIN)/ ./crosscheck

## cross-check: type-checks the plugin for every platform krew serves and the server and agent for every platform their images are built for, from source (no cross-compile; ≈ 30 s), failing with the platform that does not build; this machine's own platform is lint's (go vet)
cross-check: $(CROSSCHECK)
	GOGC=400 $(CROSSCHECK) $(filter-out $(HOST_PLATFORM):%, \
		$(foreach p,$(KREW_PLATFORMS),$(p):./cmd/kubectl-etcdbackup) \
		$(foreach p,$(subst $(comma), ,$(IMAGE_PLATFORMS)),$(p):./cmd/etcdbackup-server$(comma)./cmd/etcdbackup-agent))

## windows-test: the tests of the packages with Windows-only code (locks), as Windows binaries under Wine (installs wine64 and MinGW; not part of make test)
windows-test:
	hack/windows-test.sh

# Packages whose tests need neither root nor the Kubernetes binaries: all
# but the end-to-end world under tests/.
UNIT_PKGS = $(shell $(GO) list ./... | grep -v '/tests/')
E2E_PKGS = ./tests/...
TESTREPORT := $(TOOLS_BIN)/testreport
# make test runs the unit tests under the race detector; UNIT_FLAGS= turns it off.
UNIT_FLAGS ?=

$(TESTREPORT): hack/testreport/main.go
	$(GO) build -o $@ ./hack/testreport

## unit: every test that needs neither root nor the Kubernetes binaries (agents, server, S3 against a real versitygw, plugin, tunnel, …); lists what it skipped and why
unit: s3-bins age-bins $(TESTREPORT)
	@echo "unit: ./tests/... is not run here: it needs root and the Kubernetes binaries (make test runs it)" >&2
	set -o pipefail; ETCDBACKUP_REQUIRE_SANDBOX=1 ETCDBACKUP_S3_BIN_DIR=$(S3_BIN_DIR) ETCDBACKUP_AGE_BIN_DIR=$(AGE_BIN_DIR) \
		CGO_ENABLED=$(if $(findstring -race,$(UNIT_FLAGS)),1,0) $(GO) test -json -count=1 -timeout $(TEST_TIMEOUT) $(UNIT_FLAGS) $(UNIT_PKGS) | $(TESTREPORT)

# What the sandbox's programs and tests are told about the binaries and
# images the Makefile built.
SANDBOX_ENV = ETCDBACKUP_KUBE_BIN_DIR=$(KUBE_BIN_DIR) ETCDBACKUP_NODE_DIR=$(NODE_DIR) \
	ETCDBACKUP_S3_BIN_DIR=$(S3_BIN_DIR) ETCDBACKUP_AGE_BIN_DIR=$(AGE_BIN_DIR)

## node-deps: Debian's containerd, runc and nftables for the sandbox's real node (apt-get, only what is missing)
node-deps:
	hack/install-node-deps.sh

## e2e: the end-to-end tests and the sandbox's own tests, on the real sandbox cluster (root); the product runs from its images, built for this machine's platform alone (`make checks` cross-builds and checks both)
# The node runs this machine's platform only: the images for the other
# one, a full cross-compile, are built and checked by hack/images's test in
# `make checks`, beside the tests.
E2E_IMAGES := $(CACHE)/e2e-images
e2e: node-deps node-bins s3-bins age-bins $(IMAGES_TOOL) $(TESTREPORT)
	$(IMAGES_TOOL) product -version $(VERSION) -repo $(IMAGE_REPO) -platforms $(HOST_PLATFORM) -out $(E2E_IMAGES)
	set -o pipefail; ETCDBACKUP_REQUIRE_SANDBOX=1 $(SANDBOX_ENV) ETCDBACKUP_IMAGES_DIR=$(E2E_IMAGES) \
		$(GO) test -json -count=1 -p 1 -timeout $(E2E_TIMEOUT) $(E2E_PKGS) | $(TESTREPORT)

## checks: what CI checks besides the tests — generated code, lint, every release platform type-checks, krew, the alert rules, the product's images built for both platforms (hack/images's test), the tools' own tests; writes nothing in the tree
# hack/images cross-builds both platforms at nice 19 beside the end-to-end
# tests: on a cold CI machine that outlasts go test's default 10 minutes.
checks: check-generate lint cross-check krew-check promrules
	$(GO) test -count=1 -timeout 30m ./hack/images
	cd tools/benchreport && $(GO) vet . && $(GO) test -count=1 .
	cd tools/lint && $(GO) vet ./crosscheck && $(GO) test -count=1 ./crosscheck

## test: everything CI checks — the unit tests with -race, then the end-to-end tests on the sandbox, and beside them `make checks`
# The checks need only CPU, where the end-to-end tests mostly wait on a real
# cluster: they run beside the tests at the lowest priority (nice 19), in
# the time the tests leave idle on CI's two cores, and their log is printed
# after the tests'.
CHECKS_LOG := $(CACHE)/checks.log
test:
	@mkdir -p $(CACHE); echo "make test: make checks runs beside the tests; its log ($(CHECKS_LOG)) follows theirs"; \
	nice -n 19 $(MAKE) --no-print-directory checks >$(CHECKS_LOG) 2>&1 & checks=$$!; \
	$(MAKE) unit UNIT_FLAGS=-race && $(MAKE) e2e; tests=$$?; \
	wait $$checks; rc=$$?; echo "== make checks (beside the tests):"; cat $(CHECKS_LOG); \
	if [ $$rc -ne 0 ]; then echo "make test: make checks failed (its log is above)"; fi; \
	if [ $$tests -ne 0 ]; then echo "make test: the tests failed (their report is above the checks' log)"; fi; \
	[ $$tests -eq 0 ] && [ $$rc -eq 0 ]

## demo: the main job on the local sandbox cluster, step by step, then stop
demo: node-deps node-bins s3-bins
	$(GO) build -o $(TOOLS_BIN)/etcdbackup-sandbox ./tests/cmd/etcdbackup-sandbox
	$(SANDBOX_ENV) $(TOOLS_BIN)/etcdbackup-sandbox -demo -dir .sandbox

## sandbox: the same cluster, kept running for trying kubectl etcdbackup by hand (Ctrl-C stops); NODES=2 adds a second node, HA=1 installs two replicas (manifests/components/ha)
sandbox: node-deps node-bins s3-bins
	$(GO) build -o $(TOOLS_BIN)/etcdbackup-sandbox ./tests/cmd/etcdbackup-sandbox
	$(SANDBOX_ENV) exec $(TOOLS_BIN)/etcdbackup-sandbox -dir .sandbox -nodes $(or $(NODES),1) $(if $(HA),-ha)

## bench: every benchmark (throughput, CPU per GiB and against each stage's floor, memory, list latency and its growth with the backups, restore time; with perf, where the CPU goes), then docs/benchmarks.md and its chart; BENCH_BASELINE_BIN / BENCH_BASELINE_PLUGIN (another build's agent+server dir / plugin) are timed in the same rounds
BENCH_OUT := $(CACHE)/bench
BENCH_SIZES_MIB ?= 64,256,1024
BENCH_ENV = ETCDBACKUP_BENCH_BASELINE_BIN=$(BENCH_BASELINE_BIN) ETCDBACKUP_BENCH_BASELINE_PLUGIN=$(BENCH_BASELINE_PLUGIN) $(SANDBOX_ENV)
bench: node-deps node-bins s3-bins age-bins
	mkdir -p $(BENCH_OUT) && rm -f $(BENCH_OUT)/*.txt
	set -o pipefail; ETCDBACKUP_REQUIRE_SANDBOX=1 ETCDBACKUP_BENCH_SIZES_MIB=$(BENCH_SIZES_MIB) $(BENCH_ENV) \
		$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./client/ ./plugin/ ./tests/bench/ | tee $(BENCH_OUT)/bench.txt
	if command -v perf >/dev/null; then set -o pipefail; ETCDBACKUP_BENCH_SIZES_MIB=256 ETCDBACKUP_BENCH_PERF=$(BENCH_OUT) $(BENCH_ENV) \
		$(GO) test -run '^$$' -bench 'Backup$$' -benchtime 1x -timeout 30m ./tests/bench/ | tee $(BENCH_OUT)/perf.txt; fi
	cd tools/benchreport && $(GO) run . -out $(CURDIR)/docs/benchmarks.md \
		-notes $(CURDIR)/docs/benchmarks-notes.md -include $(CURDIR)/docs/benchmarks-download.md $(BENCH_OUT)/*.txt

## fuzz: every fuzz target (upload stream, manifests, trailer verifier, decompression, config, delta segments and plans, stored Kubernetes values, Job annotations) for FUZZTIME each
FUZZTIME ?= 30s
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) hack/fuzz.sh

## dist: plugin archives for every krew platform, SHA256SUMS and the krew manifest, in dist/; the version is the tag on HEAD (else v0.0.0-dev+COMMIT, see hack/dist-version.sh), or DIST_VERSION
DIST_VERSION ?=
dist:
	hack/dist.sh $(DIST_VERSION)

## krew-check: krew's own validation of a manifest for this machine's platform, and a real `kubectl krew install` of its archive
# It builds into a directory of its own: dist.sh empties its directory, and
# dist/images is what the end-to-end tests beside it read.
KREW_CHECK_DIST := $(CACHE)/krew-check-dist
krew-check: $(TOOLS_BIN)/krew $(TOOLS_BIN)/validate-krew-manifest
	DIST_PLATFORMS=$$($(GO) env GOOS)/$$($(GO) env GOARCH) DIST_DIR=$(KREW_CHECK_DIST) hack/dist.sh $(DIST_VERSION)
	hack/krew-check.sh $(TOOLS_BIN) $(KREW_CHECK_DIST)

## promrules: the monitoring component's alerts through Prometheus's own rule parser (its own module, tools/promrules)
promrules:
	cd tools/promrules && $(GO) test -count=1 ./...

$(TOOLS_BIN)/krew $(TOOLS_BIN)/validate-krew-manifest &: tools/krew/go.mod tools/krew/go.sum
	cd tools/krew && $(GO) build -o $(TOOLS_BIN)/ sigs.k8s.io/krew/cmd/krew sigs.k8s.io/krew/cmd/validate-krew-manifest

clean:
	rm -rf bin dist .sandbox
