# pgfork — see README.md. `make help` lists the targets.
GO        ?= go
BIN       ?= bin/pgfork
PKGS      ?= ./...
TESTFLAGS ?= -race -timeout 45m
# The release version, the one source for every package `make release` writes
# (tarballs, npm packages, wheels, the Java jars and poms, the crates; stamped at pack time): the VERSION file.
# RELEASEFLAGS: scripts/release.py's --skip-js (no npm), --skip-java (no Maven) and --skip-rust (no cargo).
RELEASE_VERSION := $(shell cat VERSION)
# What the binary says it is: `pgfork --version` (a release binary: RELEASE_VERSION).
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILDDATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
ldflags    = -s -w -X main.version=$(1) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILDDATE)
LDFLAGS   := $(call ldflags,$(VERSION))
# Platforms `make release` builds for.
PLATFORMS ?= linux/amd64 linux/arm64 darwin/arm64 darwin/amd64
# Where `make release` writes (emptied first).
DIST      ?= dist

.PHONY: help build release test check test-env test-env-down bench run lint fmt clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

build: ## build bin/pgfork (static, with version, commit and build date)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/pgfork

release: ## tarballs, npm packages, wheels, the Maven repository dist/maven and the crates dist/cargo for PLATFORMS into DIST (dist/), SHA256SUMS; version: the VERSION file
	@rm -rf $(DIST) build/release && mkdir -p build/release
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=build/release/pgfork-$$os-$$arch; \
		echo "building $$out ($(RELEASE_VERSION))"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath \
			-ldflags '$(call ldflags,$(RELEASE_VERSION))' -o $$out ./cmd/pgfork; \
	done
	python3 scripts/release.py --version $(RELEASE_VERSION) --bin-dir build/release --dist $(DIST) $(RELEASEFLAGS)
	@rm -rf build/release
	cat $(DIST)/SHA256SUMS

test: ## run the tests against the environment prepared by test-env (skips what is missing)
	@eval "$$(scripts/test-env.sh env)"; $(GO) test $(TESTFLAGS) $(PKGS)

check: ## set up the test environment (root: XFS image, tmpfs, PostgreSQL 18), run all tests, tear down
	scripts/check.sh

test-env: ## create the test filesystems and install a second PostgreSQL major (idempotent)
	scripts/test-env.sh up

test-env-down: ## unmount and remove the test filesystems
	scripts/test-env.sh down

bench: build ## run the benchmarks and write bench/REPORT.md (needs root for XFS)
	scripts/test-env.sh up
	@eval "$$(scripts/test-env.sh env)"; $(GO) run ./bench $(BENCHFLAGS)

run: build ## the main job on the embedded default (see README)
	scripts/demo.sh

lint: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	$(GO) tool staticcheck ./...
	@# The Go client and its migrators' end-to-end suite are modules of their own.
	sc=$$($(GO) tool -n staticcheck) && for m in clients/go clients/go/migrators/e2e; do \
		(cd $$m && $(GO) vet ./... && $$sc ./...) || exit 1; done

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

clean: ## remove build output
	rm -rf bin dist build
