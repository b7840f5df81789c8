# mc — build, test and generate. `make test` is what CI runs (.ci/run) and
# installs what it needs itself (Go modules, libibverbs-dev for the cgo
# provider's compile check).

GO      ?= go
PREFIX  ?= /usr/local
export GOTOOLCHAIN := local

VERSION ?= $(shell git describe --tags --dirty 2>/dev/null || echo v0.0.0-dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/kvcache-ops/mc/cmd.version=$(VERSION) -X github.com/kvcache-ops/mc/cmd.commit=$(COMMIT)

# Debian packages `make test` needs: the verbs headers, so the `ibverbs`
# build of pkg/rdma compiles.
DEB_PKGS := libibverbs-dev

.PHONY: all build test deps deps-go deps-deb unit fmt-check vet lint gen gen-check bench bench-tcp bench-diag demo install clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/mc .

deps: deps-go deps-deb

deps-go:
	$(GO) mod download

deps-deb:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# Everything CI checks. The race detector runs on every package (a superset
# of "packages with goroutines"); the generated-files check is part of the
# cmd package's tests.
test: deps fmt-check vet build
	$(GO) test -race -count=1 ./...
	$(GO) vet -tags ibverbs ./pkg/rdma/...
	$(GO) test -tags ibverbs -count=1 ./pkg/rdma/ibverbs/
	CGO_ENABLED=0 $(GO) build -o /dev/null .

unit:
	$(GO) test -count=1 ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

lint: fmt-check vet
	$(GO) tool staticcheck ./...

gen:
	$(GO) test ./cmd -run '^TestGeneratedFilesUpToDate$$' -count=1 -update-gen

bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count=1 ./...

# mc's TCP transport against a plain Go stream over one persistent loopback
# connection (the ceiling), in the same run: 4K, 64K and 1M, read and write;
# then the target's CPU per task with a connection per request (Mooncake's
# default client) against persistent lanes.
bench-tcp:
	$(GO) test ./pkg/engine/bench -run '^$$' -bench '^BenchmarkTCPvsStream$$' -benchtime 1x -count=1 -compare.duration 5s
	$(GO) test ./pkg/engine/bench -run '^$$' -bench '^BenchmarkTCPvsStream$$' -benchtime 1x -count=1 -compare.duration 5s -compare.op write
	$(GO) test ./pkg/engine/bench -run '^$$' -bench '^BenchmarkAcceptPath$$' -benchtime 1x -count=1 -compare.duration 5s

# Log parsing throughput of mc diag against `grep -c evicted` on the same
# generated log (1 GB unless MC_DIAG_BENCH_MB says otherwise).
bench-diag:
	MC_DIAG_BENCH_MB=$${MC_DIAG_BENCH_MB:-1024} $(GO) test ./pkg/diag -run '^$$' -bench 'LogScanVsGrep|LogScanGzip' -benchtime 2x -count=1

# The main job on embedded defaults: an in-process target benchmarked over
# real loopback TCP with Mooncake's bench defaults.
demo: build
	./bin/mc bench initiator
	@echo "sweeps read as curves: ./bin/mc bench initiator --threads 1 --duration 3 --block_size 4K,16K,64K,256K,1M --plot sweep.svg"

install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0755 bin/mc $(DESTDIR)$(PREFIX)/bin/mc
	install -m 0644 man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/

clean:
	rm -rf bin
