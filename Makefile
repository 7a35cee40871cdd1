# Two entry points for a fresh machine: `make run` (the server on the embedded default profile)
# and `make test` (lint, format check, the whole suite). Both create and reuse .venv.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHIM := app/runtime/libmlxcel_sgemm.so
# MLX's backend on Linux: cpu (OpenBLAS shim) or cuda (an NVIDIA GPU: docs/gpu.md).
BACKEND ?= cpu
# mimalloc (the dev extra's cmeel-mimalloc) for the suite's pytest processes alone: MLX allocates
# an array's buffer on the thread that evaluates its graph and frees it on its stream's thread, the
# pattern glibc's arenas serve worst. Servers and commands the tests start run on the system's
# malloc, as operators run them (tests/conftest.py). Empty where it is not installed: glibc's.
MIMALLOC = $(abspath $(firstword $(wildcard $(VENV)/lib/python*/site-packages/cmeel.prefix/lib/libmimalloc.so)))

.PHONY: run test bench install

install: $(STAMP) $(SHIM)

# A fresh machine's first `make run` spends minutes here (MLX, mlx-lm and transformers are a few
# hundred MB to fetch and unpack), so each step says what it does and pip prints what it fetches.
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) for mlxcel: 1 to 7 minutes on a fresh machine (pip fetches a few hundred MB)"
	@test -x $(BIN)/python || { echo "make: [1/3] creating the virtual environment $(VENV) (seconds)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: [2/3] installing mlxcel and its dependencies with pip (MLX, mlx-lm, transformers, Litestar, ...): the long step"
	@started=$$(date +%s); \
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar off -e ".[dev,$(BACKEND)]" && \
	echo "make: dependencies installed in $$(( $$(date +%s) - started )) s"
	@touch $(STAMP)

# OpenBLAS for MLX's CPU matrix products (app/runtime/blas.py explains why).
$(SHIM): app/runtime/sgemm_rows.c $(STAMP)
	@echo "make: [3/3] building the OpenBLAS shim for MLX's CPU products (seconds)"
	MLXCEL_BLAS=reference $(BIN)/python -c "from app.runtime.blas import build; build()"

# `make run PORT=9000 HOST=0.0.0.0 PROFILE=target-only`: any of them, each as its flag; unset ones
# leave the profile's value. `exec`: the server is make's child itself, so a signal to make's
# process group reaches it as one stop (app/cli/serving.py), and it drains.
run: install
	@echo "make: starting mlxcel serve; it answers /health once its models are loaded (seconds)"
	exec $(BIN)/mlxcel serve $(if $(PROFILE),--profile $(PROFILE)) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

# The replica test runs real nginx and the web page's test headless Chromium: .ci/ensure-nginx and
# .ci/ensure-chromium install Debian's packages where they are missing.
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	bash .ci/ensure-nginx
	bash .ci/ensure-chromium
	LD_PRELOAD=$(MIMALLOC) $(BIN)/pytest

bench: install
	$(BIN)/mlxcel bench --write
