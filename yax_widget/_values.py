"""The explorer's view inside the model (issue 13): a row's values, the tree
painted by a statistic, named input batches and the first NaN or Inf.

Values are reduced where the model runs. `yax.capture` brings out the
outputs of every call (one program per model, compiled once) and they stay
on the device; selecting a row reduces that row's outputs to statistics, a
histogram and a heatmap slice in a small jitted function (compiled once per
shape), and only those cross to the host. Equations are captured one by one
when selected. Results are kept per model, batch and row, so selecting a row
again is instant; nothing here changes the model or the history.

The requests (``values``, ``overlay``, ``batch``, ``nonfinite``) are added to
``_protocol.HANDLERS`` when this module is imported; formats in
docs/widget.md ("Values").
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import traitlets

import yax
from yax.errors import arg_name, where
from yax.internal import ValueStats, capturable_calls, capture_keys, node_ids, type_str

from . import _protocol
from ._payloads import HIST_BINS, floats, heat_slice

if TYPE_CHECKING:
    from ._explorer import Explorer

MAX_OUTPUTS = 8  # outputs of one row shown (a call returning a long tuple shows its first ones)
STATS = {"norm": "norm of the outputs", "zeros": "fraction of zeros", "nonfinite": "fraction of NaN or Inf"}
EXAMPLE = "example"  # the name of the batch the explorer was opened with, unless `batches` names it


# -- on the device ---------------------------------------------------------------------

def _reduced(x: Any) -> tuple[Any, Any, Any, Any, Any]:
    """Counts ``[finite, NaN, +Inf, -Inf, zeros]`` (int32), ``[min, max, mean,
    std, norm]`` of the finite values (float32), the histogram of the finite
    values over ``[min, max]``, the heatmap (`heat_slice` of a 2-D slice) and
    which slice: the first holding a NaN or an Inf, else the first (a flat index
    over the leading axes)."""
    f = jnp.abs(x) if jnp.iscomplexobj(x) else x
    f = f.astype(jnp.float32)
    fin = jnp.isfinite(f)
    n = fin.sum(dtype=jnp.int32)
    nan = jnp.isnan(f).sum(dtype=jnp.int32)
    posinf = (f == jnp.inf).sum(dtype=jnp.int32)
    zeros = (f == 0).sum(dtype=jnp.int32)
    lo = jnp.min(jnp.where(fin, f, jnp.inf), initial=jnp.inf)
    hi = jnp.max(jnp.where(fin, f, -jnp.inf), initial=-jnp.inf)
    # sums of values scaled by the largest |value|: the mean, std and norm of large values do not overflow
    big = jnp.maximum(-lo, hi)
    big = jnp.where((n > 0) & (big > 0), big, 1.0)
    s = jnp.where(fin, f, 0.0) / big
    mean = s.sum() / jnp.maximum(n, 1)
    std = big * jnp.sqrt(jnp.where(fin, (s - mean) ** 2, 0.0).sum() / jnp.maximum(n, 1))
    norm = big * jnp.sqrt((s * s).sum())
    counts = jnp.stack([n, nan, posinf, f.size - n - nan - posinf, zeros])
    width = hi / big - lo / big  # scaled too: at most 2
    at = jnp.floor((s - lo / big) / jnp.where(width > 0, width, 1.0) * HIST_BINS)
    at = jnp.where(fin, jnp.clip(at, 0, HIST_BINS - 1), 0).astype(jnp.int32)
    hist = jnp.bincount(at.ravel(), weights=fin.ravel().astype(jnp.int32), length=HIST_BINS)
    k = jnp.zeros((), jnp.int32)
    if f.ndim > 2 and f.size:
        slices = f.reshape(-1, *f.shape[-2:])
        k = jnp.argmax(~fin.reshape(slices.shape[0], -1).all(axis=1)).astype(jnp.int32)
        f = slices[k]
    heat = heat_slice(f, "")[0] if f.ndim and f.size else jnp.zeros((0, 0), jnp.float32)
    return counts, jnp.stack([lo, hi, big * mean, std, norm]), hist, heat, k


_summarize = jax.jit(_reduced)  # for an equation's outputs, compiled once per shape and dtype
_pick = jax.jit(lambda group, i: tuple(a[i] for a in group))  # one row's summary of a group, on the device


class _Program:
    """One jitted program per model: capture every capturable call's outputs and
    reduce each (`_reduced`, vmapped over the outputs of one shape and dtype), so
    one compile serves every call row and the values stay on the device.

    ``where`` (set while tracing) maps a row id to its outputs: ``(name, group,
    index in the group, type, shape, scan steps)``; the program returns, per
    group, the stacked ``(counts, stats, hist, heat)``."""

    def __init__(self, mox: yax.Mox):
        self.where: dict[int, list[tuple]] = {}
        self.more: dict[int, int] = {}
        calls = capturable_calls(mox)
        keys, ids = capture_keys(mox), node_ids(mox)
        self.rows = [ids[id(c)] for c in calls]
        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(dyn: list, template: tuple) -> list:
            leaves, tree = template
            m = ref()
            leaves = list(leaves)
            for i, x in zip(m.dyn_in, dyn):
                leaves[i] = x
            args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
            _, got = yax.capture(calls, m, *args, **kwargs) if calls else (None, {})
            groups: dict[tuple, list] = {}
            for rid, c in zip(self.rows, calls):
                found = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(got[keys[id(c)]])[0]
                         if hasattr(x, "dtype")]
                self.more[rid] = max(0, len(found) - MAX_OUTPUTS)
                entries = []
                for k, (path, x) in enumerate(found[:MAX_OUTPUTS]):
                    g = groups.setdefault((x.shape, x.dtype), [])
                    # a call inside a scan gives its values stacked along the scan axes: those lead
                    nd = len(c.outputs[k].shape) if len(c.outputs) == len(found) else x.ndim
                    entries.append(("out" + jax.tree_util.keystr(path), list(groups).index((x.shape, x.dtype)),
                                    len(g), type_str(x), tuple(x.shape), tuple(x.shape[:x.ndim - nd])))
                    g.append(x)
                self.where[rid] = entries
            return [jax.vmap(_reduced)(jnp.stack(g)) for g in groups.values()]

        self.jitted = jax.jit(program, static_argnums=1)


class _Static:
    """The arguments' structure and static leaves, hashable for `jax.jit`'s static argument
    (the same for every batch: `add_batch` checks it; compared by their reprs)."""

    def __init__(self, leaves: list, tree: Any, mox: yax.Mox):
        dyn = set(mox.dyn_in)
        self.value = ([None if i in dyn else x for i, x in enumerate(leaves)], tree)
        self.key = (tree, tuple(repr(x) for i, x in enumerate(leaves) if i not in dyn))

    def __iter__(self):
        return iter(self.value)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self.key == other.key


_programs: weakref.WeakKeyDictionary[yax.Mox, _Program] = weakref.WeakKeyDictionary()


class _Boundaries:
    """Every capturable call's summarised outputs, of one model on one batch, on the device."""

    def __init__(self, mox: yax.Mox, args: tuple, kwargs: dict):
        prog = _programs.get(mox)
        if prog is None:
            prog = _programs[mox] = _Program(mox)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        self.groups = prog.jitted([leaves[i] for i in mox.dyn_in], _Static(leaves, tree, mox))
        for g in self.groups:  # compile each group's pick now: every later selection only runs one
            _pick(g, 0)
        self.program = prog
        self.overlay: Any = None  # per row: [norm, fraction of zeros, fraction non-finite], fetched once

    def entries(self, rid: int) -> tuple[list[dict], int] | None:
        """The values pane's entries of call row ``rid`` (only its summary crosses to the host)."""
        at = self.program.where.get(rid)
        if at is None:
            return None
        out = []
        for name, g, i, type_, shape, steps in at:
            out.append(_entry(name, type_, shape, steps, *jax.device_get(_pick(self.groups[g], i))))
        return out, self.program.more[rid]

    def stats(self) -> dict[int, list[float]]:
        """Row id -> ``[norm, fraction of zeros, fraction non-finite]`` of all its outputs."""
        if self.overlay is None:
            small = jax.device_get([(c, s) for c, s, *_ in self.groups])  # counts and stats only: scalars
            self.overlay = {}
            for rid, at in self.program.where.items():
                sq = zeros = bad = size = finite = 0.0
                for _, g, i, _, shape, _ in at:
                    counts, stats = small[g][0][i], small[g][1][i]
                    sq += float(stats[4]) ** 2 if counts[0] else 0.0
                    finite += counts[0]
                    zeros, bad, size = zeros + counts[4], bad + counts[1] + counts[2] + counts[3], size + np.prod(shape)
                # the norm of the finite values: none when there are none
                norm = math.sqrt(sq) if finite else math.nan
                self.overlay[rid] = [norm, zeros / size, bad / size] if size else [math.nan] * 3
        return self.overlay


# -- on the host ------------------------------------------------------------------------

def _number(v: Any) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _entry(name: str, type_: str, shape: tuple, steps: tuple, counts: Any, stats: Any, hist: Any,
           heat: Any, k: Any) -> dict:
    """The values pane's entry for one output from its summary (`_reduced`)."""
    n, nan, posinf, neginf, zeros = (int(c) for c in counts)
    lo, hi, mean, std, norm = (_number(s) if n else None for s in stats)
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


def value_stats(entry: dict) -> ValueStats:
    """A values-pane entry as `yax.internal.ValueStats` (what `Explorer.values` returns)."""
    nan = float("nan")
    return ValueStats(entry["type"], *(nan if entry[k] is None else entry[k] for k in ("min", "max", "mean", "std")),
                      entry["nan"], entry["posinf"], entry["neginf"], entry["zeros"], entry["size"])


def _entries(node: Any, value: Any) -> tuple[list[dict], int]:
    """The entries of an equation's captured ``value``, reduced on the device, at
    most `MAX_OUTPUTS`, and how many outputs were left out."""
    leaves = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(value)[0] if hasattr(x, "dtype")]
    traced = list(node.outputs)
    out = []
    for k, (path, x) in enumerate(leaves[:MAX_OUTPUTS]):
        nd = len(traced[k].shape) if len(traced) == len(leaves) else x.ndim  # scan axes lead
        summary = jax.device_get(_summarize(x))
        out.append(_entry("out" + jax.tree_util.keystr(path), type_str(x), tuple(x.shape),
                          tuple(x.shape[:x.ndim - nd]), *summary))
    return out, len(leaves) - len(out)


class Values(traitlets.HasTraits):
    """The explorer's values pane, colouring, batches and NaN search (a mixin of `Explorer`)."""

    _batches = traitlets.Dict().tag(sync=True)  #: the named input batches and the one in use
    _values = traitlets.Dict().tag(sync=True)   #: the selected row's values on that batch, with binary heatmaps
    _overlay = traitlets.Dict().tag(sync=True)  #: the statistic the tree is painted by, per row id

    def _init_values(self: Explorer, batches: Mapping[str, Any] | None) -> None:
        self._inputs: dict[str, tuple[tuple, dict]] = {}
        self._batch = EXAMPLE
        self._refs: dict[str, Any] = {}  # the original's measured values on each batch used so far
        self._bounds: tuple[Any, str, _Boundaries] | None = None  # (model, batch, its boundaries): the latest
        self._shown: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, id): entry}
        if batches is not None and not isinstance(batches, Mapping):
            raise yax.YaxInputError(
                f"`batches` must map names to inputs, such as `{{'clean': x, 'corrupt': y}}`, but got a "
                f"`{type(batches).__name__}`."
            )
        example = self._args[1:] if self._has_params else self._args
        given = dict(batches or {})
        same = next((k for k, v in given.items() if _same(_as_args(v, len(example)), example)), None)
        if same is None and (self._args or self._kwargs):
            self._inputs[EXAMPLE] = (self._args, self._kwargs)
        for name, v in given.items():
            self.add_batch(name, *_as_args(v, len(example)))
        self._batch = same or next(iter(self._inputs), EXAMPLE)
        self._sync_batches()

    # -- the Python API ------------------------------------------------------------------

    def add_batch(self: Explorer, name: str, *args: Any, **kwargs: Any) -> None:
        """Offer the inputs ``args`` (after the parameters, when the model has
        them) and ``kwargs`` (the example's, where not given) as the batch
        ``name``: the values, colouring, NaN search and comparison can use it.
        It must have the example's structure, shapes and dtypes (the model is
        traced once).

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> from yax_widget import Explorer
          >>> m = nn.Dense(2); x = jnp.ones((1, 3)); p = m.init(jax.random.key(0), x)
          >>> ex = Explorer(m, p, x, batches={"ones": x, "zeros": jnp.zeros((1, 3))})
          >>> ex.add_batch("twos", 2 * x)
          >>> ex.batch, list(ex._batches["names"])
          ('ones', ['ones', 'zeros', 'twos'])
        """
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise yax.YaxInputError(f"A batch name must be a non-empty string of at most 80 characters, not {name!r}.")
        head = self._args[:1] if self._has_params else ()
        new = ((*head, *args), {**self._kwargs, **kwargs})
        _check_fits(name, (self._args, self._kwargs), new)
        self._inputs[name] = new
        self._sync_batches()

    @property
    def batch(self: Explorer) -> str:
        """The name of the batch the values, colouring and comparison use."""
        return self._batch

    def use_batch(self: Explorer, name: str) -> None:
        """Show values, colours and the comparison on the batch ``name``."""
        if name not in self._inputs:
            raise yax.YaxInputError(f"No batch is named {name!r}; the batches are "
                                    f"{', '.join(map(repr, self._inputs)) or 'none'}. Add one with "
                                    "`explorer.add_batch(name, *inputs)`.")
        if name == self._batch:
            return

        def swap() -> None:  # on the worker: between two measurements, never during one
            self._refs[self._batch] = self._reference
            self._args, self._kwargs = self._inputs[name]
            self._reference = self._refs.get(name)
            self._batch = name

        self._worker().submit(swap).result()
        self._sync_batches()
        self._finish_compare(self._start_compare())  # the comparison, on the new batch
        if self._overlay.get("stat"):
            self._paint(self._overlay["stat"])
        if self._values.get("id") is not None:
            try:
                self._show_values(self._node_of(self._values["id"]))
            except Exception:  # the row is another model's: the pane waits for a selection
                self._values = {}

    def values(self: Explorer, target: Any) -> dict[str, ValueStats]:
        """Statistics of the outputs of ``target`` (a node of the current model,
        or an XPath selecting one) on the batch in use, computed on the device
        as the values pane shows them; the UI is not changed.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> from yax_widget import Explorer
          >>> m = nn.Sequential([nn.Dense(4), nn.relu]); x = jnp.ones((2, 3))
          >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
          >>> s = ex.values('//activation')["out"]
          >>> s.type, s.min >= 0
          ('f32[2,4]', True)
        """
        if isinstance(target, str):
            found = [n for n in yax.query(target, self.mox) if isinstance(n, (yax.Mox, yax.Equation))]
            if len(found) != 1:
                raise yax.YaxInputError(f"`values` shows one node, but `{target}` selects {len(found)}. "
                                        "Make the query select exactly one call or equation.")
            target = found[0]
        return {e["name"]: value_stats(e) for e in self._row_values(target)["outputs"]}

    # -- computing, with caches ------------------------------------------------------------

    def _call_args(self: Explorer) -> tuple[tuple, dict]:
        """The current model's arguments on the batch in use (its parameters first)."""
        if not self._args and not self._kwargs:
            raise yax.YaxInputError("The explorer was opened without example inputs, so the model has no values "
                                    "to show. Open it as `Explorer(model, variables, batch)`.")
        args = (self.params, *self._args[1:]) if self._has_params else self._args
        return args, self._kwargs

    def _boundaries(self: Explorer) -> _Boundaries:
        mox = self.mox
        if self._bounds is None or self._bounds[0] is not mox or self._bounds[1] != self._batch:
            self._bounds = None  # let go of the previous values before the device holds the new ones
            args, kwargs = self._call_args()
            self._bounds = (mox, self._batch, _Boundaries(mox, args, kwargs))
        return self._bounds[2]

    def _row_values(self: Explorer, node: Any) -> dict:
        """The values pane's state for ``node`` (cached per model, batch and node)."""
        mox = self.mox
        args, kwargs = self._call_args()
        rid = node_ids(mox).get(id(node))
        if rid is None:
            raise yax.YaxInputError(f"{where(node).capitalize()} is not part of the current model. "
                                    "Query `explorer.mox` for it.")
        cache = self._shown.setdefault(mox, {})
        hit = cache.get((self._batch, rid))
        if hit is not None:
            return hit
        t = time.perf_counter()
        found = self._boundaries().entries(rid) if isinstance(node, yax.Mox) else None
        if found is None:  # an equation (or a call inside a loop or branch: refused, saying why)
            _, got = yax.capture(node, mox, *args, **kwargs)
            found = _entries(node, got[capture_keys(mox)[id(node)]])
        outputs, more = found
        cache[(self._batch, rid)] = entry = {
            "id": rid, "key": capture_keys(mox)[id(node)], "batch": self._batch, "outputs": outputs, "more": more,
            "seconds": round(time.perf_counter() - t, 3)}
        return entry

    def _show_values(self: Explorer, node: Any) -> dict:
        self._values = entry = self._row_values(node)
        return entry

    def _node_of(self: Explorer, rid: int) -> Any:
        return _protocol._node(self, {"id": rid})

    def _paint(self: Explorer, stat: str) -> None:
        """Set `_overlay` to ``stat`` of every call row ("off": nothing)."""
        if stat == "off":
            self._overlay = {}
            return
        t = time.perf_counter()
        col = list(STATS).index(stat)
        vals = {str(rid): _number(v[col]) for rid, v in self._boundaries().stats().items()}
        shown = [v for v in vals.values() if v is not None]
        self._overlay = {"stat": stat, "label": STATS[stat], "batch": self._batch, "values": vals,
                         "lo": min(shown) if shown else None, "hi": max(shown) if shown else None,
                         "rows": len(vals), "seconds": round(time.perf_counter() - t, 3)}

    def _sync_batches(self: Explorer) -> None:
        self._batches = {"names": list(self._inputs), "current": self._batch}


# -- batches -------------------------------------------------------------------------------

def _as_args(value: Any, n: int) -> tuple:
    """A batch given in `batches` as positional arguments: the value itself for
    a model of one input, a tuple of them for several."""
    return (value,) if n <= 1 or not isinstance(value, tuple) else value


def _same(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb))


def _check_fits(name: str, example: tuple, new: tuple) -> None:
    """Refuse a batch whose structure, shapes or dtypes differ from the example's."""
    want, wt = jax.tree_util.tree_flatten_with_path(example)
    got, gt = jax.tree_util.tree_flatten_with_path(new)
    if wt != gt:
        raise yax.YaxInputError(
            f"The batch `{name}` is structured as `{gt}`, but the model was traced with `{wt}`. Give the same "
            "arguments as the example (after the parameters), with arrays of the same shapes."
        )
    for (path, w), (_, g) in zip(want, got):
        ws, gs = hasattr(w, "dtype") and hasattr(w, "shape"), hasattr(g, "dtype") and hasattr(g, "shape")
        if ws and gs and (tuple(w.shape) != tuple(g.shape) or np.dtype(w.dtype) != np.dtype(g.dtype)):
            raise yax.YaxInputError(
                f"The batch `{name}` gives {type_str(g)} for `{arg_name(path)}`, but the model was traced with "
                f"{type_str(w)}. Give arrays of the traced shapes and dtypes (cast with `.astype`), or open "
                "another explorer for other shapes."
            )
        if ws != gs or (not ws and w != g):
            raise yax.YaxInputError(
                f"The batch `{name}` gives `{g!r}` for `{arg_name(path)}`, but the model was traced with "
                f"`{w!r}`, which it treats as fixed. Give the same value, or open another explorer."
            )


# -- requests from the front-end ---------------------------------------------------------

def _values_request(ex: Explorer, content: dict) -> dict:
    entry = ex._show_values(_protocol._node(ex, content))
    return {"id": entry["id"], "seconds": entry["seconds"]}


def _overlay_request(ex: Explorer, content: dict) -> dict:
    stat = content.get("stat")
    if stat not in ("off", *STATS):
        raise _protocol.RequestError(f"`stat` must be one of off, {', '.join(STATS)}; not {str(stat)[:40]!r}.")
    ex._paint(stat)
    return {"stat": stat}


def _batch_request(ex: Explorer, content: dict) -> dict:
    name = content.get("name")
    if not isinstance(name, str) or name not in ex._inputs:
        raise _protocol.RequestError(f"`name` must name a batch ({', '.join(ex._inputs)}), not {str(name)[:40]!r}.")
    ex.use_batch(name)
    return {"name": name}


def _nonfinite_request(ex: Explorer, content: dict) -> dict:
    args, kwargs = ex._call_args()
    found = yax.first_nonfinite(ex.mox, *args, **kwargs)
    if found is None:
        return {"found": False, "message": f"No NaN or Inf: every value is finite on the batch `{ex.batch}`."}
    ids = node_ids(ex.mox)
    # the first line (an equation's) or paragraph (an argument's: its layer and first reader)
    head = str(found).split("\n")[0] if found.equation is not None else \
        " ".join(line.strip() for line in str(found).split("\n\n")[0].split("\n"))
    return {"found": True, "id": ids.get(id(found.call)) if found.call is not None else None,
            "eq": ids.get(id(found.equation or found.reader)) if (found.equation or found.reader) is not None else None,
            "step": list(found.step), "message": f"{head} (batch `{ex.batch}`)", "detail": str(found.output)}


_protocol.HANDLERS.update({"values": _values_request, "overlay": _overlay_request, "batch": _batch_request,
                           "nonfinite": _nonfinite_request})
