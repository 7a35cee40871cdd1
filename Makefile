# Two entry points for a fresh machine: `make run` (the server on the embedded default profile)
# and `make test` (lint, format check, the whole suite). Both create and reuse .venv.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHIM := app/runtime/libmlxcel_sgemm.so
# MLX's backend on Linux: cpu (OpenBLAS shim) or cuda (an NVIDIA GPU: docs/gpu.md).
BACKEND ?= cpu

.PHONY: run test bench install

install: $(STAMP) $(SHIM)

$(STAMP): pyproject.toml
	@echo "installing mlxcel and its dependencies into $(VENV) (about a minute on a fresh machine)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev,$(BACKEND)]"
	touch $(STAMP)

# OpenBLAS for MLX's CPU matrix products (app/runtime/blas.py explains why).
$(SHIM): app/runtime/sgemm_rows.c $(STAMP)
	MLXCEL_BLAS=reference $(BIN)/python -c "from app.runtime.blas import build; build()"

# `make run PORT=9000 HOST=0.0.0.0 PROFILE=target-only`: any of them, each as its flag; unset ones
# leave the profile's value. `exec`: the server is make's child itself, so a signal to make's
# process group reaches it as one stop (app/cli/serving.py), and it drains.
run: install
	exec $(BIN)/mlxcel serve $(if $(PROFILE),--profile $(PROFILE)) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

# The replica test runs real nginx and the web page's test headless Chromium: .ci/ensure-nginx and
# .ci/ensure-chromium install Debian's packages where they are missing.
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	bash .ci/ensure-nginx
	bash .ci/ensure-chromium
	$(BIN)/pytest

bench: install
	$(BIN)/mlxcel bench --write
