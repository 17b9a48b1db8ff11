"""The wheel carries the widget's bundle: build it, install it into a clean
venv (dependencies come from the test environment's site-packages, not from
this checkout) and import the widget from there."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import sysconfig
import venv
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_contains_the_bundle_and_imports(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist")], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("yax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"yax_widget/static/widget.js", "yax_widget/static/widget.css", "yax/__init__.py"} <= set(names)
    assert not any(n.startswith(("js/", "tests/")) for n in names)

    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # dependencies (jax, anywidget, ...) from the test environment, after the wheel's own files
    pathlib.Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = (
        "import pathlib, yax, yax_widget;"
        "p = pathlib.Path(yax_widget.__file__).parent;"
        f"assert str(p).startswith({str(env)!r}), p;"
        f"assert pathlib.Path(yax.__file__).is_relative_to({str(env)!r});"
        "js = (p / 'static' / 'widget.js').read_text();"
        "assert 'export' in js and len(js) > 100_000, len(js);"
        "import jax.numpy as jnp;"
        "ex = yax_widget.Explorer(jnp.sin, jnp.ones(3));"
        "print(len(ex._tree['rows']), ex._esm[:0] == '')"
    )
    out = subprocess.run([py, "-c", check], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["0", "True"]
