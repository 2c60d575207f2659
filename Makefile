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

# The development install is setuptools' strict editable mode: $(BUILD)/__editable__.xpuremote-*/ is a tree of
# links to the checkout's files, which editors and static tools follow (point them at $(PY)); the default mode's
# import hook, which maps xpuremote.* onto the top-level folders, hides every import between them from those
# tools. An edit is seen at once. A file added to or removed from a package is seen only once the tree is made
# again: `make setup`, and every target that needs $(VENV), reinstalls whenever the packages' list of files changed.
EDITABLE      := --config-settings editable_mode=strict
PACKAGE_DIRS  := protocol client server server/backends interpose perfmodel
PACKAGE_FILES := $(sort $(foreach d,$(PACKAGE_DIRS),$(wildcard $(d)/*.py $(d)/*.c $(d)/*.h $(d)/*.json)))
FILE_LIST     := $(VENV)/.package-files

.PHONY: setup shim torch demo test lint check-generated bench gpu-bundle gpu-check clean FORCE

setup: $(STAMP)

$(STAMP): pyproject.toml $(FILE_LIST)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' $(EDITABLE)
	touch $@

# rewritten only when the list changed, so that the install is made again only then
$(FILE_LIST): FORCE
	@mkdir -p $(VENV)
	@printf '%s\n' $(PACKAGE_FILES) | cmp -s - $@ || printf '%s\n' $(PACKAGE_FILES) > $@

# About 2.8 GB from the package index (torch and its nvidia-* wheels), 5.3 GB installed. Its editable install
# is setuptools' default: no editor follows this venv, and it sees a new file without a reinstall.
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
# .venv imports them through the tree of links (its bytecode goes there), .venv-torch from the folders.
test: lint check-generated shim torch
	$(PY) -m compileall -q protocol client server interpose perfmodel \
		$$($(PY) -c 'import xpuremote; print(*xpuremote.__path__)')
	$(PY) -m pytest -q

bench: shim torch
	$(PY) bench/foundation.py --out bench/results/foundation-sim.json
	$(PY) bench/mathlibs.py --out bench/results/mathlibs-sim.json

# The GPU check (docs/gpu-check.md). `make gpu-bundle` here, with the package index: what a GPU
# machine without network lacks, into $(GPU_BUNDLE). `make gpu-check OUT=dir` there: install it,
# build the shim, run the stages (STAGES=3,6,4,2,5,1, in that order) against a GPU; BACKEND=sim runs them here on
# the sim (the dry run CI does), with this project's venvs.
GPU_BUNDLE  ?= gpu-bundle
BACKEND     ?= cuda
STAGES      ?= 3,6,4,2,5,1
# a local Python of the GPU machine's version, whose headers and libpython the bundle carries
BUNDLE_PYTHON ?= python3.12
ifeq ($(BACKEND),sim)
GPU_PYTHON  ?= $(PY)
GPU_DEPS    := setup torch
GPU_TORCH   := --torch-python $(TORCH_VENV)/bin/python
else
GPU_PYTHON  ?= python3
endif

gpu-bundle: setup
	$(PY) bench/gpu_check.py bundle --out $(GPU_BUNDLE) --headers-from "$$(command -v $(BUNDLE_PYTHON))"

gpu-check: $(GPU_DEPS)
	@test -n "$(OUT)" || { echo "make gpu-check OUT=dir [BACKEND=cuda|sim] [STAGES=3,6,4,2,5,1]"; exit 2; }
	$(GPU_PYTHON) bench/gpu_check.py run --bundle $(GPU_BUNDLE) --out $(OUT) --backend $(BACKEND) \
		--stages $(STAGES) --python $(GPU_PYTHON) $(GPU_TORCH)

# all of $(BUILD) but the development install's tree of links (see setup)
clean:
	rm -rf .pytest_cache $(filter-out $(wildcard $(BUILD)/__editable__.*),$(wildcard $(BUILD)/*))
