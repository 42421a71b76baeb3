# Spillway — see README.md. `make` alone lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/spillway
# go-nvml's cgo header marks many calls deprecated; the warnings are noise.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/spillway-dev/spillway/broker/api.Version=$(VERSION)
MODULE := github.com/spillway-dev/spillway

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  make %-9s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/spillway
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/spillway

.PHONY: run
run: build ## start a broker with a simulated on-prem fleet (2 agents x 8 GPUs) on 127.0.0.1:8080
	./$(BIN) dev

.PHONY: demo
demo: build ## watch a burst: spillway dev --burst and the README's script (deploy/demo/burst.sh)
	@rm -rf .spillway/demo && mkdir -p .spillway
	@set -e; ./$(BIN) dev --burst --dir .spillway/demo --listen 127.0.0.1:8090 --write-cli-config=false > .spillway/demo.log 2>&1 & pid=$$!; \
		trap 'kill -INT $$pid 2>/dev/null; wait $$pid' EXIT; \
		for i in $$(seq 100); do grep -q 'export SPILLWAY_SERVER=' .spillway/demo.log 2>/dev/null && break; sleep 0.2; done; \
		env=$$(sed -n 's/^ *export \(SPILLWAY_SERVER=.*\)/\1/p' .spillway/demo.log); \
		test -n "$$env" || { cat .spillway/demo.log; exit 1; }; \
		env $$env sh deploy/demo/burst.sh

.PHONY: test
test: ## run every test, including the end-to-end ones in integration/; lists what it skipped and why
	@set -o pipefail; $(GO) test -count=1 -timeout 15m -json ./... | $(GO) run ./cmd/testsummary

.PHONY: test-deps
test-deps: ## install on Debian (as root) what the end-to-end tests need: sshd, Redis, Chromium, Node; start Redis
	.ci/test-deps

# The Philly trace of the standard sim scenario (docs/sim.md): the shared
# traces folder next to the checkout, or PHILLY=/path/to/philly.csv.
PHILLY ?= $(firstword $(wildcard ../shared/traces/philly/philly.csv ../../shared/traces/philly/philly.csv))
SIM_STD := --trace $(PHILLY) --cluster deploy/sim/cluster.yaml --from 2017-10-01 --to 2017-12-01
# make sim's policies: every built-in one, and spillway with cost-proportional
# waits (burst.waitPerGPUHour calibrated by costWait, gangs capped by
# burst.maxWaitMultiNode; docs/sim.md).
SIM_POLICIES ?= no-burst,burst-any-pending,spillway,starburst-zero,starburst-constant,starburst-linear-runtime,starburst-linear-cost,spillway:costWait=0.25:maxWaitMultiNode=30m
BENCH_OUT := bin/bench

.PHONY: bench
bench: build ## run the scheduler, submit and sim benchmarks and record them in docs/benchmarks.md (reports; never fails on speed)
	@test -n "$(PHILLY)" || { echo "make bench: the Philly trace was not found; set PHILLY=/path/to/philly.csv"; exit 1; }
	@mkdir -p $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem -benchtime 30x -count 1 ./broker/sched/ | tee $(BENCH_OUT)/sched.txt
	$(GO) run ./cmd/benchdoc -name sched -cmd "go test -run '^\$$' -bench . -benchmem -benchtime 30x -count 1 ./broker/sched/" $(BENCH_OUT)/sched.txt
	@if grep -rqs 'func BenchmarkSubmit(' --include='*_test.go' broker; then \
		set -o pipefail; $(GO) test -run '^$$' -bench 'BenchmarkSubmit$$' -benchtime 2000x -count 1 ./broker/server/ | tee $(BENCH_OUT)/submit.txt && \
		$(GO) run ./cmd/benchdoc -name submit -title "Submit throughput: latest run" -cmd "go test -run '^\$$' -bench 'BenchmarkSubmit\$$' -benchtime 2000x -count 1 ./broker/server/" $(BENCH_OUT)/submit.txt; \
	else echo "no BenchmarkSubmit: skipped"; fi
	set -o pipefail; $(GO) test -run '^$$' -bench 'BenchmarkBrokerCycle$$' -benchtime 20x -count 1 ./broker/server/ | tee $(BENCH_OUT)/cycle.txt
	$(GO) run ./cmd/benchdoc -name broker-cycle -cmd "go test -run '^\$$' -bench 'BenchmarkBrokerCycle\$$' -benchtime 20x -count 1 ./broker/server/" $(BENCH_OUT)/cycle.txt
	set -o pipefail; $(GO) test -run '^$$' -bench 'BenchmarkListJobs$$' -benchtime 10x -benchmem -count 1 ./broker/server/ | tee $(BENCH_OUT)/list.txt
	$(GO) run ./cmd/benchdoc -name list-jobs -cmd "go test -run '^\$$' -bench 'BenchmarkListJobs\$$' -benchtime 10x -benchmem -count 1 ./broker/server/" $(BENCH_OUT)/list.txt
	set -o pipefail; $(GO) test -run '^$$' -bench 'BenchmarkScrape$$' -benchtime 20x -benchmem -count 1 ./broker/server/ | tee $(BENCH_OUT)/scrape.txt
	$(GO) run ./cmd/benchdoc -name scrape -cmd "go test -run '^\$$' -bench 'BenchmarkScrape\$$' -benchtime 20x -benchmem -count 1 ./broker/server/" $(BENCH_OUT)/scrape.txt
	set -o pipefail; $(GO) test -run '^$$' -bench 'BenchmarkRestart$$' -benchtime 3x -count 1 ./broker/server/ | tee $(BENCH_OUT)/restart.txt
	$(GO) run ./cmd/benchdoc -name restart -cmd "go test -run '^\$$' -bench 'BenchmarkRestart\$$' -benchtime 3x -count 1 ./broker/server/" $(BENCH_OUT)/restart.txt
	set -o pipefail; $(GO) test -run '^$$' -bench BenchmarkCacheSecondJob -benchtime 3x -count 1 ./onprem/staging/ | tee $(BENCH_OUT)/cache.txt
	set -o pipefail; ./$(BIN) sim $(SIM_STD) --chart $(BENCH_OUT)/sim.svg | tee $(BENCH_OUT)/sim.txt
	$(GO) run ./cmd/benchdoc -name sim -title "Simulator: the standard scenario" -cmd "spillway sim $(SIM_STD)" $(BENCH_OUT)/sim.txt
	set -o pipefail; /usr/bin/time -f '%e s wall, %U s user, %S s system, %M KiB peak RSS' ./$(BIN) sim --trace $(PHILLY) --cluster deploy/sim/cluster.yaml --policy spillway 2>&1 | tee $(BENCH_OUT)/replay.txt
	$(GO) run ./cmd/benchdoc -name sim-replay -title "Simulator: full Philly replay" -cmd "time spillway sim --trace $(PHILLY) --cluster deploy/sim/cluster.yaml --policy spillway" $(BENCH_OUT)/replay.txt
	set -o pipefail; ./$(BIN) sim $(SIM_STD) --policy spillway --sweep | tee $(BENCH_OUT)/sweep.txt
	$(GO) run ./cmd/benchdoc -name sim-sweep -title "Simulator: cost against JCT" -cmd "spillway sim $(SIM_STD) --policy spillway --sweep" $(BENCH_OUT)/sweep.txt

# End-to-end replay (cmd/benche2e): a broker on bbolt, 4 simulated agents
# × 8 GPUs (each its own `spillway agent` process) running real processes,
# the workloads of deploy/bench through the HTTP API. Prints starts/s,
# makespan, waits by class, GPU utilisation.
E2E_OUT := bin/bench-e2e
.PHONY: bench-e2e
bench-e2e: build ## replay deploy/bench workloads through the API against simulated agents (docs/benchmarks.md)
	@mkdir -p $(E2E_OUT)
	$(GO) build -o $(E2E_OUT)/benche2e ./cmd/benche2e
	set -o pipefail; for mode in sequential parallel array; do \
		$(E2E_OUT)/benche2e -agent-bin $(BIN) -workload deploy/bench/zero-2000.jsonl -mode $$mode -floor 2000; done | tee $(E2E_OUT)/zero.txt
	set -o pipefail; for pl in false true; do \
		$(E2E_OUT)/benche2e -agent-bin $(BIN) -workload deploy/bench/mixed-500.jsonl -mode sequential -preemptible-low=$$pl -fifo -preemption-limit 3; done | tee $(E2E_OUT)/mixed.txt
# The mixed workload on a Slurm of its own, for the side-by-side figures of
# docs/benchmarks.md: benche2e -system slurm runs munged, slurmctld and
# 4 slurmd × 8 GPUs in a temp dir (as root; Debian's slurmctld, slurmd,
# slurm-client and munge).
.PHONY: bench-slurm
bench-slurm: ## the mixed workload of bench-e2e on a real Slurm on this machine, both ways (docs/benchmarks.md)
	@mkdir -p $(E2E_OUT)
	$(GO) build -o $(E2E_OUT)/benche2e ./cmd/benche2e
	set -o pipefail; for pl in false true; do \
		$(E2E_OUT)/benche2e -system slurm -workload deploy/bench/mixed-500.jsonl -mode sequential -preemptible-low=$$pl; done | tee $(E2E_OUT)/slurm-mixed.txt
# Releases (docs/operations.md, "Install from a package"). goreleaser
# (.goreleaser.yaml) when it is on PATH or in the tool cache (`make
# goreleaser` builds it there once, 10-20 minutes); else the same archives
# and .deb with nfpm from the module proxy. arm64 needs cgo's cross
# compiler: apt-get install gcc-aarch64-linux-gnu (make test-deps does).
TOOLS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/spillway-tools
GORELEASER_VERSION := v2.15.1
GORELEASER ?= $(firstword $(SPILLWAY_GORELEASER) $(shell command -v goreleaser 2>/dev/null) $(wildcard $(TOOLS)/goreleaser-$(GORELEASER_VERSION)/goreleaser))
DIST_VERSION ?= 0.0.0~snapshot.$(shell git rev-parse --short HEAD 2>/dev/null || echo local)
DIST_ARCHES ?= amd64 arm64
NFPM ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
CC_arm64 ?= aarch64-linux-gnu-gcc
CC_amd64 ?= $(if $(filter x86_64,$(shell uname -m)),gcc,x86_64-linux-gnu-gcc)

.PHONY: dist
dist: ## release archives and .deb packages for linux/amd64 and arm64 in dist/ (goreleaser --snapshot, else nfpm)
	@if [ -n "$(GORELEASER)" ] && [ "$(sort $(DIST_ARCHES))" = "amd64 arm64" ]; then \
		echo "goreleaser release --snapshot --clean ($(GORELEASER))"; \
		$(GORELEASER) release --snapshot --clean; \
	elif [ -n "$(GORELEASER)" ]; then \
		echo "DIST_ARCHES=$(DIST_ARCHES): goreleaser release builds every architecture; building with nfpm"; \
		$(MAKE) --no-print-directory dist-nfpm; \
	else \
		echo "goreleaser not found (make goreleaser builds $(GORELEASER_VERSION) into $(TOOLS)); building with nfpm"; \
		$(MAKE) --no-print-directory dist-nfpm; \
	fi

.PHONY: goreleaser
goreleaser: ## build the pinned goreleaser (GORELEASER_VERSION) into the tool cache for make dist (once; 10-20 minutes)
	@if [ -x $(TOOLS)/goreleaser-$(GORELEASER_VERSION)/goreleaser ]; then echo "$(TOOLS)/goreleaser-$(GORELEASER_VERSION)/goreleaser: present"; else \
		mkdir -p $(TOOLS)/goreleaser-$(GORELEASER_VERSION) && \
		cd $(TOOLS)/goreleaser-$(GORELEASER_VERSION) && GOBIN=$$PWD GOFLAGS=-mod=mod GOWORK=off $(GO) install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION); fi

.PHONY: dist-nfpm
dist-nfpm:
	rm -rf dist && mkdir -p dist
	set -e; for arch in $(DIST_ARCHES); do \
		out=dist/spillway_linux_$$arch; mkdir -p $$out; \
		CGO_ENABLED=1 GOOS=linux GOARCH=$$arch CC=$$(case $$arch in arm64) echo $(CC_arm64);; *) echo $(CC_amd64);; esac) \
			$(GO) build -trimpath -ldflags "-s -w -X $(MODULE)/broker/api.Version=$(DIST_VERSION)" -o $$out/spillway ./cmd/spillway; \
		tar -czf dist/spillway_$(DIST_VERSION)_linux_$$arch.tar.gz -C $$out spillway -C $(CURDIR) LICENSE README.md docs deploy; \
		mkdir -p dist/.pkg && cp $$out/spillway dist/.pkg/spillway; \
		VERSION=$(DIST_VERSION) ARCH=$$arch $(NFPM) pkg --packager deb --config deploy/package/nfpm.yaml --target dist/; \
	done
	ls -l dist

# The broker's container image (Containerfile) from the release binary of
# IMAGE_ARCH: the build context under dist/image as goreleaser lays out
# docker builds. IMAGE_BASE replaces the distroless base (a local image
# where no registry is reachable); PODMAN may carry podman's flags.
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_TAG ?= localhost/spillway:$(subst ~,-,$(DIST_VERSION))
IMAGE_BINARY ?= $(firstword $(wildcard dist/spillway_linux_$(IMAGE_ARCH)*/spillway))
IMAGE_BASE ?=
IMAGE_CONTEXT ?= dist/image
PODMAN ?= podman

.PHONY: image
image: ## the broker's container image from dist/'s binary (make dist first): podman build -f Containerfile
	@test -n "$(IMAGE_BINARY)" && test -x "$(IMAGE_BINARY)" || { echo "make image: no dist/spillway_linux_$(IMAGE_ARCH)*/spillway: run make dist first (or set IMAGE_BINARY)"; exit 1; }
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)/linux/$(IMAGE_ARCH) $(IMAGE_CONTEXT)/data
	cp "$(IMAGE_BINARY)" $(IMAGE_CONTEXT)/linux/$(IMAGE_ARCH)/spillway
	cp LICENSE $(IMAGE_CONTEXT)/LICENSE
	$(PODMAN) build --platform linux/$(IMAGE_ARCH) $(if $(IMAGE_BASE),--build-arg BASE=$(IMAGE_BASE)) -t $(IMAGE_TAG) -f Containerfile $(IMAGE_CONTEXT)

.PHONY: check
check: ## gofmt, go vet, go.mod tidy, import boundaries (client/api without server, config without adapters, binary without testing), docs/architecture.md lists every package, the broker lock taken only through s.lock(), no InsecureIgnoreHostKey outside tests
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy (run go mod tidy):"; $(GO) mod tidy -diff; exit 1; }
	@bad=$$($(GO) list -f '{{.ImportPath}}: {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./providers/... ./billing/... ./onprem/... \
		| awk -F': ' '{n=split($$2, imps, " "); for (i=1;i<=n;i++) if (imps[i] ~ /^$(subst /,\/,$(MODULE))\/broker(\/|$$)/) print $$1 " imports " imps[i]}'); \
		if [ -n "$$bad" ]; then echo "import boundary broken (providers/, billing/, onprem/ must not import broker/):"; echo "$$bad"; exit 1; fi
	@bad=$$($(GO) list -deps ./broker/client ./broker/api | grep -x '$(MODULE)/broker/server' || true); \
		if [ -n "$$bad" ]; then echo "import boundary broken (broker/client and broker/api must not import broker/server):"; $(GO) list -f '{{.ImportPath}}: {{join .Imports " "}}' -deps ./broker/client | grep 'broker/server\b'; exit 1; fi
	@bad=$$($(GO) list -f '{{join .Imports "\n"}}' ./broker/config | grep -E '^$(MODULE)/(broker/(redis|bolt|server|slurm)|providers|onprem)(/|$$)' || true); \
		if [ -n "$$bad" ]; then echo "import boundary broken (broker/config keeps adapter sections raw; broker/adapters reads them):"; echo "$$bad"; exit 1; fi
	@bad=$$($(GO) list -deps ./broker/config | grep -E '^$(MODULE)/(broker/(redis|bolt|server)|providers/(aws|gcp|lease|sshpool|fake|fakecloud)|onprem/(runtime|staging|agent))$$' || true); \
		if [ -n "$$bad" ]; then echo "import boundary broken (broker/config links an adapter):"; echo "$$bad"; exit 1; fi
	@bad=$$($(GO) list -deps ./broker/client ./broker/api | grep -E '^(github.com/aws/aws-sdk-go-v2|cloud.google.com/go/compute)(/|$$)' | head -3); \
		if [ -n "$$bad" ]; then echo "broker/client or broker/api links a cloud SDK (through broker/config?):"; echo "$$bad"; exit 1; fi
	@$(GO) run ./cmd/archdoc -check docs/architecture.md
	@bad=$$($(GO) list -deps ./cmd/spillway | grep -x testing || true); \
		if [ -n "$$bad" ]; then echo "the spillway binary links package testing:"; $(GO) list -f '{{.ImportPath}}: {{join .Imports " "}}' -deps ./cmd/spillway | grep -w testing | grep -v '^testing'; exit 1; fi
	@bad=$$(git grep -nE '(^|[^A-Za-z0-9_])s\.mu\.(Lock|TryLock)\(\)' -- 'broker/server/*.go' ':!*_test.go' ':!broker/server/submitted.go' || true); \
		if [ -n "$$bad" ]; then echo "broker/server takes its lock directly; take it with s.lock(), which applies the jobs submitted meanwhile:"; echo "$$bad"; exit 1; fi
	@bad=$$(git grep -n 'InsecureIgnoreHostKey' -- '*.go' ':!*_test.go' ':!integration/**' || true); \
		if [ -n "$$bad" ]; then echo "ssh.InsecureIgnoreHostKey outside tests:"; echo "$$bad"; exit 1; fi
	@echo "check: ok"

.PHONY: archdoc
archdoc: ## redraw the package graph in docs/architecture.md from go list (make check fails when it is stale)
	$(GO) run ./cmd/archdoc -write docs/architecture.md

.PHONY: race
race: ## the broker's tests under the race detector, one package at a time (docs/benchmarks.md has its duration)
	$(GO) test -race -count=1 -p 1 -timeout 30m ./broker/...

.PHONY: sim
sim: build ## replay Philly (Oct-Nov 2017) on 416 on-prem GPUs under every burst policy and spillway with cost-proportional waits; chart in bin/sim.svg
	@test -n "$(PHILLY)" || { echo "make sim: the Philly trace was not found; set PHILLY=/path/to/philly.csv"; exit 1; }
	./$(BIN) sim $(SIM_STD) --policy $(SIM_POLICIES) --chart bin/sim.svg
