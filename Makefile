# omnibert: `make demo` and `make test` are the two commands a newcomer needs.
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU machine must not pull the multi-GB CUDA build: install this torch first.
# An environment that already has torch (Gaudi/IPU containers, with
# VENV_ARGS=--system-site-packages) keeps the one it has.
TORCH_SPEC ?= torch==2.13.0
VENV_ARGS ?=
PYTEST_ARGS ?= -n 2

.PHONY: install demo test test-fast lint typecheck format docs docs-serve bench-prepare clean wheelhouse install-offline \
	gpu-bundle gpu-check

install: $(VENV)/.omnibert-installed

$(VENV)/.omnibert-installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV_ARGS) $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[dev,wiki,bench,docs]"
	@touch $@

demo: install
	$(PY) scripts/demo.py

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# the fast lane: tests/unit only (components in-process); `make test` runs tests/e2e as well
test-fast: install
	$(PY) -m pytest $(PYTEST_ARGS) tests/unit

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor, a
# page missing from the nav or a docstring that fails to render fails the build
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench-prepare: install
	$(PY) scripts/bench_prepare.py

# Offline installs (README "Installing without internet"): the wheels a target environment
# lacks, for its Python and platform, checked against its `pip list --format=freeze` (BASE).
PYTHON ?= python3
WHEELHOUSE ?= wheelhouse
PYVER ?=
PLATFORM ?= local
BASE ?=
EXTRAS ?=
TARGET ?=

wheelhouse:
	$(PYTHON) scripts/wheelhouse.py build --dest $(WHEELHOUSE) --platform $(PLATFORM) \
		$(if $(PYVER),--python-version $(PYVER)) $(if $(BASE),--base $(BASE)) \
		$(if $(EXTRAS),--extras $(EXTRAS))

# into PYTHON's environment, or with TARGET=dir into a directory for PYTHONPATH; no index
install-offline:
	$(PYTHON) scripts/wheelhouse.py install --wheelhouse $(WHEELHOUSE) $(if $(TARGET),--target $(TARGET))

# The GPU check (docs/accelerators/gpu.md): the wheels a GPU image without network lacks, built
# here into .gpu-bundle/ (Python 3.12, manylinux x86_64), and the one command to run there with
# that machine's python3 (PYTHON=), results under GPU_OUT.
GPU_OUT ?= gpu-check-out
GPU_CHECK_ARGS ?=

gpu-bundle: install
	$(PY) scripts/gpu_bundle.py

gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh $(GPU_OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) outputs multirun site .pytest_cache .mypy_cache .ruff_cache .gpu-bundle
