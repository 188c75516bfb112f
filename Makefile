# The commands a person types. `make run` and `make test` work on a fresh machine: each sets up
# what it needs first (idempotently).

VENV        := .venv
PYTHON      := $(VENV)/bin/python
NEREID      := target/release/nereid
EXAMPLES    := docs/examples/model_repository
CARGO_FLAGS ?= --locked
BENCH_OUT   ?= target/bench
# The PyTorch backend is a library of its own (crate nereid-torch-backend,
# libnereid_torch_backend.so next to the binary), the only thing that links libtorch: torch-sys
# compiles against the libtorch of the wheel `make setup` installs and the library finds it
# through its RUNPATH. The server opens it on the first PyTorch model load. The cargo feature
# `torch` runs the backend's tests against it.
FEATURES    := --features nereid/torch
TORCH_ENV    = LIBTORCH="$$(cat $(VENV)/libtorch-path)"

.PHONY: all setup triton-ref build examples run cluster cluster-down test test-rust test-python test-partitions test-deploy fuzz fuzz-smoke bench lint lint-fast clean

all: build

## setup: Python venv with the ONNX Runtime library, libtorch (torch wheel, CPU serving), onnx,
## tritonclient and perf_analyzer.
setup: $(VENV)/ort-lib-path

$(VENV)/ort-lib-path: scripts/setup.sh
	bash scripts/setup.sh

## triton-ref: the real Triton server (2.51.0, CPU, Python backend) in .venv-triton/, the oracle of
## the differential tests (tests/python/test_triton_diff.py) and the peer of `make bench`'s
## "versus Triton" section. Installed from the nvidia-pytriton wheel; idempotent.
triton-ref: .venv-triton/tritonserver

.venv-triton/tritonserver: scripts/triton_ref.sh
	bash scripts/triton_ref.sh

## build: target/release/nereid with the ONNX Runtime, PyTorch and Python backends, runnable as is
## (ONNX Runtime, the PyTorch backend library libnereid_torch_backend.so with libtorch, and the
## Python stub's compiled core libnereid_stub_core.so, the two libraries lying next to the
## binary, are found without env vars).
build: setup
	$(TORCH_ENV) cargo build --release $(CARGO_FLAGS) $(FEATURES) -p nereid -p nereid-loadtest -p nereid-stub-core -p nereid-torch-backend
	cp -f "$$(cat $(VENV)/ort-lib-path)" target/release/

## examples: the example model repository under docs/examples/ (ONNX examples, the
## Python/ensemble pipelines of docs/examples/pipelines, and the TorchScript MLP `mlp_torch`
## from tests/models/pytorch).
examples: setup
	$(PYTHON) scripts/gen_models.py $(EXAMPLES) --set example
	$(PYTHON) scripts/gen_pipeline_examples.py $(EXAMPLES)
	rm -rf $(EXAMPLES)/mlp_torch && mkdir -p $(EXAMPLES)/mlp_torch/1
	cp tests/models/pytorch/mlp_script/1/model.pt $(EXAMPLES)/mlp_torch/1/
	sed 's/"mlp_script"/"mlp_torch"/' tests/models/pytorch/mlp_script/config.pbtxt > $(EXAMPLES)/mlp_torch/config.pbtxt

## run: serve the example repository on 8000 (HTTP), 8001 (gRPC), 8002 (metrics).
## Python models run on the venv's interpreter (it has numpy); without NEREID_PYTHON the server
## uses the first python3 on PATH.
run: build examples
	NEREID_PYTHON=$(CURDIR)/$(VENV)/bin/python $(NEREID) serve --model-repository $(EXAMPLES)

## cluster: 3 control-plane nodes, 2 workers and a router on 127.0.0.1 with the example
## repository registered (router on 8000/8001/8002); cluster-down stops them by PID.
cluster: build examples
	NEREID=$(NEREID) bash scripts/cluster.sh up

cluster-down:
	bash scripts/cluster.sh down

## test: the lint (formatting, module cycles, clippy), unit tests, then end-to-end tests with
## tritonclient and perf_analyzer, then the network partition tests, then the Kubernetes
## deployment check, then the fuzz smoke run.
test: lint test-rust test-python test-partitions test-deploy fuzz-smoke

test-rust: build
	$(TORCH_ENV) cargo test --release $(CARGO_FLAGS) $(FEATURES) --workspace

test-python: build triton-ref
	NEREID_BIN=$(CURDIR)/$(NEREID) $(PYTHON) -m pytest tests/python -q -m "not partitions"

## test-partitions: a cluster (3 control-plane nodes, 2 workers, a router) with each process in
## its own network namespace, partitioned and healed under load (tests/python/test_partitions.py,
## docs/cluster.md#partitions); needs root and `ip netns`, skipped with the reason otherwise.
test-partitions: build
	NEREID_BIN=$(CURDIR)/$(NEREID) $(PYTHON) -m pytest tests/python/test_partitions.py -q -m partitions

## test-deploy: helm lint, helm template + Kubernetes schemas, deploy/manifests/nereid.yaml up to
## date, and every nereid flag in the chart known to the binary (docs/kubernetes.md).
test-deploy: build
	NEREID_BIN=$(CURDIR)/$(NEREID) HELM=$(CURDIR)/$(VENV)/bin/helm $(PYTHON) scripts/check_deploy.py

## fuzz: every fuzz target (fuzz/, docs/fuzzing.md) for FUZZ_SECONDS each, built with libFuzzer's
## coverage instrumentation on the stable toolchain; one summary line per target (runs, crashes);
## fails on any crash (the input is kept in fuzz/artifacts/<target>/).
FUZZ_SECONDS       ?= 600
FUZZ_SMOKE_SECONDS ?= 5
fuzz:
	bash fuzz/fuzz.sh build
	bash fuzz/fuzz.sh run $(FUZZ_SECONDS)

## fuzz-smoke: the light targets (over nereid-proto, nereid-frontend and the router's scanners
## only, so the instrumented build stays short), each for FUZZ_SMOKE_SECONDS (part of `make test`).
fuzz-smoke:
	bash fuzz/fuzz.sh build light
	bash fuzz/fuzz.sh run $(FUZZ_SMOKE_SECONDS) light

## bench: in-process ONNX Runtime baseline, then the server under nereid-loadtest and
## perf_analyzer; writes $(BENCH_OUT)/results.json and prints a Markdown summary (docs/loadtest.md).
## Then the router hop (scripts/bench_router.sh: worker direct vs through `nereid router`):
## $(BENCH_OUT)/router-hop.json. Then the PyTorch backend (scripts/bench_torch.sh: a traced MLP
## in-process through tch vs served, c=1 and c=32): $(BENCH_OUT)/torch.json. Then the server's CPU
## time per inference (scripts/bench_cpu.sh; NEREID_BASELINE=<binary> compares two builds):
## $(BENCH_OUT)/cpu.json. Then the placement simulator (1,000 nodes × 10,000 models):
## $(BENCH_OUT)/placement-sim.json, and its model cache (1,000 nodes × 100,000 models, Zipf
## requests, LRU eviction): $(BENCH_OUT)/model-cache-sim.json. Last, Nereid versus the real Triton server (make triton-ref)
## on the same Python-backend models under perf_analyzer, with CPU per inference
## (scripts/bench_triton.py): $(BENCH_OUT)/triton.json. Then the footprint beside Triton (time to
## ready, PSS of the server and of its stubs, exit time; scripts/bench_footprint.py):
## $(BENCH_OUT)/footprint.json. Then the OpenAI route against /generate_stream on one streaming
## model (time to first token, tokens/s; scripts/bench_openai.py): $(BENCH_OUT)/openai.txt.
## Then the model cache (200 models, memory for 20, a Zipf mix through a router;
## scripts/bench_model_cache.py): $(BENCH_OUT)/model-cache.json.
bench: build triton-ref
	cargo build --release $(CARGO_FLAGS) -p nereid-loadtest --example rtt_floor
	cargo build --release $(CARGO_FLAGS) -p nereid-data-plane --example inprocess_ort
	$(TORCH_ENV) cargo build --release $(CARGO_FLAGS) -p nereid-torch-backend --example inprocess_torch
	bash scripts/bench.sh $(BENCH_OUT)
	bash scripts/bench_torch.sh $(BENCH_OUT)
	bash scripts/bench_cpu.sh $(BENCH_OUT)
	NEREID=target/release/nereid LOADTEST=target/release/nereid-loadtest bash scripts/bench_router.sh $(BENCH_OUT)
	mkdir -p $(BENCH_OUT)
	target/release/nereid-loadtest placement-sim
	target/release/nereid-loadtest placement-sim --json > $(BENCH_OUT)/placement-sim.json
	target/release/nereid-loadtest placement-sim --cache --models 100000 --cache-requests 600000 --cache-batch 2000 --json > $(BENCH_OUT)/model-cache-sim.json
	NEREID_BIN=$(CURDIR)/$(NEREID) $(PYTHON) scripts/bench_triton.py $(BENCH_OUT)
	$(PYTHON) scripts/bench_footprint.py --nereid $(NEREID) --out $(BENCH_OUT)
	NEREID_BIN=$(CURDIR)/$(NEREID) $(PYTHON) scripts/bench_openai.py | tee $(BENCH_OUT)/openai.txt
	NEREID_BIN=$(CURDIR)/$(NEREID) $(PYTHON) scripts/bench_model_cache.py --out $(BENCH_OUT)/model-cache.json
	NEREID=target/release/nereid LOADTEST=target/release/nereid-loadtest bash scripts/bench_proxies.sh $(BENCH_OUT)

## lint: what CI enforces, first in `make test`. lint-fast (5 s): rustfmt's check, and no import
## cycles between the top-level modules of the crates in CYCLE_FREE (scripts/module_cycles.py:
## layers read top-down). Then clippy with warnings as errors, in the release profile and with
## the features of `build` and `test-rust`, so the build scripts and proc-macros it needs (the
## C++ of torch-sys among them) are the ones they build and run, not a second set. On 2 cores
## clippy adds about 7 min to a fresh `make test` (the dependencies are type-checked once, the
## workspace linted) and about a minute when only workspace crates changed since the last run.
## Last, rustdoc over the workspace with broken and private intra-doc links as errors: about
## 2 min fresh (the dependencies' metadata is clippy's), 15 s when only workspace crates changed.
CYCLE_FREE := src proto/src frontend/src telemetry/src data-plane/src agent/src loadtest/src \
              control-plane/src placement/src router/src cluster-client/src tls/src \
              remote-repository/src stub-protocol/src stub-core/src test-support/src torch-abi/src \
              torch-backend/src
# Doc links that resolve to nothing, or to an item the reader of the docs cannot see, fail the
# lint (rustdoc only warns by default). The release profile shares the dependencies' metadata
# with clippy's build.
RUSTDOC_LINTS := -D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links
lint: lint-fast setup
	$(TORCH_ENV) cargo clippy --release $(CARGO_FLAGS) --workspace --all-targets $(FEATURES) -- -D warnings
	$(TORCH_ENV) RUSTDOCFLAGS="$(RUSTDOC_LINTS)" cargo doc --release $(CARGO_FLAGS) --no-deps --workspace $(FEATURES)

lint-fast:
	cargo fmt --all --check
	python3 scripts/module_cycles.py $(CYCLE_FREE)

clean:
	cargo clean
