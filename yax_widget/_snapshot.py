"""A snapshot anyone can open: the explorer as it is, in one HTML file.

`save_html` writes the explorer's current state (the tree, with the rows the
front-end has open and its selection, the colouring, the comparison, the
selected row's values, the history and the diff) into one page that opens
from disk with no kernel and no network: for CI artifacts, papers and bug
reports. The built front-end (``static/widget.js`` and ``widget.css``) is
inlined once, and renders the page from a read-only stand-in for the
anywidget model (``js/src/snapshot.js``): it serves the traits recorded here
and answers the requests recorded here (the equations of the calls, the
selected row's values, its graph and source lines, the code) with the replies the kernel
gave; any other request is answered with a sentence saying that the page is
a snapshot and that this needs the live kernel, and the controls that would
send one are disabled. The page shows only numbers the kernel computed.

What the front-end shows and Python does not hold (the open rows, the
selection, the tab) comes with the Save HTML button's request as a `View`;
`Explorer.save_html` from Python has the default view, selecting the row
whose values the pane shows.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import math
import os
import pathlib
import re
from typing import TYPE_CHECKING, Any

import yax
from yax.internal import CALL_KINDS, check_target, node_index, staged

from ._protocol import MAX_IDS, RequestError, answer

if TYPE_CHECKING:
    from ._session import Session

STATIC = pathlib.Path(__file__).parent / "static"
TABS = ("Compare", "Values", "Diff", "History", "Graph", "Code")  # the side panel's tabs (js/src/index.js)
#: Equation rows recorded beyond those of the open calls, so that opening a call in the page shows its
#: equations (GPT-2 small has about 1,300 in all, 100 KB); a larger model's other calls say they need the kernel.
EQUATION_BUDGET = 20_000


class SnapshotPathError(yax.YaxInputError):
    """`Explorer.save_html` was given a path it does not write a snapshot to: not
    a path, not ending in ``.html``, in a folder that does not exist, a name too
    long for its folder, a folder itself, a named pipe or device, or a file that
    exists (without ``overwrite=True``); or writing failed (a full disk). Nothing
    was written; choose another path."""


@dataclasses.dataclass(frozen=True)
class View:
    """What the front-end shows that Python does not hold, as the Save HTML button
    reports it: the calls open in the tree (None: the front-end's default, two
    levels), those whose equations it has listed, the selected row, the tab shown,
    the name filter, "only matches" and "fold repeats", the graph's depth and how far
    the tree is scrolled."""

    expanded: tuple[int, ...] | None = None
    equations: tuple[int, ...] = ()
    selected: int | None = None
    tab: str = "Compare"
    filter: str = ""
    only: bool = False
    fold: bool = True
    depth: int = 1
    scroll: int = 0

    @classmethod
    def parse(cls, value: Any) -> View:
        """The view a `snapshot` request describes (`RequestError` when it is malformed)."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise RequestError("`view` must be an object describing what the explorer shows.")
        names = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(value) - names)
        if extra:
            raise RequestError(f"A snapshot's `view` has no field `{str(extra[0])[:40]}`; its fields are "
                               f"{', '.join(f'`{n}`' for n in sorted(names))}.")
        v = cls(**{k: tuple(x) if k in ("expanded", "equations") and isinstance(x, list) else x
                   for k, x in value.items()})
        v.check()
        # an id named again is one open row: the page records each once
        return dataclasses.replace(v, expanded=None if v.expanded is None else tuple(dict.fromkeys(v.expanded)),
                                   equations=tuple(dict.fromkeys(v.equations)))

    def check(self) -> None:
        def integer(x: Any, lo: int, hi: int) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi

        for name, ids in (("expanded", self.expanded), ("equations", self.equations)):
            if ids is not None and (not isinstance(ids, tuple) or len(ids) > MAX_IDS
                                    or not all(integer(i, 0, 2**31) for i in ids)):
                raise RequestError(f"`{name}` must be a list of at most {MAX_IDS} row ids, not {str(ids)[:40]!r}.")
        if self.selected is not None and not integer(self.selected, 0, 2**31):
            raise RequestError(f"`selected` must be a row id or null, not {str(self.selected)[:40]!r}.")
        if self.tab not in TABS:
            raise RequestError(f"`tab` must be one of {', '.join(TABS)}; not {str(self.tab)[:40]!r}.")
        if not isinstance(self.filter, str) or len(self.filter) > 400:
            raise RequestError("`filter` must be the filter box's text, at most 400 characters.")
        for name in ("only", "fold"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"`{name}` must be true or false.")
        if not integer(self.depth, 0, 8):
            raise RequestError("`depth` must be an integer from 0 to 8.")
        if not integer(self.scroll, 0, 2**31):
            raise RequestError("`scroll` must be a number of pixels, at least 0.")


# -- what the page holds ---------------------------------------------------------------------

def model_name(s: Session) -> str:
    """The name of the model's outermost call (``Transformer``), as the tree's first row shows it."""
    node = next((n for n in node_index(s.mox).nodes if getattr(n, "kind", None) in CALL_KINDS), None)
    return str(node.name) if node is not None else "model"


def _reply(s: Session, request: dict) -> dict:
    """What the kernel answers to ``request`` now, without its ``rid``."""
    reply = answer(s, {**request, "rid": 0})
    reply.pop("rid", None)
    return reply


def _equations(s: Session, v: View) -> list[dict]:
    """The `expand` replies for the calls whose equations the tree lists (and those whose
    equations the query matched), then for the others, in document order, within `EQUATION_BUDGET`."""
    ids = node_index(s.mox).ids
    calls = [(ids[id(n)], n) for n in node_index(s.mox).nodes if getattr(n, "kind", None) in CALL_KINDS]
    open_ = set(v.equations) | {int(c) for c in s.state["match_owners"].values()}
    recorded, budget = [], EQUATION_BUDGET
    for rid, node in sorted(calls, key=lambda c: (c[0] not in open_, c[0])):
        n = sum(isinstance(e, yax.Equation) for e in node.children)
        if n == 0 or (rid not in open_ and n > budget):
            continue
        budget -= n
        request = {"type": "expand", "id": rid}
        recorded.append({"request": request, "reply": _reply(s, request)})
    return recorded


def _selected_values(s: Session, selected: int | None) -> tuple[dict, list[dict]]:
    """The values pane's state for the selected row and the `values` reply: the kernel's
    numbers (cached per model, batch and row, computed now if the pane did not show them),
    or the kernel's refusal (abstract parameters, no inputs, a call inside a loop)."""
    if selected is None:
        return {}, []
    request = {"type": "values", "id": selected}
    try:
        entry = s.inspector.row(s.node(selected))
    except yax.YaxError as e:
        return {}, [{"request": request, "reply": {"type": "error", "message": str(e)}}]
    return entry, [{"request": request, "reply": {"type": "ok", "id": entry["id"], "seconds": entry["seconds"]}}]


def snapshot_data(s: Session, v: View) -> dict:
    """Everything the page renders from: the traits, the recorded replies, the view and
    what the banner says."""
    s.check_open()
    for field in ("expanded", "equations"):
        for i in getattr(v, field) or ():
            s.node(i, CALL_KINDS, field=field)  # ids of the current model's calls, or refused
    if v.selected is not None:
        s.node(v.selected, field="selected")
    state = {"_" + k: value for k, value in s.state.items()}
    # the status line says what the page shows, not the kernel's last news (an export, a values request)
    steps = len(s.states) - 1
    state["_status"] = {"busy": False, "message": f"step {s.index} of {steps}: {s.states[s.index].description}"
                        if s.index else "the original model" + (f" (step 0 of {steps})" if steps else "")}
    values, replies = _selected_values(s, v.selected)
    state["_values"] = values
    replies += _equations(s, v)
    call = v.selected if v.selected is not None and not isinstance(s.node(v.selected), yax.Equation) else None
    requests: list[dict] = [{"type": "graph", "id": call, "depth": v.depth}, {"type": "code"}]
    if v.selected is not None:  # the Source and providers' tabs of the selected row (another row's needs the kernel)
        requests.append({"type": "source", "id": v.selected})
        requests += [{"type": "details", "provider": p, "id": v.selected} for p in s.state["panes"]]
    for request in requests:
        replies.append({"request": request, "reply": _reply(s, request)})
    now = datetime.datetime.now(datetime.UTC)
    meta = {"model": model_name(s), "version": yax.__version__, "saved": now.strftime("%Y-%m-%d %H:%M UTC"),
            "step": s.index, "steps": len(s.states) - 1}
    return {"state": state, "replies": replies, "view": dataclasses.asdict(v), "meta": meta}


def _bytes(x: Any) -> Any:
    """Binary buffers (the heatmaps) in JSON: ``{"$bytes": base64}``, a `DataView` again in the page."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(x)).decode("ascii")}
    raise TypeError(f"A snapshot cannot hold a `{type(x).__name__}`.")


def _finite(x: Any) -> Any:
    """``x`` with NaN and ±Inf as null, as the panes show a number that does not exist ("–")."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _script_json(value: Any) -> str:
    """``value`` as JSON that may stand inside a ``<script>`` element: no ``<``, so never ``</script>``."""
    try:
        text = json.dumps(value, default=_bytes, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # JSON has no NaN: the payloads send null for one, but never trust that here
        text = json.dumps(_finite(value), default=_bytes, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _bundle() -> tuple[str, str]:
    js, css = STATIC / "widget.js", STATIC / "widget.css"
    if not js.exists() or not css.exists():
        raise FileNotFoundError(f"The explorer's front-end bundle {js} is missing: run `npm --prefix js run build`.")
    return js.read_text(encoding="utf-8"), css.read_text(encoding="utf-8")


# The page: no request leaves it (the policy allows inline code, the bundle imported from a blob: URL, and
# WebAssembly for Graphviz). The bundle stands in the page once, as it is (`_bundle_text`), and is imported
# from a blob: URL; it renders the snapshot from the recorded data.
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' blob: \
'wasm-unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="yax {version}">
<title>{title}</title>
<style>html, body {{ margin: 0; height: 100%; }} #yax-snapshot {{ height: 100%; }}
#yax-snapshot .yax-explorer {{ height: 100vh; box-sizing: border-box; border-radius: 0; }}</style>
<style>{css}</style>
</head>
<body>
<noscript>This page is a snapshot of the yax explorer saved by save_html; it needs JavaScript to show.</noscript>
<div id="yax-snapshot"></div>
<script type="application/json" id="yax-snapshot-data">{data}</script>
<script type="text/plain" id="yax-snapshot-bundle" data-encoding="{encoding}">{js}</script>
<script type="module">
const bundle = document.getElementById("yax-snapshot-bundle");
const code = bundle.dataset.encoding === "base64"
  ? Uint8Array.from(atob(bundle.textContent), (c) => c.charCodeAt(0)) : bundle.textContent;
const url = URL.createObjectURL(new Blob([code], {{ type: "text/javascript" }}));
const {{ renderSnapshot }} = await import(url);
URL.revokeObjectURL(url);
const data = JSON.parse(document.getElementById("yax-snapshot-data").textContent);
renderSnapshot({{ el: document.getElementById("yax-snapshot"), data }});
</script>
</body>
</html>
"""


def page(s: Session, v: View) -> str:
    """The snapshot page of the explorer ``s`` as it is, with the front-end's view ``v``."""
    data = snapshot_data(s, v)
    js, css = _bundle()
    meta = data["meta"]
    title = f"{meta['model']}: yax explorer snapshot, {meta['saved']}"
    encoding, js = _bundle_text(js)
    return PAGE.format(version=yax.__version__, title=_html_text(title), css=css.replace("</", "<\\/"),
                       data=_script_json(data), js=js, encoding=encoding)


def _bundle_text(js: str) -> tuple[str, str]:
    """The bundle as the text of a ``<script>`` element that does not run: as it is (Graphviz's
    WebAssembly stands in it as a template literal of raw bytes, which JSON would escape to twice
    the size), unless it holds what would end that element early (``</script``, or ``<script``
    after a ``<!--``) or what an HTML parser changes (NUL, carriage returns): then in base64."""
    low = js.lower()
    if "</script" in low or "<script" in low or "\0" in js or "\r" in js:
        return "base64", base64.b64encode(js.encode("utf-8")).decode("ascii")
    return "raw", js


def _html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- writing ---------------------------------------------------------------------------------

def _checked(path: Any, overwrite: bool) -> pathlib.Path:
    if not isinstance(path, (str, os.PathLike)):
        raise SnapshotPathError(f"`save_html` takes the path of the `.html` file to write, but got "
                                f"`{str(path)[:40]}` of type `{type(path).__name__}`. Try "
                                "`explorer.save_html(\"model_snapshot.html\")`.")
    p = pathlib.Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise SnapshotPathError(f"A snapshot is one HTML page, so its path must end in `.html`, but `{p}` "
                                f"{'ends in `' + p.suffix + '`' if p.suffix else 'has no suffix'}. "
                                f"Try `{p.with_suffix('.html') if p.name else 'snapshot.html'}`.")
    check_target(str(p), "the snapshot", SnapshotPathError, replace=overwrite, inside="snapshot.html")
    return p


def save_html(s: Session, path: Any, *, overwrite: bool = False, v: View | None = None) -> pathlib.Path:
    """Write the snapshot of ``s`` to ``path`` (`Explorer.save_html`); refuse a bad path
    (`SnapshotPathError`) before anything is computed. ``v``: the front-end's view; without
    one (from Python), the row whose values the pane shows is the one selected."""
    p = _checked(path, overwrite)
    if v is None:
        shown = s.state["values"].get("id")
        ok = isinstance(shown, int) and 0 <= shown < len(node_index(s.mox).nodes)
        v = View(selected=shown if ok else None)
    text = page(s, v)
    # written beside `p` and renamed when whole: a full disk leaves no truncated page that blocks the retry
    with staged("the snapshot", SnapshotPathError, replace=overwrite) as stage:
        with open(stage(str(p)), "w", encoding="utf-8") as fh:
            fh.write(text)
    return p


def save_next(s: Session, view_: Any) -> dict:
    """The Save HTML button: ``{model}_snapshot.html`` in the working directory (next to the
    notebook), ``_2``, ``_3``… added when a file of that name exists (none is replaced). Says
    where in the status line; returns the file and its size."""
    v = View.parse(view_)
    stem = re.sub(r"[^\w.-]+", "_", model_name(s)).strip("._")[:80] or "model"
    name, k = f"{stem}_snapshot.html", 2
    while pathlib.Path(name).exists():
        name, k = f"{stem}_snapshot_{k}.html", k + 1
    p = save_html(s, name, v=v)
    size = p.stat().st_size
    s.status(f"saved {name} ({size / 2**20:.1f} MiB)")  # the toolbar's status line is short: no more
    return {"file": name, "bytes": size}
