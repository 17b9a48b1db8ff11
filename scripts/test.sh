#!/usr/bin/env bash
# One test command: lint, type checking, the front-end's unit tests, the whole suite (with
# doctests and the browser tests) on the newest JAX, then the core suite on the oldest supported JAX. Fails if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu
# JAX's persistent compilation cache, fresh for each run of this command (nothing carries over from
# an earlier run): the suite compiles many of the same programs in different tests and processes
# (on a 2-core CPU: the third-party zoo's tests 157 -> 131 s, the newest suite 16-19 -> 15 min)
export JAX_COMPILATION_CACHE_DIR="$(mktemp -d -t yax-jax-cache.XXXXXX)"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT

.venv/bin/python -m ruff check yax yax_widget tests bench docs
.venv/bin/python -m mypy  # strict on yax/ (pyproject's [tool.mypy])
npm --prefix js test
.venv/bin/python -m pytest -n 2 "$@"
.venv-oldest/bin/python -c "import jax; print('core suite on the oldest supported jax', jax.__version__)"
.venv-oldest/bin/python -m pytest -n 2 -m core tests "$@"
