# The two commands a newcomer needs are `make up` and `make test`; each installs what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
ENV := target/space/env.sh
TOOLS := target/space/tools.sh
# The tests that run the API server in process (`crates/space/tests/in_process`), whose
# state store and path to the node are chosen by SPACE_TEST_STORE and SPACE_TEST_NODE.
IN_PROCESS_TESTS := --test 'api*' --test races --test templates --test tenant_archive --test cluster_in_process

.PHONY: help deps artifacts tools up check test soak fuzz lint unit bench clean-cache

help:
	@echo "make up      build everything and run space on its embedded defaults"
	@echo "make check   the fast tier, in minutes: fmt, clippy, unit tests, fake-runtime and path tests"
	@echo "make test    install what is missing, build, lint and run every test"
	@echo "make bench   run the benchmarks (prints tables)"
	@echo "make soak    the long runs (50 suspend/restore cycles through the object store, 5,000 fake-runtime requests, 20 cluster failovers, 20 chaos rounds, a long schemathesis run)"
	@echo "make fuzz    coverage-guided fuzzing of every parser of hostile input (SPACE_FUZZ_SECONDS each, default 60)"

deps:
	@scripts/deps.sh
	@scripts/console.sh

artifacts: deps
	@scripts/artifacts.sh all

tools: deps
	@scripts/tools.sh

up: artifacts
	@echo "[up] building space"
	@$(CARGO) build --quiet --release -p space
	@source $(ENV) && exec target/release/space up

lint: deps
	@echo "[lint] cargo fmt --check"
	@$(CARGO) fmt --all -- --check
	@echo "[lint] cargo clippy -D warnings"
	@$(CARGO) clippy --quiet --workspace --all-targets -- -D warnings

# The fast tier: no guest, no kernel, no image; `make test` runs it first.
check: lint
	@echo "[check] unit tests"
	@$(CARGO) test --quiet --workspace --lib --bins
	@echo "[check] the node on a fake runtime (a real space-guestd on the host), every node call through the wire, the API document"
	@$(CARGO) build --quiet -p space-guestd
	@SPACE_GUESTD=$(CURDIR)/target/debug/space-guestd $(CARGO) test --quiet -p space-node --test fake_runtime --test node_calls
	@$(CARGO) test --quiet -p space-control

test: check artifacts tools
	@scripts/artifacts.sh desktop
	@scripts/python-env.sh
	@scripts/e2b-env.sh
	@scripts/mcp-env.sh
	@scripts/browser-env.sh
	@echo "[test] cargo test (boots real guests under QEMU)"
	@source $(ENV) && source $(TOOLS) && $(CARGO) test --workspace
	@echo "[test] the in-process server's tests again: state in PostgreSQL, node over mutual TLS"
	@source $(ENV) && source $(TOOLS) && SPACE_TEST_STORE=postgres SPACE_TEST_NODE=remote $(CARGO) test -p space $(IN_PROCESS_TESTS)

# Long runs kept out of `make test`, which runs a short version of each.
soak: artifacts tools
	@echo "[soak] 50 suspend/restore cycles through a directory store and through Garage (lazy restores)"
	@source $(ENV) && source $(TOOLS) && SPACE_ARCHIVE_CYCLES=50 $(CARGO) test -p space-node --test archive -- through_
	@echo "[soak] 1,000 mixed lifecycle operations on 10 sandboxes with a file ledger"
	@source $(ENV) && source $(TOOLS) && SPACE_SOAK_OPS=1000 $(CARGO) test -p space-node --test soak -- --nocapture
	@echo "[soak] 5,000 random node requests on the fake runtime, one in eight with an injected failure"
	@source $(ENV) && SPACE_FAKE_OPS=5000 $(CARGO) test -p space-node --test fake_runtime -- random_ --nocapture
	@echo "[soak] 20 failovers of a cluster's busiest node while clients retry execs"
	@source $(ENV) && source $(TOOLS) && SPACE_FAILOVER_ROUNDS=20 $(CARGO) test -p space --test cluster -- --ignored repeated_failover
	@echo "[soak] 20 rounds of the server killed under 20 concurrent clients"
	@source $(ENV) && source $(TOOLS) && SPACE_CHAOS_ROUNDS=20 $(CARGO) test -p space --test chaos
	@echo "[soak] schemathesis against the API with 200 examples an operation"
	@scripts/python-env.sh
	@source $(ENV) && source $(TOOLS) && SPACE_SCHEMATHESIS_EXAMPLES=200 SPACE_SCHEMATHESIS_SECONDS=1200 $(CARGO) test -p space --test schemathesis

# `make test` replays the corpora (crates/space-fuzz/tests/corpus.rs); this runs the fuzzer.
fuzz: deps
	@scripts/fuzz.sh

bench: artifacts tools
	@$(CARGO) build --quiet --release -p space-bench -p space
	@source $(ENV) && source $(TOOLS) && target/release/space-bench $(ARGS)

clean-cache:
	rm -rf "$${SPACE_CACHE:-$$HOME/.cache/space}"
