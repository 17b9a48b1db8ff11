"""A source install ships a working widget. ``git archive`` of HEAD is a clean checkout (no JS bundle,
no node_modules); it is built into an sdist and a wheel from that sdist, whose build hook runs npm and
esbuild (hatch-jupyter-builder, see pyproject.toml). The wheel goes into a clean venv, and an Explorer
made by a kernel of that venv renders in JupyterLab and chromium.

Nothing big is downloaded: the build runs without isolation on this environment's hatchling, npm
prefers its cache, and the clean venv borrows this environment's dependencies (jax, anywidget,
ipykernel, ...) through a ``.pth`` line placed after its own site-packages, so ``yax`` and
``yax_widget`` come from the wheel alone."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile

import pytest
from e2e.lab import ROOT, Notebook, browser, jupyterlab, write_notebook

import yax

pytestmark = pytest.mark.e2e

SHOT = ROOT / "artifacts" / "e2e" / "failure-wheel.png"

CELL = """import pathlib, sys, jax, jax.numpy as jnp, flax.linen as nn, yax, yax_widget
static = pathlib.Path(yax_widget.__file__).parent / "static"
print("PREFIX=" + sys.prefix, "YAX=" + yax.__file__, "JS=" + str(len((static / "widget.js").read_text())))
m = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
x = jnp.ones((2, 4))
yax_widget.Explorer(m, m.init(jax.random.key(0), x), x)"""


def run(cmd: list, **kw) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_a_clean_checkout_builds_installs_and_renders(tmp_path, monkeypatch):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to `git archive`")
    src, dist = tmp_path / "src", tmp_path / "dist"
    src.mkdir()
    run(["git", "-C", str(ROOT), "archive", "-o", str(tmp_path / "head.tar"), "HEAD"])
    with tarfile.open(tmp_path / "head.tar") as t:
        t.extractall(src, filter="data")
    assert not (src / "yax_widget" / "static").exists()

    # sdist, then a wheel from the unpacked sdist (what `pip install <sdist>` does)
    env = {**os.environ, "npm_config_prefer_offline": "true", "npm_config_audit": "false",
           "npm_config_fund": "false"}
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)], env=env)
    (sdist,) = dist.glob("yax-*.tar.gz")
    (wheel,) = dist.glob("yax-*.whl")
    assert wheel.name == f"yax-{yax.__version__}-py3-none-any.whl"  # one version source
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"js/package.json", "js/package-lock.json", "js/src/index.js", "js/src/widget.css",
            "yax/__init__.py", "LICENSE", "CHANGELOG.md"} <= in_sdist
    assert not any(n.startswith(("js/node_modules", "yax_widget/static")) for n in in_sdist)
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert {"yax_widget/static/widget.js", "yax_widget/static/widget.css", "yax/__init__.py"} <= in_wheel
    assert not any(n.startswith(("js/", "tests/", "docs/")) for n in in_wheel)

    # a clean venv: the wheel's files, then this environment's site-packages for the dependencies
    target = tmp_path / "venv"
    venv.create(target, symlinks=True)
    py = target / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    pathlib.Path(site, "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    # JupyterLab (from this environment) runs its "python3" kernels with the clean venv's python
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (yax wheel)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    lab = tmp_path / "lab"
    lab.mkdir()
    write_notebook(lab / "wheel.ipynb", [CELL])
    with jupyterlab(lab) as url, browser() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        nb = Notebook(page, url, "wheel.ipynb")
        try:
            out = dict(w.split("=", 1) for w in nb.run(0).split() if "=" in w)
            assert out["PREFIX"] == str(target) and out["YAX"].startswith(site), out
            assert int(out["JS"]) > 100_000, out
            page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=60_000)
            names = page.locator(".yax-explorer .yax-row .yax-name").all_inner_texts()
            assert names == ["Sequential", "layers_0", "gelu", "layers_2"]
        except BaseException:
            SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOT), full_page=True)
            print("console errors:", nb.errors)
            raise
        assert nb.errors == [], nb.errors
