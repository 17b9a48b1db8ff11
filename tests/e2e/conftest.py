"""The browser tests' shared JupyterLab and chromium (one of each per test process)."""

from __future__ import annotations

import pytest

from .lab import Lab, browser, jupyterlab


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    with jupyterlab(root) as url, browser() as chromium:
        yield Lab(root, url, chromium)
