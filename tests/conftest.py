import importlib.util
import os
import sys

import pytest

# `make_mox` and every rewrite check what they return (`yax.check_mox`), as JAX's own tests run
# under JAX_ENABLE_CHECKS: a rewrite that leaves a malformed MoX fails the test that made it.
os.environ.setdefault("YAX_ENABLE_CHECKS", "1")

# Eight CPU devices, so that sharded models run here as on a pod (tests/test_sharding.py): set
# before anything imports jax, and in the environment, so the JupyterLab kernels the browser tests
# start inherit it. Appended to what XLA_FLAGS holds already; the default device stays the first,
# so every other test runs as it did on one.
_DEVICES = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICES}".strip()
# The tests check what yax computes against JAX in the same process, not how fast XLA's code runs:
# LLVM's optimisations off compile the suite's thousands of small programs about 2.5 times faster on
# CPU. They change what XLA computes where a value overflows, so the browser tests' kernels, which
# show users' numbers, do without them (tests/e2e/lab.py), as bench/ does. (XLA:CPU's older fusion
# emitters, `--xla_cpu_use_fusion_emitters=false`, compile a one-operation program in 23 ms instead
# of 39, but with them jaxlib 0.10.2 crashed twice in two full runs, compiling and loading.)
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + _FAST_COMPILE

# JAX's persistent compilation cache, where one is asked for (the fast tier keeps one in .jax-cache/:
# scripts/test.sh): a directory for each test process, by JAX version and xdist worker. JAX writes a
# cache file in place rather than renaming a finished one, so a process reading a program that
# another is still writing loads a truncated executable and crashes: a segfault in
# `get_executable_and_time`, seen when a fresh kernel (tests/widget/test_script_runs.py) compiled the
# programs its test was compiling. The processes the tests start (kernels, the docs build) inherit
# the variable and so use the directory itself, apart from every test process.
_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR")
if _CACHE:
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(
        _CACHE, f"jax-{jax.__version__}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"))

# The test models live beside the tests; bench/ imports them too.
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="module")
def tf():
    """The test Transformer's MoX (models.CASES["transformer"]), traced once per test file."""
    from helpers import mox_of

    return mox_of("transformer")


def pytest_addoption(parser):
    parser.addoption(
        "--oracle-examples", type=int, default=None,
        help="examples per oracle property (tests/oracle); default $YAX_ORACLE_EXAMPLES or 12",
    )


def pytest_configure(config):
    # read by tests/oracle/gen.py when the oracle's modules are collected (after this hook)
    n = config.getoption("--oracle-examples")
    if n is not None:
        os.environ["YAX_ORACLE_EXAMPLES"] = str(n)



#: The test modules that import PyTorch (the port checks, issue 40): none of their tests is in the
#: core suite, which the test command also runs with the oldest JAX, in an environment without PyTorch.
TORCH_MODULES = ("ports.py", "test_reference.py", "test_reference_explorer.py")


def pytest_ignore_collect(collection_path, config):
    """tests/gemma_checks.py imports gemma, which patches Flax for the whole process: only the
    interpreter tests/test_gemma.py starts for it (``YAX_GEMMA_CHECKS=1``) collects it, doctests
    included. The modules that import PyTorch are not collected for the core suite (``-m core``)
    where PyTorch is not installed: they hold no core test (checked by
    tests/test_reference.py), and anywhere else a missing PyTorch fails their import."""
    if collection_path.name == "gemma_checks.py" and os.environ.get("YAX_GEMMA_CHECKS") != "1":
        return True
    if (collection_path.name in TORCH_MODULES and config.getoption("markexpr") == "core"
            and importlib.util.find_spec("torch") is None):
        return True
    return None
