# Two entry points: `make optimize` (the product's main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: optimize test install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(STAMP_DEV): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)
install-dev: $(STAMP_DEV)

optimize: $(STAMP)
	$(PY) -m search.optimize --stages 4

test: $(STAMP_DEV)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
