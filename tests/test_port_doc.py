"""docs/port.md runs as written: its Python blocks, in order, in one namespace, in a fresh
directory, each printing exactly the ``text`` block that follows it."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "port.md"


def blocks() -> list[tuple[str, str | None]]:
    """(code, the output shown after it, or None) for each Python block of the page."""
    found = re.findall(r"```(python|text)\n(.*?)```", DOC.read_text(), re.S)
    out: list[tuple[str, str | None]] = []
    for kind, body in found:
        if kind == "python":
            out.append((body, None))
        else:
            assert out and out[-1][1] is None, "an output block follows a Python block"
            out[-1] = (out[-1][0], body)
    return out


def test_the_verify_a_port_page_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    shown = blocks()
    assert len(shown) == 6 and all(o is not None for _, o in shown)
    for code, want in shown:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, str(DOC), "exec"), ns)  # noqa: S102 - the page's own code
        assert buf.getvalue() == want, f"{code}\nprinted:\n{buf.getvalue()}\nthe page shows:\n{want}"
    assert (tmp_path / "gpt2-reference.safetensors").exists()
    ns["ex"].session.close()
