"""The explorer: an anywidget over a MoX that queries, rewrites and compares.

The protocol with the front-end (traits and request/reply messages) is
described in ``docs/widget.md``. Every request is validated here; the
front-end can only name nodes of the current MoX and replacements that
Python registered.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anywidget
import jax
import numpy as np
import traitlets

import yax
from yax._compare import Measured, _keys, compare_measured, measure, paired_outputs
from yax._diff import keyed
from yax._ir import CALL_KINDS, Equation, Mox
from yax._print import key_attrs, shown_params, type_str, value_str
from yax._sub import misfit
from yax._xpath import view

from ._code import replacement_code, xpath_for

STATIC = pathlib.Path(__file__).parent / "static"
HEAT_MAX = 128
HIST_BINS = 40
MAX_QUERY = 4000

if not (STATIC / "widget.js").exists():
    raise ImportError(
        f"The explorer's front-end bundle {STATIC / 'widget.js'} is missing: this is a source checkout "
        "whose JavaScript was not built. Run `bash scripts/setup.sh`, or `npm --prefix js ci && npm "
        "--prefix js run build`."
    )


@dataclasses.dataclass(frozen=True)
class Change:
    """One step of the history: what was done, the code doing it, and the
    model after it."""

    description: str
    code: str
    mox: Mox
    params: Any


@dataclasses.dataclass(frozen=True)
class _Item:
    name: str
    repl: Any
    code: str | None  #: a Python expression for it; None: the script must define it
    kind: str
    doc: str

    @property
    def expr(self) -> str:
        return self.code or "_".join(re.findall(r"\w+", self.name)).lower() or "replacement"


def _default_palette() -> list[tuple[str, Any]]:
    import jax.numpy as jnp

    return [
        ("GELU", jax.nn.gelu), ("ReLU", jax.nn.relu), ("SiLU", jax.nn.silu), ("tanh", jnp.tanh),
        ("sigmoid", jax.nn.sigmoid), ("identity", jax.nn.identity),
    ]


class RequestError(Exception):
    """A malformed or refused request from the front-end: replied to, nothing changes."""


class Explorer(anywidget.AnyWidget):
    """Explore a model's module tree, query it, swap layers and compare.

    Args:
      target: a root `yax.Mox`, a Flax linen module (traced as
        ``model.apply(*args, **kwargs)``), a flax.nnx module (traced as
        ``model(*args, **kwargs)``; its state becomes the parameters), or
        any JAX function.
      *args, **kwargs: the example inputs: traced with ``target`` and used
        to compare the original and modified model. When the first
        positional argument is a mapping (linen variables), it is the
        parameters `yax.sub` reconciles.
      key: PRNG key for the parameters of inserted modules (default
        ``jax.random.key(0)``, folded with each step).
      warm: compile and run the original model on the example inputs in
        a background thread right away, keeping its outputs and module
        boundary values (host memory: the size of all its call outputs,
        as float32) so that each substitution compiles and runs only the
        modified model (default: when running in a Jupyter kernel, where
        the widget is shown; otherwise the first comparison does it).

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from yax_widget import Explorer
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
      >>> [n.name for n in ex.query('//activation')]
      ['relu']
      >>> print(ex.substitute('//activation', "GELU"))
      replaced 1 node(s) selected by //activation with GELU
      >>> [n.name for n in ex.mox.modules()], ex.comparison.first_divergence
      (['Sequential', 'layers_0', 'gelu', 'layers_2'], 'Sequential/relu')
    """

    _esm = STATIC / "widget.js"
    _css = STATIC / "widget.css"

    _tree = traitlets.Dict().tag(sync=True)            #: rows of the current MoX
    _original_tree = traitlets.Dict().tag(sync=True)   #: rows of the original MoX
    _query = traitlets.Unicode("").tag(sync=True)      #: the current query text
    _query_error = traitlets.Unicode("").tag(sync=True)  #: the last query's error, or ""
    _matches = traitlets.List().tag(sync=True)         #: ids the last good query selected
    _match_owners = traitlets.Dict().tag(sync=True)    #: matched equation id -> the call row it runs in
    _palette = traitlets.List().tag(sync=True)         #: registered replacements
    _history = traitlets.Dict().tag(sync=True)         #: change descriptions and the current index
    _diff = traitlets.Dict().tag(sync=True)            #: diff marks by row id, original and current
    _comparison = traitlets.Dict().tag(sync=True)      #: the last comparison, with binary heatmaps
    _status = traitlets.Dict({"busy": False, "message": ""}).tag(sync=True)  #: busy flag and message
    _notice = traitlets.Dict().tag(sync=True)          #: a refused replacement's reason, at its row

    def __init__(self, target: Any, *args: Any, key: Any = None, warm: bool | None = None, **kwargs: Any):
        super().__init__()
        if isinstance(target, Mox):
            if target.kind != "root":
                raise yax.YaxInputError(
                    f"`Explorer` expected a root MoX from `yax.make_mox`, but got a `{target.kind}` node. "
                    "Try `Explorer(model, variables, batch)`."
                )
            mox = target
        else:
            mox = yax.make_mox(target)(*args, **kwargs)
            if _is_nnx(target):  # the MoX runs (state, *args) -> (out, new_state): docs/nnx.md
                from flax import nnx

                args = (nnx.state(target), *args)
        self._args, self._kwargs = args, kwargs
        self._has_params = bool(args) and (isinstance(args[0], Mapping) or mox.graphdef is not None)
        self._key = jax.random.key(0) if key is None else key
        self._states: list[Change] = [Change("original", "", mox, args[0] if self._has_params else None)]
        self._index = 0
        self._items: dict[str, _Item] = {}
        self._selection: list[Any] = []
        self._fit_cache: dict = {}
        self.comparison: yax.Comparison | None = None
        self._reference: Measured | None = None  # the original's values on the example inputs
        # One worker runs the models (in order: the original's measurement, then each change's).
        # XLA compiles without holding the GIL, so the tree is rebuilt meanwhile on this thread.
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="yax-explorer")
        self._warmer: Future | None = None
        for name, repl in _default_palette():
            self.add_replacement(name, repl)
        self._original_tree = _tree(mox, 0)
        self._refresh()
        self.on_msg(self._on_msg)
        if warm is None:
            warm = _in_kernel()
        if warm and (args or kwargs):
            # Measure the original (compile, run, fetch its outputs and module boundaries) while
            # the user looks at the tree: each substitution then runs only the modified model.
            # The worker is no daemon: a script that exits meanwhile waits for XLA rather than
            # aborting in it.
            self._warmer = self._worker.submit(self._warm)

    def _warm(self) -> None:
        try:
            self._original_values()
        except Exception:  # the first real compare reports any problem, with context
            pass

    def _original_values(self) -> Measured:
        """The original's outputs and boundary values on the example inputs,
        measured once: they never change while the explorer lives."""
        if self._reference is None:
            idx, _ = paired_outputs(self.original, self.original)
            self._reference = measure(self.original, self._args, self._kwargs, idx)
        return self._reference

    # -- the Python API ----------------------------------------------------------

    @property
    def mox(self) -> Mox:
        """The current MoX."""
        return self._states[self._index].mox

    @property
    def params(self) -> Any:
        """The current parameters (first positional argument), or ``None``."""
        return self._states[self._index].params

    @property
    def original(self) -> Mox:
        """The MoX the explorer was opened with."""
        return self._states[0].mox

    @property
    def history(self) -> list[Change]:
        """The applied changes, oldest first (undone ones are not listed)."""
        return self._states[1:self._index + 1]

    @property
    def selection(self) -> list[Any]:
        """The nodes the current query selects."""
        return list(self._selection)

    def add_replacement(self, name: str, repl: Any, *, code: str | None = None, doc: str | None = None) -> None:
        """Offer ``repl`` (anything `yax.sub` accepts) in the palette as ``name``.
        ``code`` is the Python expression "copy as code" writes for it."""
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise yax.YaxInputError(f"A replacement name must be a non-empty string of at most 80 characters, "
                                    f"not {name!r}.")
        kind = ("mox" if isinstance(repl, Mox) else "equation" if isinstance(repl, Equation)
                else "module" if _is_module(repl) else "decider" if _is_decider(repl) else "function")
        if kind == "function" and not callable(repl):
            raise yax.YaxInputError(
                f"`{name}` must be a function, a Flax module, a MoX or an Equation (anything `yax.sub` "
                f"accepts), but it is a `{type(repl).__name__}`."
            )
        text = doc if doc is not None else (getattr(repl, "__doc__", None) or "").strip().split("\n")[0]
        if code is None:
            code = replacement_code(repl)
        self._items[name] = _Item(name, repl, code, kind, text[:200])
        self._fit_cache.clear()
        self._palette = [{"name": i.name, "kind": i.kind, "doc": i.doc} for i in self._items.values()]

    def query(self, xpath: str) -> list[Any]:
        """Run ``xpath`` on the current MoX, highlight the matches in the UI
        and return them (`yax.query` semantics; non-node results are
        returned as they are and highlight nothing)."""
        self._query = xpath
        return self._run_query(xpath)

    def substitute(self, target: Any, name: str) -> str:
        """Replace ``target`` (a node of the current MoX, an XPath, or
        ``"query"`` for the current query's matches) with the replacement
        registered as ``name``; compare with the original. Returns the
        change's description. Raises `yax.YaxRewriteError` and changes
        nothing when it does not fit."""
        item = self._items.get(name) if isinstance(name, str) else None
        if item is None:
            raise yax.YaxInputError(f"No replacement is registered as {name!r}; registered: "
                                    f"{', '.join(self._items)}. Try `explorer.add_replacement(name, fn)`.")
        if isinstance(target, str):
            pattern = self._query if target == "query" else target
            if not pattern:
                raise yax.YaxInputError("There is no query to replace the matches of; type one first.")
            what = f"{len(yax.query(pattern, self.mox))} node(s) selected by {pattern}"
        else:
            pattern = xpath_for(target, self.mox)
            what = f"{target.path or target.name}"
        step = len(self.history) + 1
        if self.params is not None and item.kind in ("function", "equation"):  # creates no variables
            new, new_params = yax.sub(pattern, item.repl, self.mox, params=self.params)
            code = f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params)"
        elif self.params is not None:
            key = jax.random.fold_in(self._key, step)  # not made for the others: its first use compiles
            new, new_params = yax.sub(pattern, item.repl, self.mox, params=self.params, key=key)
            code = (f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params, "
                    f"key=jax.random.fold_in(KEY, {step}))")
        else:
            new, new_params = yax.sub(pattern, item.repl, self.mox), None
            code = f"mox = yax.sub({pattern!r}, {item.expr}, mox)"
        desc = f"replaced {what} with {name}"
        if item.code is None:
            code = f"# `{item.expr}`: the replacement registered as {name!r}; define it first\n{code}"
        self._states[self._index + 1:] = [Change(desc, code, new, new_params)]
        self._index += 1
        self._notice = {}
        self._refresh()
        return desc

    def undo(self) -> None:
        """Go back one change (nothing happens at the original)."""
        if self._index > 0:
            self._index -= 1
            self._refresh()

    def redo(self) -> None:
        """Re-apply the change last undone (nothing happens at the newest)."""
        if self._index + 1 < len(self._states):
            self._index += 1
            self._refresh()

    def code(self) -> str:
        """The `yax.sub` calls that turn the original into the current model,
        as a script fragment (``mox`` and ``params`` are the original's)."""
        lines = [c.code for c in self.history]
        if not lines:
            return "# no changes: the model is the original"
        head = ["import jax", "import yax", ""]
        if any("KEY" in line for line in lines):
            head.insert(2, f"KEY = {_key_code(self._key)}")
        return "\n".join(head + lines)

    # -- state sent to the front-end ---------------------------------------------

    def _refresh(self) -> None:
        compared = self._start_compare()  # first: the tree below is rebuilt while XLA compiles
        mox = self.mox
        self._tree = {**self._original_tree, "version": self._index} if mox is self.original else _tree(mox, self._index)
        self._history = {"items": [c.description for c in self._states[1:]], "index": self._index}
        self._diff = {"original": {}, "current": {}} if mox is self.original else _diff_marks(self.original, mox)
        if self._query:
            try:
                self._run_query(self._query)
            except yax.YaxQueryError:
                self._matches, self._selection = [], []
        self._finish_compare(compared)

    def _run_query(self, xpath: str) -> list[Any]:
        try:
            res = yax.query(xpath, self.mox)
        except yax.YaxError as e:
            self._query_error = str(e)
            raise
        self._query_error = ""
        if isinstance(res, list):
            ids = _ids(self.mox)
            self._selection = [n for n in res if id(n) in ids]
            owners = _owners(self.mox)
            self._match_owners = {str(i): owners[i] for i in (ids[id(n)] for n in self._selection) if i in owners}
            self._matches = [ids[id(n)] for n in self._selection]
        else:
            self._selection, self._matches = [], []
        return res

    def _start_compare(self) -> tuple[Future, float] | None:
        """Start comparing the current model with the original on the worker."""
        if self._index == 0 or not (self._args or self._kwargs):
            return None
        self._status = {"busy": True, "message": "compiling and comparing…"}
        t = time.perf_counter()
        args = (self.params, *self._args[1:]) if self._has_params else self._args
        lowered = threading.Event()
        future = self._worker.submit(self._measure, self.mox, args, lowered)
        future.add_done_callback(lambda _: lowered.set())  # also when it fails
        if self._reference is not None:
            # Tracing and lowering hold the GIL like the tree rebuild does; XLA's compile, next, does
            # not: the tree is rebuilt during the compile. (Before the original is measured, the
            # tree goes first: that measurement takes longer than the tree.)
            lowered.wait()
        return future, t

    def _measure(self, mox: Mox, args: tuple, lowered: threading.Event) -> yax.Comparison:
        _, idx = paired_outputs(self.original, mox)
        ref = self._original_values()
        return compare_measured(self.original, mox, ref, measure(mox, args, self._kwargs, idx, lowered=lowered))

    def _finish_compare(self, compared: tuple[Future, float] | None) -> None:
        if compared is None:
            self.comparison = None
            self._comparison = {} if self._args or self._kwargs else {"message": "no example inputs to compare on"}
            return
        future, t = compared
        try:
            c = future.result()
        except Exception as e:  # the change stands; its comparison says why it could not be made
            self.comparison = None
            self._comparison = {"message": str(e) if isinstance(e, yax.YaxError) else
                                f"The comparison failed with {type(e).__name__}: {_gist(str(e))}"}
            self._status = {"busy": False, "message": "comparison failed"}
            return
        self.comparison = c
        seconds = time.perf_counter() - t
        self._comparison = _comparison_state(c, self.mox, seconds)
        self._status = {"busy": False, "message": f"compared in {seconds:.2f} s"}

    # -- requests from the front-end -----------------------------------------------

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        rid = content.get("rid") if isinstance(content, dict) else None
        if not isinstance(rid, int) or isinstance(rid, bool):
            rid = None
        try:
            if rid is None:
                raise RequestError("A request must be an object with an integer `rid`.")
            kind = content.get("type")
            handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise RequestError(f"Unknown request type {str(content.get('type'))[:40]!r}.")
            reply = handler(self, content)
        except (RequestError, yax.YaxError) as e:
            self.send({"type": "error", "rid": rid, "message": str(e)})
            return
        except Exception as e:  # a bug or a failure below yax (XLA): the front-end still gets its reply
            self._status = {"busy": False, "message": "failed"}
            self.send({"type": "error", "rid": rid, "message": f"The request failed with {type(e).__name__}: {e} "
                                                               "(the kernel's log has the traceback)."})
            raise
        self.send({"type": "ok", "rid": rid, **reply})

    def _node(self, content: dict, field: str = "id", kinds: tuple = (*CALL_KINDS, "equation")) -> Any:
        i = content.get(field)
        nodes = view(self.mox).nodes
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(nodes):
            raise RequestError(f"`{field}` must be the id of a node of the current model, not {str(i)[:40]!r}.")
        node = nodes[i]
        kind = "equation" if isinstance(node, Equation) else node.kind
        if kind not in kinds:
            raise RequestError(f"Node {i} is a `{kind}` node, which cannot be used here.")
        return node

    def _req_query(self, content: dict) -> dict:
        xpath = content.get("xpath")
        if not isinstance(xpath, str) or len(xpath) > MAX_QUERY:
            raise RequestError(f"`xpath` must be a string of at most {MAX_QUERY} characters.")
        self._query = xpath
        if not xpath.strip():
            self._query_error, self._matches, self._selection = "", [], []
            return {"count": 0}
        res = self._run_query(xpath)
        return {"count": len(self._matches) if isinstance(res, list) else _plain(res)}

    def _req_expand(self, content: dict) -> dict:
        node = self._node(content, kinds=CALL_KINDS)
        ids = _ids(self.mox)
        return {"id": ids[id(node)], "rows": [
            [ids[id(e)], e.name, " ".join(map(type_str, e.inputs)), " ".join(map(type_str, e.outputs)),
             _short(" ".join(f"{k}={value_str(v)}" for k, v in shown_params(e)), 120)]
            for e in node.children if isinstance(e, Equation)
        ]}

    def _req_fits(self, content: dict) -> dict:
        node = self._node(content)
        fits, refused = [], {}
        for item in self._items.values():
            why = misfit(item.repl, node, self.mox, cache=self._fit_cache)
            if why is None:
                fits.append(item.name)
            else:
                refused[item.name] = why
        return {"id": content["id"], "fits": fits, "refused": refused}

    def _req_substitute(self, content: dict) -> dict:
        name = content.get("name")
        if not isinstance(name, str) or name not in self._items:
            raise RequestError(f"`name` must be a registered replacement ({', '.join(self._items)}), "
                               f"not {str(name)[:40]!r}.")
        target = content.get("target")
        node = "query" if target == "query" else self._node(content, "target")
        try:
            desc = self.substitute(node, name)
        except yax.YaxError as e:
            self._notice = {"id": target if isinstance(target, int) else None, "message": str(e),
                            "n": self._notice.get("n", 0) + 1}
            raise
        return {"description": desc}

    def _req_undo(self, content: dict) -> dict:
        self.undo()
        return {}

    def _req_redo(self, content: dict) -> dict:
        self.redo()
        return {}

    def _req_code(self, content: dict) -> dict:
        return {"code": self.code()}

    def _req_graph(self, content: dict) -> dict:
        depth = content.get("depth", 1)
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= 8:
            raise RequestError("`depth` must be an integer from 0 to 8.")
        root = None if content.get("id") is None else self._node(content, kinds=CALL_KINDS)
        return {"id": content.get("id"), "dot": yax.to_dot(self.mox, depth=depth, root=root)}


_HANDLERS: dict[str, Callable[[Explorer, dict], dict]] = {
    "query": Explorer._req_query, "expand": Explorer._req_expand, "fits": Explorer._req_fits,
    "substitute": Explorer._req_substitute, "undo": Explorer._req_undo, "redo": Explorer._req_redo,
    "code": Explorer._req_code, "graph": Explorer._req_graph,
}


# -- helpers ------------------------------------------------------------------------

def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _is_nnx(x: Any) -> bool:
    try:
        from flax import nnx
    except ImportError:
        return False
    return isinstance(x, nnx.Module)


def _is_module(x: Any) -> bool:
    from yax._sub import _is_module

    return _is_module(x)


def _is_decider(x: Any) -> bool:
    from yax._sub import _is_decider

    return _is_decider(x)


def _key_code(key: Any) -> str:
    try:
        data = jax.random.key_data(key)
        if data.shape == (2,) and int(data[0]) == 0:
            return f"jax.random.key({int(data[1])})"
    except Exception:
        pass
    return "...  # the key passed to Explorer(key=...)"


def _ids(mox: Mox) -> dict[int, int]:
    return view(mox).ids


def _gist(message: str) -> str:
    """The first and last lines of a long error (XLA's carry whole tracebacks)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return message if len(lines) < 3 else f"{_short(lines[0], 200)} … {_short(lines[-1], 200)}"


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _plain(v: Any) -> Any:
    return v if isinstance(v, (str, bool, int)) else float(v) if isinstance(v, float) and math.isfinite(v) else str(v)


def _attrs(attrs: Mapping[str, Any], n: int) -> str:
    return _short(" ".join(f"{k}={value_str(v)}" for k, v in attrs.items()
                           if v is not None and not k.startswith("_")), n)


def _tree(mox: Mox, version: int) -> dict:
    """The call rows of ``mox`` in document order (see docs/widget.md)."""
    ids = _ids(mox)
    rows: list[list] = []

    def walk(node: Mox, parent: int) -> None:
        for c in node.children:
            if isinstance(c, Equation):
                for _, sub in c.subs:
                    walk(sub, parent)
            elif c.kind in CALL_KINDS:
                i = ids[id(c)]
                # the row shows the fields that differ from their defaults; its tooltip, all of them
                rows.append([i, parent, c.kind, c.name, c.type, _attrs(key_attrs(c), 100),
                             " ".join(map(type_str, c.inputs)), " ".join(map(type_str, c.outputs)),
                             c.num_params, sum(isinstance(e, Equation) for e in c.children),
                             _attrs(c.attrs, 400)])
                walk(c, i)
            else:
                walk(c, parent)

    walk(mox, -1)
    return {"version": version, "rows": rows}


_owner_maps: weakref.WeakKeyDictionary[Mox, dict[int, int]] = weakref.WeakKeyDictionary()


def _owners(mox: Mox) -> dict[int, int]:
    """Equation id -> id of the call it runs in directly (what `expand` lists)."""
    m = _owner_maps.get(mox)
    if m is None:
        ids = _ids(mox)
        m = _owner_maps[mox] = {ids[id(e)]: ids[id(c)] for c in mox.modules() for e in c.children
                                if isinstance(e, Equation)}
    return m


def _diff_marks(a: Mox, b: Mox) -> dict:
    d = yax.diff(a, b)
    ka, kb = keyed(a), keyed(b)
    orig = {ka[k].get("id"): "removed" for k in d.removed}
    cur = {kb[k].get("id"): "added" for k in d.added}
    for k in d.changed:
        orig[ka[k].get("id")] = cur[kb[k].get("id")] = "changed"
    return {"original": orig, "current": cur}


def _heat(x: np.ndarray, y: np.ndarray, name: str) -> dict | None:
    if x.ndim == 0 or x.size == 0:
        return None
    lead = x.ndim - 2
    if lead > 0:
        x, y = x[(0,) * lead], y[(0,) * lead]
        name = f"{name}[{', '.join(['0'] * lead)}]"
    if x.ndim == 1:
        x, y = x[None], y[None]
    sr, sc = (max(1, math.ceil(n / HEAT_MAX)) for n in x.shape)
    x, y = x[::sr, ::sc], y[::sr, ::sc]

    def buf(a: np.ndarray) -> bytes:
        return np.ascontiguousarray(a, dtype="<f4").tobytes()

    return {"label": name, "rows": int(x.shape[0]), "cols": int(x.shape[1]),
            "original": buf(x), "modified": buf(y), "diff": buf(np.abs(y - x))}


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _comparison_state(c: yax.Comparison, mox: Mox, seconds: float) -> dict:
    ids = _ids(mox)
    keys = _keys(mox)
    outputs = []
    for name, s in c.outputs.items():
        x, y = c.arrays[name]
        d = (y - x).ravel()
        d = d[np.isfinite(d)]
        lo, hi = (float(d.min()), float(d.max())) if d.size else (0.0, 0.0)
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        counts, _ = np.histogram(d, bins=HIST_BINS, range=(lo, hi))
        outputs.append({
            "name": name, "shape": list(x.shape), **{k: _finite(v) if isinstance(v, float) else v
                                                     for k, v in s.to_dict().items()},
            "hist": {"counts": counts.tolist(), "lo": lo, "hi": hi},
            "heat": _heat(x, y, name),
        })
    bounds = {str(ids[id(keys[k])]): {"rel": _finite(s.rel), "max_abs": _finite(s.max_abs), "allclose": s.allclose}
              for k, s in c.boundaries.items() if k in keys}
    first = c.first_divergence
    return {
        "allclose": c.allclose, "first_divergence": first,
        "first_divergence_id": ids[id(keys[first])] if first in keys else None,
        "seconds": round(seconds, 3), "outputs": outputs, "boundaries": bounds,
    }
