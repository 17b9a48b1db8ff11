"""A snapshot anyone can open (`Explorer.save_html`, the Save HTML button): one
HTML file holding the explorer's state as the kernel computed it (the tree, the
comparison with its heatmap buffers, the selected row's values, the history, the
recorded replies) and the front-end's bundle, once. Bad paths are refused with a
sentence and nothing is written; an explorer opened with abstract parameters
saves its structure. The page itself is opened in a browser by
tests/e2e/test_snapshot_e2e.py."""

from __future__ import annotations

import base64
import json
import re

import jax
import pytest

import yax
from yax.internal import view
from yax_widget import Explorer
from yax_widget._snapshot import STATIC, SnapshotPathError, View, save_html
from yax_widget._values import NO_VALUES

from .helpers import IDS, ask, explorer


def page_data(text: str) -> dict:
    """What the page renders from: its ``yax-snapshot-data`` element."""
    found = re.search(r'<script type="application/json" id="yax-snapshot-data">(.*?)</script>', text, re.S)
    assert found is not None
    return json.loads(found.group(1))


def replies(data: dict) -> dict[str, dict]:
    return {json.dumps(r["request"], sort_keys=True): r["reply"] for r in data["replies"]}


def key(**request) -> str:
    return json.dumps(request, sort_keys=True)


def row_id(ex: Explorer, xpath: str) -> int:
    return view(ex.mox).ids[id(yax.query(xpath, ex.mox)[0])]


@pytest.fixture(scope="module")
def changed(model):
    ex = explorer(model, warm=False)
    ex.substitute("//activation", "ReLU")  # a comparison to show
    ex.session.inspector.show(yax.query('//module_call[@name="Block_0"]', ex.mox)[0])  # what a row's Values tab does
    return ex


def test_the_file_holds_the_state_the_kernel_computed_and_the_bundle_once(changed, tmp_path):
    ex = changed
    p = ex.save_html(tmp_path / "t.html")
    text = p.read_text(encoding="utf-8")
    data = page_data(text)
    state = data["state"]
    for trait in ("_tree", "_original_tree", "_history", "_diff", "_palette", "_batches"):
        assert state[trait] == json.loads(json.dumps(getattr(ex, trait))), trait
    # its status line says what the page shows, not the kernel's last news (the save itself, say)
    assert state["_status"] == {"busy": False, "message": "step 1 of 1: replaced 4 node(s) selected by //activation "
                                                          "with ReLU"}
    assert ex._status["message"] != state["_status"]["message"]
    assert state["_history"]["items"] == ["replaced 4 node(s) selected by //activation with ReLU"]
    # the comparison, its heatmaps as the same float32 bytes
    c, want = state["_comparison"], ex._comparison
    assert c["first_divergence"] == want["first_divergence"] and c["allclose"] is False
    assert c["outputs"][0]["rel"] == want["outputs"][0]["rel"] and c["boundaries"] == want["boundaries"]
    for part in ("original", "modified", "diff"):
        assert base64.b64decode(c["outputs"][0]["heat"][part]["$bytes"]) == want["outputs"][0]["heat"][part]
    # from Python, the selected row is the one the values pane shows: its values and their reply
    block = row_id(ex, '//module_call[@name="Block_0"]')
    assert data["view"]["selected"] == block and state["_values"]["id"] == block
    stats = ex.values('//module_call[@name="Block_0"]')["out"]
    out = state["_values"]["outputs"][0]
    assert (out["min"], out["max"], out["mean"]) == (stats.min, stats.max, stats.mean)
    assert replies(data)[key(type="values", id=block)]["type"] == "ok"
    # the equations of the calls (this model is well within the budget), as `expand` answers them
    dense = row_id(ex, '//module_call[@name="Block_0"]/module_call[@name="Dense_0"]')
    assert replies(data)[key(type="expand", id=dense)] == {k: v for k, v in ask(ex, rid=7, type="expand", id=dense).items()
                                                           if k != "rid"}
    assert replies(data)[key(type="code")]["code"] == ex.code()
    assert "digraph" in replies(data)[key(type="graph", id=block, depth=1)]["dot"]
    # the selected row's source lines (the Source tab), as `source` answers them; another row's need the kernel
    assert replies(data)[key(type="source", id=block)] == {k: v for k, v in ask(ex, rid=8, type="source", id=block).items()
                                                           if k != "rid"}
    assert not any(r["request"]["type"] == "source" and r["request"]["id"] != block for r in data["replies"])
    # the banner's facts; the bundle and its style inlined once; a page that may reach nothing
    assert data["meta"]["model"] == "Transformer" and data["meta"]["version"] == yax.__version__
    bundle = (STATIC / "widget.js").read_text(encoding="utf-8")
    assert text.count(bundle) == 1 and text.count('id="yax-snapshot-bundle"') == 1
    assert (STATIC / "widget.css").read_text(encoding="utf-8") in text
    assert "default-src 'none'" in text
    assert p.stat().st_size < len(bundle.encode()) + 200_000


def test_the_button_writes_next_to_the_notebook_with_the_view_it_reports(changed, tmp_path, monkeypatch):
    ex = changed
    monkeypatch.chdir(tmp_path)
    block, dense = row_id(ex, '//module_call[@name="Block_1"]'), row_id(ex, '//module_call[@name="Dense_1"]')
    top = ex._tree["rows"][0][0]  # the Transformer's row
    v = {"expanded": [top, block, dense], "equations": [dense], "selected": dense, "tab": "Values", "filter": "",
         "only": False, "fold": False, "depth": 2, "scroll": 40}
    reply = ask(ex, rid=1, type="snapshot", view=v)
    assert reply["type"] == "ok" and reply["file"] == "Transformer_snapshot.html", reply
    assert reply["bytes"] == (tmp_path / "Transformer_snapshot.html").stat().st_size
    assert ex._status["message"].startswith("saved Transformer_snapshot.html (")
    data = page_data((tmp_path / "Transformer_snapshot.html").read_text(encoding="utf-8"))
    assert data["view"] == v
    got = replies(data)
    assert got[key(type="expand", id=dense)]["rows"] and got[key(type="graph", id=dense, depth=2)]["type"] == "ok"
    assert data["state"]["_values"]["id"] == dense and got[key(type="values", id=dense)]["id"] == dense
    # a second press of the same view, nothing changed: the file written, nothing written
    assert ask(ex, rid=2, type="snapshot", view=v) == {**reply, "rid": 2}
    # another view: a new file, none replaced
    assert ask(ex, rid=2, type="snapshot", view={**v, "scroll": 0})["file"] == "Transformer_snapshot_2.html"
    # a malformed view or ids of no call: refused, nothing written
    for bad, why in (({**v, "tab": "Nope"}, "`tab` must be one of"), ({**v, "colour": 1}, "has no field `colour`"),
                     ({**v, "expanded": [10**6]}, "`expanded` must be the id of a node"),
                     ({**v, "equations": ["x"]}, "`equations` must be a list")):
        reply = ask(ex, rid=3, type="snapshot", view=bad)
        assert reply["type"] == "error" and why in reply["message"], reply
    assert sorted(f.name for f in tmp_path.iterdir()) == ["Transformer_snapshot.html", "Transformer_snapshot_2.html"]


def test_bad_paths_are_refused_with_a_sentence_and_nothing_is_written(changed, tmp_path):
    ex = changed
    (tmp_path / "there.html").write_text("kept")
    cases = [
        (tmp_path / "t.txt", "must end in `.html`, but", "Try `"),
        (tmp_path / "missing" / "t.html", "does not exist", "Create the folder first"),
        (tmp_path / "dir.html", "is a folder", "Try `"),
        (tmp_path / "there.html", "exists already", "`overwrite=True`"),
        (42, "takes the path of the `.html` file to write, but got `42` of type `int`", "Try `"),
    ]
    (tmp_path / "dir.html").mkdir()
    for path, what, hint in cases:
        with pytest.raises(SnapshotPathError) as e:
            ex.save_html(path)
        assert isinstance(e.value, yax.YaxError) and what in str(e.value) and hint in str(e.value), str(e.value)
        assert str(e.value).endswith(".")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["dir.html", "there.html"]
    assert (tmp_path / "there.html").read_text() == "kept"
    ex.save_html(tmp_path / "there.html", overwrite=True)
    assert page_data((tmp_path / "there.html").read_text())["meta"]["model"] == "Transformer"


def test_an_explorer_of_abstract_parameters_saves_its_structure(model, tmp_path):
    m, variables = model
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), variables)
    ex = Explorer(m, abstract, IDS, warm=False)
    ex.substitute("//activation", "ReLU")
    dense = row_id(ex, '//module_call[@name="Dense_0"]')
    p = ex.save_html(tmp_path / "abstract.html")
    data = page_data(p.read_text(encoding="utf-8"))
    assert data["state"]["_tree"] == json.loads(json.dumps(ex._tree)) and data["state"]["_tree"]["rows"]
    assert data["state"]["_comparison"] == {"message": NO_VALUES}
    # a selected row's values are the kernel's refusal, said as the live Values tab says it
    save_html(ex.session, tmp_path / "selected.html", v=View(selected=dense, tab="Values"))
    data = page_data((tmp_path / "selected.html").read_text(encoding="utf-8"))
    assert replies(data)[key(type="values", id=dense)] == {"type": "error", "message": str(yax.errors.AbstractParams("values"))}
    assert data["state"]["_values"] == {}
    assert any(r["request"] == {"type": "expand", "id": dense} for r in data["replies"])  # equations need no values


# -- issue 38.11: no partial file, and a name too long said in a sentence -------------------------

def test_a_failed_write_leaves_no_file_and_the_retry_succeeds(changed, tmp_path, monkeypatch):
    """A full disk left a truncated page (64 KB of HTML that opened blank) and the retry was refused because the
    file existed. The page is written under another name and renamed when whole."""
    import builtins
    import errno

    from yax_widget import _snapshot

    class FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, text):
            self.fh.write(text[: 1 << 16])  # what fitted
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_snapshot, "open", lambda *a, **k: FullDisk(builtins.open(*a, **k)), raising=False)
    path = tmp_path / "page.html"
    with pytest.raises(SnapshotPathError) as e:
        changed.save_html(path)
    assert "No space left on device" in str(e.value) and str(e.value).endswith("."), str(e.value)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.chdir(tmp_path)
    reply = ask(changed, rid=1, type="snapshot", view=None)  # the button: a refusal, not a crash
    assert reply["type"] == "error" and "No space left on device" in reply["message"], reply
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    changed.save_html(path)
    assert page_data(path.read_text(encoding="utf-8"))["meta"]["model"] == "Transformer"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_name_too_long_is_refused_with_a_sentence(changed, tmp_path):
    """A 300-character name raised a bare OSError ("File name too long") from `Path.is_dir`."""
    with pytest.raises(SnapshotPathError) as e:
        changed.save_html(tmp_path / ("p" * 300 + ".html"))
    assert "bytes long" in str(e.value) and "Try a shorter name." in str(e.value), str(e.value)
    assert list(tmp_path.iterdir()) == []
