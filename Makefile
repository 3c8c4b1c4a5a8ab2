# Two entry points: `make optimize` (the product's main job) and `make test` (the whole suite and the code checks).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: optimize test check bytecode docs docs-serve install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# dev: the test tools, the manual's builder (docs) and the training frameworks whose split rules are measured (pipeline.peers); torchtitan
# without its dependencies (see pyproject.toml's peers extra)
$(STAMP_DEV): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[dev,peers,docs]'
	$(PY) -m pip install -q --no-deps 'torchtitan>=0.3'
	touch $@

install: $(STAMP)
install-dev: $(STAMP_DEV)

optimize: $(STAMP) bytecode
	$(PY) -m search.optimize --stages 4

# the code checks: layers that import only downward (import-linter), lint (ruff), types (mypy)
check: $(STAMP_DEV)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# the manual, from docs/ (mkdocs.yml): a broken link, a missing page or a docstring it cannot read fails it
docs: $(STAMP_DEV)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP_DEV)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs serve

# tests/test_docs.py builds the manual with --strict too, and checks every flag is in its reference.
# Two pytest-xdist workers, a test file each at a time: one process left the second core idle a quarter of the
# time (waiting on subprocesses, servers and barriers); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: check bytecode
	$(PY) -m pytest -q --durations=10 -n $(TEST_WORKERS) --dist loadfile tests

# Our modules' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as on our CI machines) every
# interpreter a run starts (the driver, each forkserver, each torchrun rank, each CLI a test runs) would
# otherwise compile them from source again; Python still recompiles any file edited since.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 pipeline search costmodel tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/site
	find pipeline search costmodel tests benchmarks -name __pycache__ -type d -prune -exec rm -rf {} +
