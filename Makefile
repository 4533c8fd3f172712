# pgfork — see README.md. `make help` lists the targets.
GO        ?= go
BIN       ?= bin/pgfork
PKGS      ?= ./...
TESTFLAGS ?= -race -timeout 45m

.PHONY: help build test check test-env test-env-down bench run lint fmt clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

build: ## build bin/pgfork
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/pgfork

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
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

clean: ## remove build output
	rm -rf bin
