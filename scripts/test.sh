#!/usr/bin/env bash
# One test command: lint, type checking, the front-end's unit tests, the whole suite (with
# doctests and the browser tests) on the newest JAX, then the core suite on the oldest supported JAX. Fails if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu

.venv/bin/python -m ruff check yax yax_widget tests bench docs
.venv/bin/python -m mypy  # strict on yax/ (pyproject's [tool.mypy])
npm --prefix js test
.venv/bin/python -m pytest -n 2 "$@"
.venv-oldest/bin/python -c "import jax; print('core suite on the oldest supported jax', jax.__version__)"
.venv-oldest/bin/python -m pytest -n 2 -m core tests "$@"
