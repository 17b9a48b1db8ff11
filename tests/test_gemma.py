"""DeepMind's `gemma` library against yax (the checks: tests/gemma_checks.py), each run
for real in an interpreter of its own.

Importing gemma changes Flax for the whole process: it replaces ``nn.Module.param``
with a wrapper that requires a shape and hands the dtype to the initialiser as a
positional argument, and kauldron wraps ``nn.Module.init``/``apply``. Hugging Face's
Flax Llama (``self.param("weight", lambda _, shape: …, size)``) then fails in that
process, whatever yax does. So the checks run once in a fresh ``python -m pytest``
and each is reported here by name, with its own failure."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.slow  # gemma in an interpreter of its own

HERE = pathlib.Path(__file__).parent
CHECKS = HERE / "gemma_checks.py"
NAMES = [f.name for f in ast.parse(CHECKS.read_text()).body
         if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    report = tmp_path_factory.mktemp("gemma") / "report.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHECKS),
                          f"--junitxml={report}"], capture_output=True, text=True, timeout=1200, cwd=HERE.parent,
                         env={**os.environ, "YAX_GEMMA_CHECKS": "1"})
    if not report.exists():
        pytest.fail(f"the gemma checks did not run (exit {run.returncode}):\n{run.stdout[-4000:]}{run.stderr[-4000:]}")
    found = {}
    for case in ET.parse(report).iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        found[case.get("name")] = (bad.get("message", "") + "\n" + (bad.text or "") if bad is not None
                                   else "skipped" if skipped is not None else None)
    return found, run.stdout[-4000:]


@pytest.mark.parametrize("name", NAMES)
def test_gemma(name, outcomes):
    found, tail = outcomes
    assert name in found, f"{name} was not run by the gemma checks:\n{tail}"
    assert found[name] is None, found[name][-6000:]
