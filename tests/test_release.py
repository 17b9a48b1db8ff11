"""Release hygiene: one version source with a changelog entry, and declared Python/JAX/Flax ranges that
the two test environments really test (the oldest, .venv-oldest, at exactly the lower bounds)."""

import pathlib
import platform
import re
import sys
import tomllib

import flax
import jax
import jaxlib
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import yax

pytestmark = pytest.mark.core

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DECLARED = {r.name: r.specifier for r in map(Requirement, PROJECT["dependencies"])}
TESTED = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__}


def lower_bound(name: str) -> str:
    (spec,) = [s for s in DECLARED[name] if s.operator == ">="]
    return spec.version


def test_one_version_source_and_its_changelog_entry():
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT  # read from yax/__init__.py
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", yax.__version__)
    assert re.search(rf"^## {re.escape(yax.__version__)}\b", (ROOT / "CHANGELOG.md").read_text(), re.M)


def test_this_environment_is_in_the_declared_ranges():
    assert Version(platform.python_version()) in SpecifierSet(PROJECT["requires-python"])
    assert f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}" in PROJECT["classifiers"]
    for name, version in TESTED.items():
        assert Version(version) in DECLARED[name], (name, version, str(DECLARED[name]))


def test_the_oldest_environment_tests_the_lower_bounds():
    # scripts/setup.sh pins .venv-oldest; the pins are the declared lower bounds
    pins = dict(re.findall(r'"(jax|jaxlib|flax)==([^"]+)"', (ROOT / "scripts" / "setup.sh").read_text()))
    assert pins == {name: lower_bound(name) for name in TESTED}
    if pathlib.Path(sys.prefix).name == ".venv-oldest":
        assert TESTED == pins
