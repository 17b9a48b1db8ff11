#!/usr/bin/env bash
# The test command, in two tiers (README, "Set up and test"):
#
#   bash scripts/test.sh          the full command (CI): lint, type checking, the front-end's unit
#                                 tests, the whole suite on the newest JAX (doctests, browser tests,
#                                 notebooks, the wheel, the docs) and, at the same time, the core
#                                 suite on the oldest supported JAX. Fails if anything fails.
#   bash scripts/test.sh --fast   the edit-test loop: lint, type checking, the front-end's unit tests
#                                 and the suite on the newest JAX without the browser and the
#                                 slowest tests (`-m "not e2e and not slow"`: the zoos, the docs
#                                 site, fresh kernels, the biggest models), the oracle drawing 3
#                                 examples a property; about 5 minutes on 2 cores once JAX's
#                                 compilation cache (.jax-cache/, kept between fast runs) is warm.
#
# Further arguments go to pytest (both tiers), e.g. `--fast tests/test_eval.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [[ "${1:-}" == "--fast" ]]; then FAST=1; shift; fi
export JAX_PLATFORMS=cpu
# Python's compiled modules and pytest's rewritten test modules are kept (__pycache__, git-ignored)
# where the environment says not to write them: collecting the suite takes 19 s instead of 28.
unset PYTHONDONTWRITEBYTECODE
# JAX's persistent compilation cache: the fast tier keeps one in .jax-cache/ (git-ignored) between
# runs, a directory for each worker (tests/conftest.py): its suite takes 4.5-5 instead of 9.6
# minutes once warm. The full command runs without one: it would start empty, and within a run it
# saves no time. Measured on the zoos and test_trace.py (two workers): 272 s without a cache, 284 s
# with one directory per process (programs of 0.2 s and more); 546 s with one directory shared by
# every process, made safe by JAX's file lock (`JAX_COMPILATION_CACHE_MAX_SIZE`), as every write
# then lists the whole directory to evict.
if ((FAST)); then
    export JAX_COMPILATION_CACHE_DIR="$PWD/.jax-cache"
    export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
fi
JS_LOG="$(mktemp -t yax-js.XXXXXX)" OLDEST_LOG="$(mktemp -t yax-oldest.XXXXXX)" E2E_LOG="$(mktemp -t yax-e2e.XXXXXX)"
trap 'rm -f "$JS_LOG" "$OLDEST_LOG" "$E2E_LOG"' EXIT

.venv/bin/python -m ruff check yax yax_widget tests bench docs
npm --prefix js test >"$JS_LOG" 2>&1 &  # the front-end's unit tests, beside mypy
js=$!
.venv/bin/python -m mypy  # strict on yax/ (pyproject's [tool.mypy])
js_rc=0
wait "$js" || js_rc=$?
tail -n 12 "$JS_LOG"
if ((js_rc)); then cat "$JS_LOG"; echo "the front-end's unit tests failed"; exit "$js_rc"; fi

if ((FAST)); then
    .venv/bin/python -m pytest -n 2 --dist loadfile -m "not e2e and not slow" --ignore=tests/e2e --oracle-examples 3 \
        --durations=15 "$@"
    exit
fi

# Three runs at once, each reported after the last one ends: the newest suite without the browser
# tests on two workers; the browser tests in one process (one JupyterLab, one chromium: they spend
# most of their time waiting on them); the core suite on the oldest JAX. The newest suite's workers
# take whole test files (`--dist loadfile`), so a file's module fixtures and the zoo's traced models
# are built in one worker, not in both. (pytest-xdist's
# `--dist loadgroup` cannot put the browser tests on one worker under pytest 9: it renames nodes
# through an attribute pytest 9 no longer reads.) The oldest JAX's suite runs on two workers too, so
# that it does not finish last on one core. Its oracle draws 4 examples a property, not 12: that run
# is there to find what the oldest JAX does differently, which every example meets alike; the newest
# run searches the space of models. Each run draws new examples (Hypothesis is not derandomised),
# so the search goes on from run to run; before a release run it larger (README).
.venv-oldest/bin/python -c "import jax; print('core suite on the oldest supported jax', jax.__version__)"
.venv-oldest/bin/python -m pytest -n 2 --dist loadfile -m core --oracle-examples 4 --durations=10 tests "$@" >"$OLDEST_LOG" 2>&1 &
oldest=$!
.venv/bin/python -m pytest -p no:xdist -m e2e --durations=10 "$@" >"$E2E_LOG" 2>&1 &
browser=$!
newest_rc=0
.venv/bin/python -m pytest -n 2 --dist loadfile -m "not e2e" --durations=25 "$@" || newest_rc=$?
browser_rc=0
wait "$browser" || browser_rc=$?
oldest_rc=0
wait "$oldest" || oldest_rc=$?
echo "---- the browser tests (newest JAX) ----"
cat "$E2E_LOG"
echo "---- the core suite on the oldest supported JAX ----"
cat "$OLDEST_LOG"
echo "newest suite: exit $newest_rc; browser tests: exit $browser_rc; oldest core suite: exit $oldest_rc"
exit $((newest_rc || browser_rc || oldest_rc))
