"""The explorer's view inside the model: a row's values, the tree painted by a
statistic, the first NaN or Inf, and the checks on named input batches.

Values are reduced where the model runs. `yax.capture` brings out the
outputs of every call (one program per model, compiled once) and they stay
on the device; selecting a row reduces that row's outputs to statistics, a
histogram and a heatmap slice in a small jitted function (compiled once per
shape), and only those cross to the host. Equations are captured one by one
when selected. Results are kept per model, batch and row, so selecting a row
again is instant; nothing here changes the model or the history.

`Inspector` is the session's part that holds these values; the formats
are in docs/widget.md ("Values").
"""

from __future__ import annotations

import math
import time
import weakref
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

import yax
from yax.errors import arg_name, where
from yax.internal import ValueStats, capturable_calls, capture_keys, node_ids, type_str

from ._payloads import HIST_BINS, floats, heat_slice

if TYPE_CHECKING:
    from ._session import Session

MAX_OUTPUTS = 8  # outputs of one row shown (a call returning a long tuple shows its first ones)
STATS = {"norm": "norm of the outputs", "zeros": "fraction of zeros", "nonfinite": "fraction of NaN or Inf"}
EXAMPLE = "example"  # the name of the batch the explorer was opened with, unless `batches` names it


# -- on the device ---------------------------------------------------------------------

def _reduced(x: Any) -> tuple[Any, Any, Any, Any, Any]:
    """One array's summary: counts ``[finite, NaN, +Inf, -Inf, zeros]`` (int32),
    ``[min, max, mean, std, norm]`` of the finite values (float32), the histogram of
    the finite values over ``[min, max]``, the heatmap (`heat_slice` of a 2-D slice)
    and which slice: the first holding a NaN or an Inf, else the first (a flat index
    over the leading axes)."""
    f = _floats(x)
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


CHUNK = 4096  # values per chunk of `_light`


def _light(outs: list[Any]) -> Any:
    """What the colouring needs of each array of ``outs``: ``[norm of the finite values,
    zeros, NaN or Inf]`` (float32; the zeros count the padding, see below).

    The arrays are flattened and padded with zeros into chunks of `CHUNK` values,
    reduced along the chunks and then summed per array: one program of a few large
    operations (three reductions of each of a 1B model's outputs compiled for seconds;
    a histogram and a heatmap of each for longer). The full summary of a row
    (`_reduced`) is made when it is selected."""
    rows, seg = [], []
    for n, x in enumerate(outs):
        k = max(1, -(-x.size // CHUNK))
        rows.append(jnp.pad(_floats(x).ravel(), (0, k * CHUNK - x.size)).reshape(k, CHUNK))
        seg += [n] * k
    n = len(outs)
    if not n:
        return jnp.zeros((0, 3), jnp.float32)
    f = jnp.concatenate(rows)  # the padding is zeros: finite, counted as zeros and taken off on the host
    ids = np.asarray(seg, np.int32)
    fin = jnp.isfinite(f)
    big = jnp.max(jnp.where(fin, jnp.abs(f), 0.0), axis=1)
    top = jax.ops.segment_max(big, ids, n, indices_are_sorted=True)
    scale = jnp.where(top > 0, top, 1.0)[ids][:, None]  # sums scaled by the largest |value|: they do not overflow
    sq = jax.ops.segment_sum(jnp.sum(jnp.square(jnp.where(fin, f, 0.0) / scale), axis=1), ids, n,
                             indices_are_sorted=True)
    zeros = jax.ops.segment_sum((f == 0).sum(axis=1, dtype=jnp.int32), ids, n, indices_are_sorted=True)
    bad = jax.ops.segment_sum((~fin).sum(axis=1, dtype=jnp.int32), ids, n, indices_are_sorted=True)
    return jnp.stack([jnp.where(top > 0, top, 1.0) * jnp.sqrt(sq), zeros.astype(jnp.float32),
                      bad.astype(jnp.float32)], axis=1)


def _floats(x: Any) -> Any:
    return (jnp.abs(x) if jnp.iscomplexobj(x) else x).astype(jnp.float32)


_summarize = jax.jit(_reduced)  # one output summarised on the device: compiled once per shape and dtype


class _Program:
    """One jitted program per model, so the values stay on the device: it brings out
    every capturable call's outputs and what the colouring needs of each (`_light`).
    One compile serves every call row; a row's full summary is made when it is selected.

    ``where`` (set while tracing) maps a row id to its outputs: ``(name, index in the
    program's outputs, type, shape, scan steps)``."""

    def __init__(self, mox: yax.Mox):
        self.where: dict[int, list[tuple]] = {}
        self.more: dict[int, int] = {}
        calls = capturable_calls(mox)
        keys, ids = capture_keys(mox), node_ids(mox)
        self.rows = [ids[id(c)] for c in calls]
        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(dyn: list, template: tuple) -> tuple[list, list]:
            leaves, tree = template
            m = ref()
            leaves = list(leaves)
            for i, x in zip(m.dyn_in, dyn):
                leaves[i] = x
            args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
            _, got = yax.capture(calls, m, *args, **kwargs) if calls else (None, {})
            outs: list[Any] = []
            for rid, c in zip(self.rows, calls):
                found = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(got[keys[id(c)]])[0]
                         if hasattr(x, "dtype")]
                self.more[rid] = max(0, len(found) - MAX_OUTPUTS)
                entries = []
                for k, (path, x) in enumerate(found[:MAX_OUTPUTS]):
                    # a call inside a scan gives its values stacked along the scan axes: those lead
                    nd = len(c.outputs[k].shape) if len(c.outputs) == len(found) else x.ndim
                    entries.append(("out" + jax.tree_util.keystr(path), len(outs), type_str(x), tuple(x.shape),
                                    tuple(x.shape[:x.ndim - nd])))
                    outs.append(x)
                self.where[rid] = entries
            return outs, _light(outs)

        self.capture = jax.jit(program, static_argnums=1)


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
    """Every capturable call's outputs, of one model on one batch, kept on the device,
    and what the colouring needs of each (only that crosses to the host)."""

    def __init__(self, mox: yax.Mox, args: tuple, kwargs: dict):
        prog = _programs.get(mox)
        if prog is None:
            prog = _programs[mox] = _Program(mox)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        self.outs, light = prog.capture([leaves[i] for i in mox.dyn_in], _Static(leaves, tree, mox))
        self.light = jax.device_get(light)  # per output: [norm, zeros, NaN or Inf]
        self.program = prog
        self.overlay: Any = None  # per row: [norm, fraction of zeros, fraction non-finite]

    def entries(self, rid: int) -> tuple[list[dict], int] | None:
        """The values pane's entries of call row ``rid`` (only its summary crosses to the host)."""
        at = self.program.where.get(rid)
        if at is None:
            return None
        out = []
        for name, i, type_, shape, steps in at:
            # one at a time: XLA's CPU client deadlocks with dozens of sharded programs in flight
            out.append(_entry(name, type_, shape, steps, *jax.device_get(_summarize(self.outs[i]))))
        return out, self.program.more[rid]

    def stats(self) -> dict[int, list[float]]:
        """Row id -> ``[norm, fraction of zeros, fraction non-finite]`` of all its outputs."""
        if self.overlay is None:
            self.overlay = {}
            for rid, at in self.program.where.items():
                sq = zeros = bad = size = finite = 0.0
                for _, i, _, shape, _ in at:
                    norm, z, nf = (float(v) for v in self.light[i])
                    n = math.prod(shape)
                    z -= max(1, -(-n // CHUNK)) * CHUNK - n  # the padding of its last chunk: zeros, not its own
                    sq += norm ** 2 if nf < n else 0.0
                    finite, zeros, bad, size = finite + n - nf, zeros + z, bad + nf, size + n
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


class Inspector:
    """The values pane and the colouring of one `Session`: each row's values on the
    batch in use, computed on the device and kept per model, batch and row."""

    def __init__(self, session: Session):
        self._session = session
        self._bounds: tuple[Any, str, _Boundaries] | None = None  # (model, batch, its boundaries): the latest
        self._shown: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, id): entry}

    def clear(self) -> None:
        """Let go of every value held."""
        self._bounds, self._shown = None, weakref.WeakKeyDictionary()

    def values(self, target: Any) -> dict[str, ValueStats]:
        """Statistics of the outputs of ``target`` (a node of the current model,
        or an XPath selecting one) on the batch in use (`Explorer.values`)."""
        if isinstance(target, str):
            found = yax.query(target, self._session.mox)
            found = [n for n in found if isinstance(n, (yax.Mox, yax.Equation))] if isinstance(found, list) else []
            if len(found) != 1:
                raise yax.YaxInputError(f"`values` shows one node, but `{target}` selects {len(found)}. "
                                        "Make the query select exactly one call or equation.")
            target = found[0]
        return {e["name"]: value_stats(e) for e in self.row(target)["outputs"]}

    def boundaries(self) -> _Boundaries:
        s = self._session
        mox = s.mox
        if self._bounds is None or self._bounds[0] is not mox or self._bounds[1] != s.batch:
            self._bounds = None  # let go of the previous values before the device holds the new ones
            args, kwargs = s.call_args()
            self._bounds = (mox, s.batch, _Boundaries(mox, args, kwargs))
        return self._bounds[2]

    def row(self, node: Any) -> dict:
        """The values pane's state for ``node`` (cached per model, batch and node)."""
        s = self._session
        mox = s.mox
        args, kwargs = s.call_args()
        rid = node_ids(mox).get(id(node))
        if rid is None:
            raise yax.YaxInputError(f"{where(node).capitalize()} is not part of the current model. "
                                    "Query `explorer.mox` for it.")
        cache = self._shown.setdefault(mox, {})
        hit = cache.get((s.batch, rid))
        if hit is not None:
            return hit
        t = time.perf_counter()
        found = self.boundaries().entries(rid) if isinstance(node, yax.Mox) else None
        if found is None:  # an equation (or a call inside a loop or branch: refused, saying why)
            _, got = yax.capture(node, mox, *args, **kwargs)
            found = _entries(node, got[capture_keys(mox)[id(node)]])
        outputs, more = found
        cache[(s.batch, rid)] = entry = {
            "id": rid, "key": capture_keys(mox)[id(node)], "batch": s.batch, "outputs": outputs, "more": more,
            "seconds": round(time.perf_counter() - t, 3)}
        return entry

    def show(self, node: Any) -> dict:
        """Show ``node``'s values in the pane."""
        entry = self.row(node)
        self._session.show(values=entry)
        return entry

    def paint(self, stat: str) -> None:
        """Paint every call row by ``stat`` ("off": nothing)."""
        if stat not in ("off", *STATS):
            raise yax.YaxInputError(f"The tree is painted by one of off, {', '.join(STATS)}; not {str(stat)[:40]!r}.")
        if stat == "off":
            self._session.show(overlay={})
            return
        t = time.perf_counter()
        col = list(STATS).index(stat)
        vals = {str(rid): _number(v[col]) for rid, v in self.boundaries().stats().items()}
        shown = [v for v in vals.values() if v is not None]
        self._session.show(overlay={
            "stat": stat, "label": STATS[stat], "batch": self._session.batch, "values": vals,
            "lo": min(shown) if shown else None, "hi": max(shown) if shown else None,
            "rows": len(vals), "seconds": round(time.perf_counter() - t, 3)})

    def batch_changed(self) -> None:
        """The batch in use changed: paint and show the selected row's values on it."""
        s = self._session
        if s.state["overlay"].get("stat"):
            self.paint(s.state["overlay"]["stat"])
        rid = s.state["values"].get("id")
        if rid is not None:
            try:
                self.show(s.node(rid))
            except Exception:  # the row is another model's: the pane waits for a selection
                s.show(values={})

    def nonfinite(self) -> dict:
        """Where the first NaN or Inf of the current model on the batch in use is:
        the reply the front-end selects a row by."""
        s = self._session
        args, kwargs = s.call_args()
        found = yax.first_nonfinite(s.mox, *args, **kwargs)
        if found is None:
            return {"found": False, "message": f"No NaN or Inf: every value is finite on the batch `{s.batch}`."}
        ids = node_ids(s.mox)
        # the first line (an equation's) or paragraph (an argument's: its layer and first reader)
        head = str(found).split("\n")[0] if found.equation is not None else \
            " ".join(line.strip() for line in str(found).split("\n\n")[0].split("\n"))
        first = found.equation or found.reader
        return {"found": True, "id": ids.get(id(found.call)) if found.call is not None else None,
                "eq": ids.get(id(first)) if first is not None else None,
                "step": list(found.step), "message": f"{head} (batch `{s.batch}`)", "detail": str(found.output)}


# -- batches -------------------------------------------------------------------------------

def as_args(value: Any, n: int) -> tuple:
    """A batch given in `batches` as positional arguments: the value itself for
    a model of one input, a tuple of them for several."""
    return (value,) if n <= 1 or not isinstance(value, tuple) else value


def same_inputs(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb))


def check_fits(name: str, example: tuple, new: tuple) -> None:
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
