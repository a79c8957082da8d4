# Parley's entry point for people and CI. `make test` runs everything CI checks.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export GOTOOLCHAIN := local

BIN        := $(CURDIR)/.bin
BUF        := tools/node_modules/.bin/buf
NEWMAN     := tools/node_modules/.bin/newman
GOLANGCI   := $(BIN)/golangci-lint
GREMLINS   := $(BIN)/gremlins
# The durability and security packages that mutation testing covers, as
# module:package. docs/benchmarks.md records their kill rates.
MUTATION   := platform:./boltdb platform:./egress \
	services/registry:./internal/fetch services/registry:./internal/resolve \
	services/registry:./internal/store/boltstore services/dispatcher:./internal/store/boltstore \
	services/negotiator:./internal/store/boltstore services/tasks:./internal/store/boltstore
PLUGINS    := $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-grpc-gateway $(BIN)/protoc-gen-openapiv2
# Path to the official Agent Protocol Postman collection; required when CI is set.
AP_SUITE   ?=

.PHONY: golangci all tools protodeps generate lint fmt-check check-generated check-tidy vet unit postman test ci breaking build clean mutation

all: build

## tools: pinned buf/newman (npm) and protoc plugins (tools/go.mod) into .bin/
tools: $(BUF) $(PLUGINS)

$(BUF) $(NEWMAN): tools/package.json
	cd tools && npm install --no-audit --no-fund --loglevel=error
	touch $(BUF) $(NEWMAN)

$(BIN)/protoc-gen-%: tools/go.mod tools/go.sum
	@mkdir -p $(BIN)
	cd tools && GOWORK=off go build -o $(BIN) \
		google.golang.org/protobuf/cmd/protoc-gen-go \
		google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2

$(GREMLINS): tools/go.mod tools/go.sum
	@mkdir -p $(BIN)
	cd tools && GOWORK=off go build -o $(GREMLINS) github.com/go-gremlins/gremlins/cmd/gremlins

$(GOLANGCI): tools/lint/go.mod tools/lint/go.sum
	@mkdir -p $(BIN)
	cd tools/lint && GOWORK=off go build -o $(GOLANGCI) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

## golangci: golangci-lint (config .golangci.yml) in every workspace module; a run waits
## for another on the same machine instead of failing (--allow-serial-runners)
golangci: $(GOLANGCI)
	@for m in $$(go list -m -f '{{.Dir}}'); do (cd $$m && $(GOLANGCI) run --allow-serial-runners --config $(CURDIR)/.golangci.yml --max-issues-per-linter=0 --max-same-issues=0 ./...) || exit 1; done

## protodeps: google/api protos into third_party/proto (gitignored)
protodeps:
	cd tools && GOWORK=off go run ./protodeps ../third_party/proto

## generate: regenerate gen/ from proto/
generate: tools protodeps
	$(BUF) generate

## lint: buf lint + buf format check + go vet + golangci-lint + gofmt
lint: tools protodeps
	$(BUF) lint
	$(BUF) format -d --exit-code proto
	$(MAKE) vet
	$(MAKE) golangci
	@bad=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi

vet:
	go vet work

## mutation: mutation testing (gremlins) of the packages in MUTATION; slow, so not part of `make test`
# gremlins tests each mutant in a copy of the module made elsewhere, where
# go.work and the relative replace paths do not reach: each module is built
# alone (GOWORK=off) from a copy of its go.mod whose replaces are absolute.
# -count=1: gremlins times each mutant from the coverage run, which must
# not come from the test cache.
mutation: $(GREMLINS)
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	for p in $(MUTATION); do m=$${p%%:*}; pkg=$${p#*:}; n=$$(echo $$m | tr / _); echo "== $$m/$${pkg#./}"; \
	  sed -E "s#=> (\.\./[^ ]*)#=> $(CURDIR)/$$m/\1#" $$m/go.mod > "$$tmp/$$n.mod"; cp $$m/go.sum "$$tmp/$$n.sum"; \
	  (cd $$m && GOWORK=off GOFLAGS="-modfile=$$tmp/$$n.mod -count=1" \
	    $(GREMLINS) unleash --workers 2 --timeout-coefficient 10 -E '_test\.go$$' $$pkg) || exit 1; done

## check-generated: fail when gen/ has drifted from proto/
check-generated: generate
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
	  echo "gen/ is out of date with proto/; run 'make generate' and commit:"; \
	  git status --porcelain -- gen; git diff --stat -- gen; exit 1; fi

## check-tidy: fail when a go.mod or go.sum is untidy
check-tidy:
	@for m in $$(go list -m -f '{{.Dir}}'); do (cd $$m && go mod tidy -diff) || { echo "go.mod untidy in $$m"; exit 1; }; done
	@cd tools && GOWORK=off go mod tidy -diff
	@cd tools/lint && GOWORK=off go mod tidy -diff

## unit: all Go tests with the race detector
## unit: all Go tests with the race detector. The PostgreSQL suites (pgstore, platform/pgdb)
## run against PARLEY_TEST_DATABASE_URL (.ci/run sets it); without it they are skipped, and
## fail under CI.
unit:
	@if [ -z "$${PARLEY_TEST_DATABASE_URL:-}" ]; then \
	  echo "################################################################################" >&2; \
	  echo "# unit: PARLEY_TEST_DATABASE_URL is not set: the PostgreSQL suites are SKIPPED" >&2; \
	  echo "# (they FAIL when CI is set). .ci/run starts a server and sets it; see" >&2; \
	  echo "# docs/adr/0007-postgresql-backend.md to run them here." >&2; \
	  echo "################################################################################" >&2; fi
	go test -race -count=1 work

## postman: the official Agent Protocol suite against a live `parley serve` (a public agent,
## then a token one: 401 without a key, every assertion with one); with AP_SUITE unset it
## fails under CI and is skipped loudly elsewhere (scripts/postman.sh)
postman: $(NEWMAN)
	scripts/postman.sh "$(AP_SUITE)"
	@if [ -n "$(AP_SUITE)" ]; then AP_ACCESS=token scripts/postman.sh "$(AP_SUITE)"; fi

## test: everything CI checks
test: lint check-generated check-tidy unit postman

ci: test

## breaking: buf breaking of proto/ against $(BREAKING_BASE) (default main); both sides are built to images first, as there is no BSR
BREAKING_BASE ?= main
breaking: tools protodeps
	@tmp=$$(mktemp -d); trap 'git worktree remove --force '"$$tmp"'/base >/dev/null 2>&1; rm -rf '"$$tmp" EXIT; \
	  git worktree add -q --detach $$tmp/base $(BREAKING_BASE); \
	  mkdir -p $$tmp/base/third_party && cp -r third_party/proto $$tmp/base/third_party/; \
	  (cd $$tmp/base && $(CURDIR)/$(BUF) build -o $$tmp/base.binpb); \
	  $(BUF) build -o $$tmp/current.binpb; \
	  $(BUF) breaking $$tmp/current.binpb --against $$tmp/base.binpb && echo "breaking: no breaking change against $(BREAKING_BASE)"

build:
	go build -o $(BIN)/parley ./cmd/parley

clean:
	rm -rf $(BIN) third_party/proto
