"""What the explorer sends to the front-end: tree rows, equation rows, diff
marks, the comparison with its heatmap buffers, the values pane's entries. Pure
functions of a MoX (or a comparison, or a summary of values): they read the model
and never change the widget.

Every format here is documented in ``docs/widget.md`` ("Protocol between the
kernel and the front-end"). Rows are positional lists (a 70B model's tree has
thousands), laid out in one place, `CALL_COLUMNS` and `EQUATION_COLUMNS`, whose
names travel with them (``columns``): js/src/rows.js reads each column by its name.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import yax
from yax.internal import (
    CALL_KINDS,
    call_keys,
    call_specs,
    is_mixed,
    is_sharded,
    key_attrs,
    keyed,
    lines_around,
    node_ids,
    node_index,
    param_copies,
    precisions,
    shown_attrs,
    shown_params,
    spec_of,
    spec_text,
    structure_keys,
    to_host,
    type_str,
    value_str,
)

HEAT_MAX = 128  # a heatmap is at most HEAT_MAX x HEAT_MAX (subsampled beyond)
HIST_BINS = 40


def short(s: str, n: int) -> str:
    """``s`` cut to ``n`` characters, ending in an ellipsis when cut."""
    return s if len(s) <= n else s[: n - 1] + "…"


def gist(message: str) -> str:
    """The first and last lines of a long error (XLA's carry whole tracebacks)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return message if len(lines) < 3 else f"{short(lines[0], 200)} … {short(lines[-1], 200)}"


def _types(values: Any) -> str:
    return " ".join(map(type_str, values))


def _fields(attrs: Mapping[str, Any], n: int) -> str:
    return short(" ".join(f"{k}={value_str(v)}" for k, v in attrs.items()
                          if v is not None and not k.startswith("_")), n)


# -- the module tree ------------------------------------------------------------------

#: The columns of a call row, in their order on the wire: ``(name, what it holds)``. The one place
#: they are laid out: `call_row` builds its rows from it, the ``_tree`` trait names them
#: (``columns``), the front-end reads each by its name (js/src/rows.js), and docs/widget.md's table
#: is written from it (tests/widget/test_payloads.py checks that it is).
CALL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "the node's index in the XML view (`yax.query` results and `yax.to_dot` ids `yax-N` use the "
           "same numbering)"),
    ("parent", "the id of the nearest enclosing call row, `-1` at the top"),
    ("kind", "`module_call`, `method_call`, `activation` or `function`"),
    ("name", "the last path component; a helper `method_call` adds its method (`attn._split_heads`) and shows "
             "no fields or parameters: they are its module's, on the enclosing call's row"),
    ("type", "the class or function name"),
    ("attrs", "the fields that differ from their defaults, a short `k=v k=v` string (what the row shows)"),
    ("ins", "the input types (`f32[2,8,32]`), separated by spaces"),
    ("outs", "the output types, the same way"),
    ("params", "the parameter count (a helper's: 0, its module's row counts them)"),
    ("neq", "how many equations run directly in the call (listed when the row is expanded)"),
    ("fields", "every field, `k=v k=v` (the row's tooltip)"),
    ("copies", "the sets of those parameters a scanned stack holds (`param_copies`; shown `×N`)"),
    ("policy", "the dtypes of its parameters, computation and outputs (`f32/bf16/f32`, as "
               "`yax.mixed_precision` sets them); empty when every call of the tree has the same, so a plain "
               "float32 model shows none"),
    ("fold", "its structure key (`yax.internal.structure_keys`): an integer equal exactly for calls that "
             "compute the same thing up to their weights, whatever their names; the tree folds runs of them"),
    ("sharding", "how the parameters it reads are laid out over a mesh (`kernel=P(None,'model') bias=P()`, "
                 "the view's `@sharding`); empty unless one of them is split; the tooltip shows it as "
                 "`sharding: …`"),
    ("source", "the user's line calling it (`model.py:12`, `node.source`); empty where JAX recorded none; "
               "the tooltip shows it as `source: model.py:12`"),
)

#: The columns of an equation row (the ``expand`` and ``equations`` replies), as `CALL_COLUMNS`.
EQUATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "the equation's index in the XML view"),
    ("primitive", "the primitive's name (`dot_general`), the row's name"),
    ("ins", "the input types, separated by spaces"),
    ("outs", "the output types"),
    ("params", "its parameters, a short `k=v k=v` string (what the row and its tooltip show)"),
    ("source", "the user's line making it (`model.py:12`); empty where JAX recorded none"),
)

CALL_NAMES = tuple(name for name, _ in CALL_COLUMNS)
EQUATION_NAMES = tuple(name for name, _ in EQUATION_COLUMNS)


def _laid_out(names: tuple[str, ...], values: dict[str, Any]) -> list:
    """``values``, one per column, as the positional row ``names`` orders them."""
    assert len(values) == len(names), sorted(set(values) ^ set(names))  # no column left out, none unknown
    return [values[n] for n in names]


def call_row(node: yax.Mox, ids: Mapping[int, int], parent: int, copies: int = 1, policy: str = "",
             fold: int | None = None, sharding: str = "") -> list:
    """The tree row of a call node, its columns laid out as `CALL_COLUMNS` says.

    A helper method (``method_call``: ``_split_heads`` called inside its module's
    own call) is named by its method, and its module's fields and parameters,
    which the enclosing call's row shows, are not shown (nor counted) again.
    ``copies``: the sets of parameters a scanned stack holds (`param_copies`), shown ×N;
    ``policy``: its dtypes of parameters/computation/outputs (``f32/bf16/f32``), given
    where the tree's calls differ in them (`yax.mixed_precision`); ``fold``: its structure key
    (`yax.internal.structure_keys`), equal exactly for calls that compute the same thing up to their
    weights: the front-end folds runs of consecutive siblings with the same key into one ×N row;
    ``sharding``: how the parameters it reads are laid out over devices (`yax.internal.call_specs`,
    the view's ``@sharding``: ``kernel=P(None,'model')``), "" unless one of them is split."""
    helper = node.kind == "method_call" and bool(node.method)
    return _laid_out(CALL_NAMES, {
        "id": ids[id(node)],
        "parent": parent,
        "kind": node.kind,
        "name": f"{node.name}.{node.method}" if helper else node.name,
        "type": node.type,
        "attrs": "" if helper else _fields(key_attrs(node), 100),
        "ins": _types(node.inputs),
        "outs": _types(node.outputs),
        "params": 0 if helper else node.num_params,  # a helper's are its module's
        "neq": sum(isinstance(e, yax.Equation) for e in node.children),
        "fields": _fields(shown_attrs(node), 400),
        "copies": 1 if helper else copies,
        "policy": policy,
        "fold": fold,
        "sharding": sharding,
        "source": _where(node),
    })


def inputs(names: list[str], args: tuple, kwargs: Mapping[str, Any]) -> list[dict]:
    """The model's inputs as the user passed them (the batch in use, without the parameters):
    ``[{"name", "type", "sharding"}]``, ``sharding`` the ``PartitionSpec`` an input is split by
    over devices (``P('data')``), "" where it is not split. ``names``: the positional ones'."""
    def entry(name: str, x: Any) -> dict:
        leaves = jax.tree_util.tree_leaves(x)
        typed = all(hasattr(v, "shape") and hasattr(v, "dtype") for v in leaves) and leaves
        specs = [spec_of(v) for v in leaves] if typed else []
        split = [spec_text(sp) for sp in specs if sp is not None and is_sharded(sp)]
        return {"name": name, "type": short(_types(leaves) if typed else value_str(x), 120),
                "sharding": " ".join(dict.fromkeys(split))}
    return [*(entry(names[i] if i < len(names) else f"arg{i}", x) for i, x in enumerate(args)),
            *(entry(k, x) for k, x in kwargs.items())]


def tree(mox: yax.Mox, version: int) -> dict:
    """The ``_tree`` trait: the call rows of ``mox`` in document order, and their ``columns``."""
    ids = node_ids(mox)
    pols = precisions(mox)
    mixed = is_mixed(mox)
    keys = structure_keys(mox)
    laid_out = call_specs(mox)
    idx = node_index(mox)
    rows: list[list] = []
    for i, node in enumerate(idx.nodes):  # document order; calls inside a loop or branch body belong to
        if i and isinstance(node, yax.Mox) and node.kind in CALL_KINDS:  # the enclosing call
            rows.append(call_row(node, ids, idx.callers[i], param_copies(mox, node),
                                 pols[id(node)].short() if mixed else "", keys[id(node)],
                                 laid_out.get(id(node), "")))
    return {"version": version, "columns": list(CALL_NAMES), "rows": rows}


def equation_rows(call: yax.Mox, ids: Mapping[int, int]) -> list[list]:
    """The equations that run directly in ``call`` (the ``expand`` reply), laid out as
    `EQUATION_COLUMNS` says."""
    return [_laid_out(EQUATION_NAMES, {
        "id": ids[id(e)],
        "primitive": e.name,
        "ins": _types(e.inputs),
        "outs": _types(e.outputs),
        "params": short(" ".join(f"{k}={value_str(v)}" for k, v in shown_params(e)), 120),
        "source": _where(e),
    }) for e in call.children if isinstance(e, yax.Equation)]


def _where(node: yax.Mox | yax.Equation) -> str:
    loc = node.source
    return "" if loc is None else str(loc)


#: Lines shown before and after a node's own line in the Source tab.
SOURCE_RADIUS = 8


def source(node: yax.Mox | yax.Equation, node_id: int) -> dict:
    """The ``source`` reply: the lines of the user's code around the line that
    made ``node`` (`SOURCE_RADIUS` either side), read now from the file or from
    Python's line cache (which holds IPython's cells); where there are none,
    ``lines`` is empty and ``note`` says why in a sentence."""
    loc = node.source
    if loc is None:
        return {"id": node_id, "file": "", "path": "", "line": 0, "lines": [], "note": (
            "JAX recorded no line of your code for this node (the model's outermost call, which yax itself "
            "makes, or an equation JAX made inside its own or a library's code).")}
    lines = lines_around(loc, SOURCE_RADIUS)
    reply = {"id": node_id, "file": loc.file, "path": loc.path, "line": loc.line,
             "lines": [[n, text] for n, text in lines or ()], "note": ""}
    if not lines:
        reply["note"] = (f"{loc} is where this node comes from, but the kernel cannot read that file now (code run "
                         f"from a string, or a file moved or deleted since), so its lines cannot be shown.")
    return reply


def owners(mox: yax.Mox, numbers: list[int]) -> dict[str, int]:
    """Of the equations among ``numbers``, each one's number -> the number of the call it runs in
    directly (what `expand` lists), read off the MoX's node index."""
    idx = node_index(mox)
    out = {}
    for i in numbers:
        p = idx.parents[i]
        if isinstance(idx.nodes[i], yax.Equation) and p >= 0:
            call = idx.nodes[p]
            if isinstance(call, yax.Mox) and call.kind in CALL_KINDS:
                out[str(i)] = p
    return out


def _places(calls: Mapping[tuple, Any]) -> dict[tuple, tuple]:
    """Each call's place: (the key of the call it sits in directly, or None at the top, and its
    position among that call's calls), for ``calls`` as `keyed` gives them."""
    key_of = {id(el): k for k, el in calls.items()}
    seen: collections.Counter = collections.Counter()
    out = {}
    for k, el in calls.items():  # document order
        outer = next((key_of[id(up)] for up in el.iterancestors() if id(up) in key_of), None)
        out[k] = (outer, seen[outer])
        seen[outer] += 1
    return out


def diff_marks(a: yax.Mox, b: yax.Mox) -> dict:
    """The ``_diff`` trait: `yax.diff`'s verdicts as marks by row id of each tree. A call removed
    and one added in its place (inside the same call, at the same position among its calls: ReLU
    put where GELU was) is a replacement: marked changed on both sides, as the docs say."""
    d = yax.diff(a, b)
    ka, kb = keyed(a), keyed(b)
    orig = {ka[k].get("id"): "removed" for k in d.removed}
    cur = {kb[k].get("id"): "added" for k in d.added}
    changed = [(ka[k], kb[k]) for k in d.changed]
    if d.removed and d.added:
        pa, pb = _places(ka), _places(kb)
        gone = {pa[k]: k for k in d.removed}
        changed += [(ka[gone[pb[k]]], kb[k]) for k in d.added if pb[k] in gone]
    for x, y in changed:
        orig[x.get("id")] = cur[y.get("id")] = "changed"
    return {"original": orig, "current": cur}


# -- a query's result -----------------------------------------------------------------

MAX_VALUES = 20  # values of a non-node result listed under the query box


def _plain(v: Any) -> Any:
    """A non-node result (a number, string or boolean) as JSON."""
    if isinstance(v, (str, bool, int)):
        return v
    return float(v) if isinstance(v, float) and math.isfinite(v) else str(v)


def query_result(xpath: str, res: Any, matched: int, mox: yax.Mox) -> dict:
    """The ``_query_result`` trait: what the query box says about ``res``,
    `yax.query`'s result, of which ``matched`` nodes are highlighted.

    ``{"kind": "nodes", "count", "explain"?}`` for node-sets (``explain``: where
    an empty one stops matching, `yax.explain`'s text); ``{"kind": "values",
    "count", "values"}`` for lists of strings (``//*/@path``), the first
    `MAX_VALUES`; ``{"kind": "value", "value"}`` for a number, string or boolean
    (``count(...)``); ``{}`` for an empty query."""
    if not xpath.strip():
        return {}
    if not isinstance(res, list):
        return {"kind": "value", "value": _plain(res)}
    if matched or not res:
        out: dict = {"kind": "nodes", "count": matched}
        if not res:
            try:
                out["explain"] = yax.explain(xpath, mox)
            except Exception:  # an explanation is a hint: the empty result stands without it
                pass
        return out
    return {"kind": "values", "count": len(res), "values": [short(str(_plain(v)), 200) for v in res[:MAX_VALUES]]}


# -- the comparison -------------------------------------------------------------------

def heat_slice(x: Any, name: str) -> tuple[Any, dict]:
    """The part of an array a heatmap shows: its first 2-D slice, every n-th row
    and column so that it is at most `HEAT_MAX` square; and what was cut, as the
    captions say it (``label``: the slice, ``step``: the subsampling, ``whole``).
    Plain indexing, so it works on numpy arrays and inside ``jax.jit`` alike."""
    lead = x.ndim - 2
    if lead > 0:
        x = x[(0,) * lead]
        name = f"{name}[{', '.join(['0'] * lead)}]"
    if x.ndim == 1:
        x = x[None]
    sr, sc = (max(1, math.ceil(n / HEAT_MAX)) for n in x.shape)
    return x[::sr, ::sc], {"label": name, "rows": math.ceil(x.shape[0] / sr), "cols": math.ceil(x.shape[1] / sc),
                           "step": [sr, sc], "whole": lead <= 0 and sr == sc == 1}


def floats(a: Any) -> bytes:
    """An array as a little-endian float32 buffer (how heatmaps travel)."""
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def _heat(x: np.ndarray, y: np.ndarray, name: str) -> dict | None:
    """Heatmaps of the first 2-D slice of an output (`heat_slice`), as float32
    buffers of the original, the modified and their difference."""
    if x.ndim == 0 or x.size == 0:
        return None
    (xs, info), (ys, _) = heat_slice(x, name), heat_slice(y, name)
    return {**info, "original": floats(xs), "modified": floats(ys), "diff": floats(np.abs(ys - xs))}


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _output(name: str, stats: yax.Stats, x: np.ndarray, y: np.ndarray) -> dict:
    """One output's entry: its statistics, the histogram of its differences, its heatmaps.

    The histogram's ``lo``/``hi`` are the real smallest and largest difference: when
    they are equal (an unchanged output) the front-end says so rather than drawing a
    range; ``n`` is how many finite differences were counted, ``nonfinite`` how many
    were NaN or infinite. A sharded model's outputs (device arrays) are reduced where
    they are (`_on_devices`): only the histogram and the heatmap slices cross."""
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        return _on_devices(name, stats, x, y)
    d = (y - x).ravel()
    finite = np.isfinite(d)
    d = d[finite]
    lo, hi = (float(d.min()), float(d.max())) if d.size else (0.0, 0.0)
    counts, _ = np.histogram(d, bins=HIST_BINS, range=(lo, hi))  # numpy widens an empty range itself
    return {
        "name": name, "shape": list(x.shape),
        **{k: _finite(v) if isinstance(v, float) else v for k, v in stats.to_dict().items()},
        "hist": {"counts": counts.tolist(), "lo": lo, "hi": hi, "n": int(d.size),
                 "nonfinite": int(finite.size - d.size)},
        "heat": _heat(x, y, name),
    }


def _diff_summary(x: Any, y: Any) -> tuple:
    """On the devices: ``(lo, hi, counts, n)`` of the finite differences ``y - x`` as
    `_output` histograms them (NumPy's bins; an empty range widened by 0.5 as NumPy
    widens it), and the heatmap slices of both (`heat_slice`)."""
    d = (y - x).astype(jnp.float32)
    fin = jnp.isfinite(d)
    n = fin.sum(dtype=jnp.int32)
    lo = jnp.where(n > 0, jnp.min(jnp.where(fin, d, jnp.inf), initial=jnp.inf), 0.0)
    hi = jnp.where(n > 0, jnp.max(jnp.where(fin, d, -jnp.inf), initial=-jnp.inf), 0.0)
    a, b = jnp.where(lo == hi, lo - 0.5, lo), jnp.where(lo == hi, hi + 0.5, hi)
    at = jnp.clip(jnp.floor((d - a) / (b - a) * HIST_BINS), 0, HIST_BINS - 1).astype(jnp.int32)
    counts = jnp.bincount(jnp.where(fin, at, 0).ravel(), weights=fin.ravel().astype(jnp.int32), length=HIST_BINS)
    heat = (heat_slice(x, "")[0], heat_slice(y, "")[0]) if x.ndim and x.size else ()
    return lo, hi, counts, n, heat


_diff_summary_jit = jax.jit(_diff_summary)


def _on_devices(name: str, stats: yax.Stats, x: Any, y: Any) -> dict:
    """`_output` of a sharded model's outputs, left on their devices: `_diff_summary` there."""
    lo, hi, counts, n, heat = to_host(_diff_summary_jit(jnp.asarray(x), jnp.asarray(y)))
    shown = None
    if heat:
        _, info = heat_slice(np.broadcast_to(np.zeros((), np.int8), x.shape), name)  # what was cut, from the shape
        xs, ys = (np.asarray(h, np.float32) for h in heat)
        shown = {**info, "original": floats(xs), "modified": floats(ys), "diff": floats(np.abs(ys - xs))}
    return {
        "name": name, "shape": list(x.shape),
        **{k: _finite(v) if isinstance(v, float) else v for k, v in stats.to_dict().items()},
        "hist": {"counts": np.asarray(counts).tolist(), "lo": float(lo), "hi": float(hi), "n": int(n),
                 "nonfinite": int(np.prod(x.shape)) - int(n)},
        "heat": shown,
    }


def _bound(s: yax.Stats, steps: list | None, stack: tuple | None) -> dict:
    """A boundary's entry: its statistics over every value (every step inside a scan), what
    could not be computed and why, and for a call in a scan its steps (``×N``, the first that
    differs, each step's relative error)."""
    out = {"rel": _finite(s.rel), "max_abs": _finite(s.max_abs), "allclose": s.allclose,
           "undefined": dict(s.undefined), "nonfinite": s.nonfinite, "changed": s.changed}
    if steps is not None and stack:
        out["steps"] = [int(n) for n in stack]
        out["step_rel"] = [_finite(t.rel) for t in steps]
        out["first_step"] = next((i for i, t in enumerate(steps) if not t.allclose), None)
    return out


def comparison_state(c: yax.Comparison, mox: yax.Mox, seconds: float) -> dict:
    """The ``_comparison`` trait of ``c``, whose modified model is ``mox``."""
    ids = node_ids(mox)
    keys = call_keys(mox)
    outputs = [_output(name, s, *c.arrays[name]) for name, s in c.outputs.items()]
    bounds = {str(ids[id(keys[k])]): _bound(s, c.steps.get(k), c.stacks.get(k))
              for k, s in c.boundaries.items() if k in keys}
    first = c.first_divergence
    step = c.first_divergence_step
    return {
        "allclose": c.allclose,
        # named as the modified model (the tree) names it, with the scan step
        "first_divergence": None if first is None else c.label(first) + (
            f" at scan step {', '.join(map(str, step))}" if step else ""),
        "first_divergence_id": ids[id(keys[first])] if first in keys else None,
        "seconds": round(seconds, 3), "outputs": outputs, "boundaries": bounds, "rtol": c.rtol, "atol": c.atol,
        "unavailable": [{"id": ids[id(keys[k])] if k in keys else None, "key": k, "why": why}
                        for k, why in c.unavailable.items()],
        # the parameters' gradients (`grad_of`), the most changed first
        "gradients": None if c.gradients is None else _most_changed(c.gradients),
    }


def _most_changed(stats: dict[str, yax.Stats]) -> list[dict]:
    """Per-parameter statistics (gradients, weights against a reference) as the pane lists them:
    the most changed first (an undefined ``rel`` first of all)."""
    return [{"name": k, **{f: _finite(getattr(s, f)) for f in ("rel", "max_abs", "cosine")},
             "allclose": s.allclose, "undefined": dict(s.undefined), "nonfinite": s.nonfinite}
            for k, s in sorted(stats.items(), key=lambda kv: -(kv[1].rel if kv[1].rel == kv[1].rel else 1e300))]


def columns_state(cs: yax.Comparisons, mox: yax.Mox) -> dict:
    """What a comparison with a reference adds to the ``_comparison`` trait: one column per model
    compared with it (the original, history states, the last the current one), by the call ids
    its tree (``mox``) shows, and how the reference's modules and weights were matched."""
    ids = node_ids(mox)
    keys = call_keys(mox)
    ref_name = cs.names[0]
    columns = [{"name": n, "current": n == cs.names[-1], "allclose": c.allclose,
                "first_divergence": None if c.first_divergence is None else c.label(c.first_divergence),
                "first_divergence_id": ids[id(keys[c.first_divergence])] if c.first_divergence in keys else None,
                "rel": {str(ids[id(keys[k])]): _finite(s.rel) for k, s in c.boundaries.items() if k in keys}}
               for n, c in cs.against_first.items()]
    c = cs.against_first[cs.names[-1]]
    m = c.matching
    assert m is not None  # a comparison with a reference says how it matched
    return {
        "reference": ref_name, "columns": columns,
        "matching": {"source": m.source, "calls": len(m.calls), "only_model": len(m.only_model),
                     "only_reference": list(m.only_reference), "layouts": [f"{k}: {v}" for k, v in m.layouts.items()],
                     "weights": len(m.weights), "only_model_weights": list(m.only_model_weights),
                     "atol_scaled": m.atol_scaled},
        "weights": None if c.weights is None else _most_changed(c.weights),
    }


def comparison_failure(e: Exception) -> dict:
    """The ``_comparison`` trait when the comparison could not be made."""
    return {"message": str(e) if isinstance(e, yax.YaxError) else
            f"The comparison failed with {type(e).__name__}: {gist(str(e))}"}


# -- the values pane ----------------------------------------------------------------------

def number(v: Any) -> float | None:
    """``v`` as a float, None where it is NaN or infinite (JSON has neither)."""
    v = float(v)
    return v if math.isfinite(v) else None


def value_entry(name: str, type_: str, shape: tuple, steps: tuple, counts: Any, stats: Any, hist: Any,
                heat: Any, k: Any) -> dict:
    """The values pane's entry for one output from its summary (`_reduce._reduced`)."""
    n, nan, posinf, neginf, zeros = (int(c) for c in counts)
    lo, hi, mean, std, norm = (number(s) if n else None for s in stats)
    size = int(np.prod(shape))
    entry = {
        "name": name, "type": type_, "shape": list(shape), "steps": list(steps), "size": size,
        "min": lo, "max": hi, "mean": mean, "std": std, "norm": norm,
        "finite": n, "nan": nan, "posinf": posinf, "neginf": neginf, "zeros": zeros,
        # the real range of the finite values: equal ends (one value everywhere) are said, not widened
        "hist": {"counts": np.asarray(hist).tolist(), "lo": lo, "hi": hi, "n": n, "nonfinite": nan + posinf + neginf},
        "heat": None,
    }
    if len(shape) and size:
        # what was cut is read off the shape: a zero-strided stand-in, no copy
        at = np.unravel_index(int(k), shape[:-2]) if len(shape) > 2 else ()
        label = f"{name}[{', '.join(map(str, at))}]" if at else name
        _, info = heat_slice(np.broadcast_to(np.zeros((), np.int8), shape[-2:]), label)
        entry["heat"] = {**info, "whole": len(shape) <= 2 and info["whole"], "values": floats(heat),
                         # the slice shown is where the NaN or Inf are, not simply the first
                         "nonfinite": bool(nan + posinf + neginf) and len(shape) > 2}
    return entry
