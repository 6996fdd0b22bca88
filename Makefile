# fencelock — every target installs what it needs on a fresh machine.
SHELL := /bin/bash
GO    ?= go

.PHONY: test demo deps vet chaos bench

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

vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd examples/sqlx-gorm && $(GO) vet ./...
	cd otel && $(GO) vet ./...

# The one test command: vet, then every package under the race detector,
# including the short versions of the chaos suite (chaos/) and of the
# benchmark harness (bench/, its own module: every scenario at toy sizes),
# and the OpenTelemetry module (otel/, its own module, with the Prometheus
# example and its scripted late writer).
test: deps vet
	$(GO) test -race -count=1 -timeout 9m ./...
	cd bench && $(GO) test -race -count=1 -timeout 5m ./...
	cd examples/sqlx-gorm && $(GO) test -race -count=1 -timeout 5m ./...
	cd otel && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 5m ./...

demo: deps
	$(GO) run ./examples/inventory-sync

# bench: fencelock against redsync and bsm/redislock, one Redis, one run,
# pinned (servers on CPU 0, client on CPU 1). Prints a markdown table,
# writes bench/results/latest.json, and ends with one JSON line. ~5 min.
bench: deps
	cd bench && $(GO) run . -out results/latest.json

# chaos: the fault-injection suite (issue 6). A guard-off control run (it
# must find violations, or the checker proves nothing), then 200 seeded
# trials with guard on (zero violations); then the same on a Redis Cluster
# (3 masters + 3 replicas): a guard-off lossy-failover control and TRIALS/5
# cluster trials (master killed, stalled, lost with writes its replica
# missed, cut off). SEED=n reproduces a run's fault schedule; TRIALS=n
# changes its length (CLUSTER_TRIALS=n the cluster part's). The last line
# is a JSON summary of both runs.
chaos: deps
	$(GO) run -race ./chaos/cmd/chaos -trials $(or $(TRIALS),200) $(if $(SEED),-seed $(SEED)) $(if $(CLUSTER_TRIALS),-cluster-trials $(CLUSTER_TRIALS))
