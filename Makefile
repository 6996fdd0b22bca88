# fencelock — every target installs what it needs on a fresh machine.
SHELL := /bin/bash
GO    ?= go

.PHONY: test flakes demo deps deps-bench vet tidy chaos bench

# deps: redis-server and pgbouncer from Debian when missing (root), or a clear stop.
# Postgres 15 server binaries are expected at /usr/lib/postgresql/15/bin.
deps:
	@if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing gcc (go test -race needs cgo)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null) \
	      || { echo "make: apt-get install gcc libc6-dev failed" >&2; exit 1; }; \
	  else \
	    echo "make: no C compiler: go test -race needs cgo; install the Debian package gcc" >&2; exit 1; \
	  fi; \
	fi
	@if ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing redis-server (Debian package redis-server)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
	      || { echo "make: apt-get install redis-server failed" >&2; exit 1; }; \
	  else \
	    echo "make: redis-server is missing: install the Debian package redis-server (sudo apt-get install redis-server); tests that inject faults start their own" >&2; exit 1; \
	  fi; \
	fi
	@if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing pgbouncer (Debian package pgbouncer; the guard/pgfence tests run through it)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null) \
	      || { echo "make: apt-get install pgbouncer failed" >&2; exit 1; }; \
	  else \
	    echo "make: pgbouncer is missing: install the Debian package pgbouncer (sudo apt-get install pgbouncer); tests start their own in front of the test Postgres" >&2; exit 1; \
	  fi; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v pg_config >/dev/null 2>&1 && [ -z "$$FENCE_TEST_DATABASE_URL" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing postgresql-15"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null) \
	      || { echo "make: apt-get install postgresql-15 failed" >&2; exit 1; }; \
	  else \
	    echo "make: Postgres server binaries are missing: install the Debian package postgresql-15, or set FENCE_TEST_DATABASE_URL" >&2; exit 1; \
	  fi; \
	fi

# deps-bench: what make bench needs besides deps: etcd-server from Debian
# when missing (root), or a clear stop. The bench starts its own etcd on
# free loopback ports as the peer of the fair lock's scenarios; make test
# needs none.
deps-bench: deps
	@if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing etcd-server (Debian package etcd-server; the bench starts its own etcd as a peer)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null) \
	      || { echo "make: apt-get install etcd-server failed" >&2; exit 1; }; \
	  else \
	    echo "make: etcd is missing: install the Debian package etcd-server (sudo apt-get install etcd-server), or run the bench without the etcd peer: cd bench && go run . -etcd=false" >&2; exit 1; \
	  fi; \
	fi

# Every module of the repository: each directory that holds a go.mod (the
# library at the root; bench, chaos, otel, examples/sqlx-gorm, ...).
MODULES := $(sort $(patsubst ./%,%,$(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*'))))

vet:
	@set -e; for m in $(MODULES); do echo "go vet ./... ($$m)"; (cd $$m && $(GO) vet ./...); done
	$(GO) vet .ci/installcheck.go

# tidy: go mod tidy -diff in every module; a module whose go.mod or go.sum
# differs from what go mod tidy writes fails the build, with the fix.
tidy:
	@fail=0; for m in $(MODULES); do \
	  echo "go mod tidy -diff ($$m)"; \
	  if ! out=$$(cd $$m && $(GO) mod tidy -diff 2>&1); then \
	    echo "$$out" | grep -v '^go: downloading' >&2; \
	    echo "make: module $$m is not tidy ($$m/go.mod, $$m/go.sum): run (cd $$m && go mod tidy) and commit the result" >&2; \
	    fail=1; \
	  fi; \
	done; exit $$fail

# The one test command: the tidiness of every module, then (tools/cmd/suite,
# see docs/testing.md) go vet -race, staticcheck and every package of every
# module under the race detector, side by side: the library, the short chaos
# suite (chaos/: every fault kind once on each topology), the benchmark
# harness at toy sizes (bench/), the OpenTelemetry module, the example
# modules, and the install check (.ci/installcheck.go: fencectl runs from an
# empty module). It prints each package's time against its budget in
# docs/testing.md.
test: deps tidy
	cd tools && $(GO) run ./cmd/suite -root ..

# flakes: the tests again and again under the load of the whole suite, with
# a table of the runs each package survived and the tests that failed.
# RUNS=n (default 5); PKG=./dir runs that package RUNS times while the whole
# suite runs beside it, RUN=regexp its tests only.
flakes: deps
	cd tools && $(GO) run ./cmd/suite -root .. -runs $(or $(RUNS),5) $(if $(PKG),-pkg $(PKG)) $(if $(RUN),-run '$(RUN)')

demo: deps
	$(GO) run ./examples/inventory-sync

# bench: fencelock against redsync and bsm/redislock (and, in the fair
# lock's cross-process scenarios, etcd's Mutex), one run, pinned
# (servers on CPU 0, the bench and its child processes on CPU 1). Prints a
# markdown table, writes bench/results/latest.json, latest.md, the
# headline charts (bench/results/*.svg) and the results part of
# bench/README.md, all from those results, and ends with one JSON line.
# ~11 min.
bench: deps-bench
	cd bench && $(GO) run . -out results/latest.json

# chaos: the fault-injection suite (issue 6). A guard-off control run (it
# must find violations, or the checker proves nothing), then 200 seeded
# trials with guard on (zero violations); then the same on a Redis Cluster
# (3 masters + 3 replicas): a guard-off lossy-failover control and TRIALS/5
# cluster trials (master killed, stalled, lost with writes its replica
# missed, cut off). SEED=n reproduces a run's fault schedule; TRIALS=n
# changes its length (CLUSTER_TRIALS=n the cluster part's). The last line
# is a JSON summary of both runs, also written to chaos/results/latest.json
# with a chart of loss detection and takeover per fault kind drawn from it
# (chaos/results/faults.svg).
chaos: deps
	cd chaos && $(GO) run -race ./cmd/chaos -out results/latest.json -trials $(or $(TRIALS),200) $(if $(SEED),-seed $(SEED)) $(if $(CLUSTER_TRIALS),-cluster-trials $(CLUSTER_TRIALS))
