# Spillway — see README.md. `make` alone lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/spillway
# go-nvml's cgo header marks many calls deprecated; the warnings are noise.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/spillway-dev/spillway/broker/server.Version=$(VERSION)
MODULE := github.com/spillway-dev/spillway

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/spillway
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/spillway

.PHONY: run
run: build ## start a broker with a simulated on-prem fleet (2 agents x 8 GPUs) on 127.0.0.1:8080
	./$(BIN) dev

.PHONY: test
test: ## run every test, including the end-to-end ones in integration/
	$(GO) test -count=1 -timeout 15m ./...

.PHONY: bench
bench: ## run the benchmarks and record them in docs/benchmarks.md
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./broker/... ./billing/... ./providers/... ./onprem/...

.PHONY: check
check: ## gofmt, go vet, import boundaries, no InsecureIgnoreHostKey outside tests
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@bad=$$($(GO) list -f '{{.ImportPath}}: {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./providers/... ./billing/... ./onprem/... \
		| awk -F': ' '{n=split($$2, imps, " "); for (i=1;i<=n;i++) if (imps[i] ~ /^$(subst /,\/,$(MODULE))\/broker(\/|$$)/) print $$1 " imports " imps[i]}'); \
		if [ -n "$$bad" ]; then echo "import boundary broken (providers/, billing/, onprem/ must not import broker/):"; echo "$$bad"; exit 1; fi
	@bad=$$(git grep -n 'InsecureIgnoreHostKey' -- '*.go' ':!*_test.go' ':!integration/**' || true); \
		if [ -n "$$bad" ]; then echo "ssh.InsecureIgnoreHostKey outside tests:"; echo "$$bad"; exit 1; fi
	@echo "check: ok"

.PHONY: sim
sim: ## replay the standard trace through the scheduler (placeholder until the simulator lands)
	@echo "make sim: the simulator (spillway sim) has not landed yet; this target is a placeholder until it does."
	@exit 1
