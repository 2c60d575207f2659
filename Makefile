# xpuremote: `make demo` sets everything up and runs an example CUDA program on a local server;
# `make test` runs the checks and the test suite. Both work on a fresh machine with Python,
# pip, gcc and git: the NVIDIA runtimes, nvcc and cuda-python come from the package index.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TOOLS  := $(PY) -c 'import sys; sys.path.insert(0, "tests"); import toolchain as t; print(getattr(t, sys.argv[1])() or "")'
BUILD  := build
# The stock PyTorch CUDA wheel lives in a venv of its own: it needs a newer CUDA runtime wheel
# than the one the test extra pins for the runtime tests.
TORCH_VENV  := .venv-torch
TORCH_STAMP := $(TORCH_VENV)/.installed

.PHONY: setup shim torch demo test lint check-generated bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# About 2.8 GB from the package index (torch and its nvidia-* wheels), 5.3 GB installed.
$(TORCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TORCH_VENV)/bin/python -m pip install --quiet -e '.[torch]'
	touch $@

torch: $(TORCH_STAMP)

shim: setup
	$(PY) -m xpuremote.interpose.build

$(BUILD)/vector_add: examples/vector_add.cu $(STAMP)
	mkdir -p $(BUILD)
	$$($(TOOLS) nvcc_path) -arch=sm_90 -L$$($(TOOLS) nvcc_lib_dir) -o $@ $<

# The main job: a local xpu-server (GPU if present, else the sim device) and a CUDA program on it.
demo: shim $(BUILD)/vector_add
	XPU_SIM_KERNELS=examples/sim_kernels.py $(VENV)/bin/xpu-run -- $(BUILD)/vector_add

lint: setup
	$(PY) -m ruff check .

# the math libraries' headers come with the torch venv's NVIDIA wheels
check-generated: setup torch
	$(PY) -m xpuremote.protocol.generate --check

# The tests start a few thousand short-lived Python processes (servers, workers, shimmed
# programs): compile the project's modules once, even where the environment turns off writing
# bytecode, rather than parse them in every process.
test: lint check-generated shim torch
	$(PY) -m compileall -q protocol client server interpose perfmodel
	$(PY) -m pytest -q

bench: shim torch
	$(PY) bench/foundation.py --out bench/results/foundation-sim.json
	$(PY) bench/mathlibs.py --out bench/results/mathlibs-sim.json

clean:
	rm -rf $(BUILD) .pytest_cache
