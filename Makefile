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
# build of pkg/rdma compiles; protoc, to check the store's generated RPC
# code is fresh (its Go plugins are pinned as tools in go.mod).
DEB_PKGS := libibverbs-dev protobuf-compiler python3-zmq python3-msgpack

PROTO_DIR := pkg/store/storepb
PROTO_GEN := .cache/protoc-gen

.PHONY: traces all build build-ibverbs test deps deps-go deps-deb unit fmt-check vet lint gen gen-proto proto-check bench bench-tcp bench-store bench-diag demo fixtures install clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/mc .

# For hosts with real RDMA NICs: the ibverbs provider (cgo, libibverbs).
# MC_RDMA_PROVIDER=ibverbs (or auto) selects it at run time.
build-ibverbs: deps-deb
	CGO_ENABLED=1 $(GO) build -tags ibverbs -trimpath -ldflags '$(LDFLAGS)' -o bin/mc .

deps: deps-go deps-deb

deps-go:
	$(GO) mod download

# apt-install the Debian packages in $(1) that are missing.
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

deps-deb:
	$(call apt_install,$(DEB_PKGS))

# Everything CI checks. The race detector runs on every package (a superset
# of "packages with goroutines"); the generated-files check is part of the
# cmd package's tests.
test: deps fmt-check vet proto-check build
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

gen: gen-proto
	$(GO) test ./cmd -run '^TestGeneratedFilesUpToDate$$' -count=1 -update-gen

# The store's gRPC code, from store.proto, with Debian's protoc and the Go
# plugins at the versions go.mod pins.
$(PROTO_GEN)/protoc-gen-go $(PROTO_GEN)/protoc-gen-go-grpc: go.mod go.sum
	@mkdir -p $(PROTO_GEN)
	$(GO) build -o $(PROTO_GEN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(PROTO_GEN)/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc

gen-proto: $(PROTO_GEN)/protoc-gen-go $(PROTO_GEN)/protoc-gen-go-grpc
	PATH="$(CURDIR)/$(PROTO_GEN):$$PATH" protoc -I $(PROTO_DIR) \
		--go_out=paths=source_relative:$(PROTO_DIR) --go-grpc_out=paths=source_relative:$(PROTO_DIR) \
		$(PROTO_DIR)/store.proto $(PROTO_DIR)/tier.proto $(PROTO_DIR)/drain.proto

# Fails when the committed generated code is not what store.proto gives.
proto-check: $(PROTO_GEN)/protoc-gen-go $(PROTO_GEN)/protoc-gen-go-grpc
	@tmp=$$(mktemp -d); \
	PATH="$(CURDIR)/$(PROTO_GEN):$$PATH" protoc -I $(PROTO_DIR) \
		--go_out=paths=source_relative:$$tmp --go-grpc_out=paths=source_relative:$$tmp $(PROTO_DIR)/store.proto $(PROTO_DIR)/tier.proto $(PROTO_DIR)/drain.proto && \
	for f in store.pb.go store_grpc.pb.go tier.pb.go tier_grpc.pb.go drain.pb.go drain_grpc.pb.go; do \
		cmp -s $$tmp/$$f $(PROTO_DIR)/$$f || { echo "$(PROTO_DIR)/$$f is stale: run 'make gen-proto' and commit"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "generated RPC code is fresh"

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

# The same-host transport (--protocol shm, the target in another process)
# against an in-process memcpy of the same 1 MiB blocks, read and write,
# 1 and 2 threads, with loopback TCP to the same target beside it, in one
# run; five interleaved rounds per case, medians printed (11 to 13
# minutes on 2 cores, most of it touching fresh buffers).
.PHONY: bench-shm
bench-shm:
	$(GO) test ./pkg/engine/bench -run '^$$' -bench '^BenchmarkSHMvsMemcpy$$' -benchtime 1x -count=1 -compare.duration 3s -compare.rounds 5

# The store against the transfer engine alone and against Redis, in one
# run on loopback (Redis is started by the benchmark on a free port), 16
# clients on every side: 4K gets batched 32 deep, 1M and 16M gets, 1M
# puts; three interleaved rounds per case, medians printed (about 6
# minutes on 2 cores).
bench-store:
	$(call apt_install,redis-server redis-tools)
	$(GO) test ./pkg/store/bench -run '^$$' -bench '^BenchmarkStoreVsRedisVsEngine$$' -benchtime 1x -count=1 -compare.duration 4s

# The store's disk tier (issue 23): gets of 1M and 16M objects that live
# only on disk against O_DIRECT reads of the disk itself, and DRAM gets with
# a tier against without, in one run (MC_TIER_DIR: a directory on the disk
# to measure; default under $TMPDIR). About 6 minutes.
.PHONY: bench-store-tier
bench-store-tier:
	$(GO) test ./pkg/store/bench -run '^$$' -bench '^BenchmarkTier$$' -benchtime 1x -count=1 $${MC_TIER_DIR:+-tier.dir $$MC_TIER_DIR}

# A drain of 1 GiB of 1 MiB objects between two nodes against the engine
# writing the same blocks between the same two engines, in the same
# iteration (drain/engine; goal >= 0.7). About 30 s.
.PHONY: bench-drain
bench-drain:
	$(GO) test ./pkg/store -run '^$$' -bench '^BenchmarkDrainVsEngine$$' -benchtime 3x -count=3

# 4-rank all_reduce bus bandwidth at 64 MiB on loopback TCP against the
# 1-thread mc bench initiator at 1 MiB, in the same run (a markdown table).
.PHONY: bench-coll
bench-coll:
	$(GO) test ./pkg/coll -run '^$$' -bench '^BenchmarkAllReduceVsInitiator$$' -benchtime 3x -count=1

# Issue 24's same-host figures, each against its baseline in the same run
# (three interleaved rounds, every round printed, then medians and ranges):
# mc bench coll all_reduce of 64 MiB on 4 local rank processes (shared
# memory) against mc bench initiator --protocol tcp --threads 1
# --block_size 1M (about 2 minutes); and 1 MiB mc bench store gets from a
# client on a mc serve store --protocol auto node's host, shared memory
# against loopback TCP (--vs-tcp; about 1 minute).
.PHONY: bench-coll-shm bench-store-shm
bench-coll-shm: build
	scripts/bench-coll-shm.sh bin/mc 3
bench-store-shm: build
	scripts/bench-store-shm.sh bin/mc 3

# Mooncake's own master_bench against mooncake_master and against mc's
# master (--segment-size 0), interleaved rounds, same flags; needs the
# Mooncake build of ../shared/tools/build-mooncake.sh in MOONCAKE_BUILD
# (skipped with a message when it is absent).
MOONCAKE_BUILD ?= ../mooncake-build/build
.PHONY: bench-mooncake-master
bench-mooncake-master: build
	scripts/bench-mooncake-master.sh $(MOONCAKE_BUILD) bin/mc

# Mooncake's Python client, one caller, one key per call: p50/p99 of 4K
# puts and gets and GB/s of 1M puts and gets on a Mooncake pool and on mc
# pools, alternated, medians of three rounds (issue 39); needs
# MOONCAKE_BUILD as above. About 3 minutes.
.PHONY: bench-mooncake-latency
bench-mooncake-latency: build
	scripts/bench-mooncake-latency.sh $(MOONCAKE_BUILD) bin/mc 3

# KV events' cost with real processes (issue 38 item 6): mc bench store
# puts (4K, batch 32) against mc serve store with events and a receiving
# subscriber, and without, alternated, 24 pairs: pairs on a 2-core machine
# swing by 10-30 points (events off against off too), so fewer leave the
# median to chance. About 10 minutes.
.PHONY: bench-kv-events
bench-kv-events: build
	scripts/bench-kv-events.sh bin/mc 24

# The store under chaos, as an SRE's soak test (not part of make test): a
# master and three nodes as processes (one with a disk tier), clients
# checking every byte they get, SIGKILLs, SIGSTOPs and killed clients;
# fails on a wrong or stale byte, a hang, a panic or staging space kept.
# SOAK_ARGS: --duration SECONDS (180), --no-tier, --ha, --checksums=false,
# --mooncake-clients N --mooncake-build DIR (Mooncake's Python client too),
# --tenants, --protocol auto|rdma, --kv-events ...
.PHONY: soak
soak: build
	scripts/store-soak.sh --mc bin/mc $(SOAK_ARGS)

# mc against the real Mooncake Store (mooncake_master, mooncake_client,
# the Python client), one line per case; needs MOONCAKE_BUILD as above.
.PHONY: mooncake-interop
mooncake-interop: build
	scripts/mooncake-interop.sh $(MOONCAKE_BUILD) bin/mc

# Log parsing throughput of mc diag against `grep -c evicted` on the same
# generated log (1 GB unless MC_DIAG_BENCH_MB says otherwise).
bench-diag:
	MC_DIAG_BENCH_MB=$${MC_DIAG_BENCH_MB:-1024} $(GO) test ./pkg/diag -run '^$$' -bench 'LogScanVsGrep|LogScanGzip' -benchtime 2x -count=1

# The main jobs on embedded defaults: an in-process target benchmarked over
# real loopback TCP with Mooncake's bench defaults, then the KV-cache store
# (start, put, get, stat, stop).
demo: build
	./bin/mc bench initiator
	@echo "sweeps read as curves: ./bin/mc bench initiator --threads 1 --duration 3 --block_size 4K,16K,64K,256K,1M --plot sweep.svg"
	@echo
	MC=./bin/mc scripts/store-demo.sh

# sysfs trees of the pkg/topo fixtures (a DGX H100-class host, a 2-socket
# CPU host, a port down, ...) under fixtures/, to try topo discover on.
fixtures:
	$(GO) test ./pkg/topo/topotest -run '^TestFixtureTrees$$' -count=1 -fixtures-dir '$(CURDIR)/fixtures'
	@echo "sysfs trees in fixtures/: try ./bin/mc topo discover --sysfs-root fixtures/dgx-h100"

# The binary, man pages and shell completions (bash-completion, zsh and
# fish read these directories).
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0755 bin/mc $(DESTDIR)$(PREFIX)/bin/mc
	install -m 0644 man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 0644 completions/mc.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/mc
	install -m 0644 completions/_mc $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_mc
	install -m 0644 completions/mc.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/mc.fish

clean:
	rm -rf bin fixtures

# Mooncake's FAST'25 request traces, for mc sim conductor and mc store
# replay: downloaded into testdata/traces/ (git-ignored, not kept in the
# repository) and checked against their sha256.
TRACES_URL := https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces
traces:
	@set -e; cd testdata/traces; \
	for f in conversation_trace.jsonl:b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df \
	         synthetic_trace.jsonl:bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131; do \
		name=$${f%%:*}; sum=$${f#*:}; \
		if [ -f ../../../shared/traces/$$name ] && ! [ -f $$name ]; then cp ../../../shared/traces/$$name .; fi; \
		if ! [ -f $$name ]; then \
			curl -fsSL -o $$name.part $(TRACES_URL)/$$name || { rm -f $$name.part; echo "$$name: download from $(TRACES_URL) failed, and ../shared/traces has no copy"; exit 1; }; \
			mv $$name.part $$name; \
		fi; \
		echo "$$sum  $$name" | sha256sum -c --quiet || { echo "$$name: sha256 differs from $$sum"; rm -f $$name; exit 1; }; \
		echo "testdata/traces/$$name"; \
	done
