"""The gradient of a scalar of the model's output at every call row: what the gradient
colouring, the gradient in the Values tab and the backward NaN search differentiate
(`Scalar`: the loss, a logit or the sum of the logits), and one jitted program per model
and scalar (`yax.capture` with ``grad_of``: one forward and one backward pass) whose
gradients stay on the device; only what the colouring needs crosses to the host.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import yax
from yax.internal import capturable_calls, capture_keys, memo, model_jit, node_ids, to_host, type_str

from ._payloads import number
from ._reduce import MAX_OUTPUTS, Light, Static, entry_of, output_arrays, rebuilt, squared_norms


class Scalar:
    """A real scalar of the model's output, which the gradient colouring, the gradient in
    the Values tab and the backward NaN search differentiate (the ``grad_of`` of
    `yax.capture` and `yax.first_nonfinite`). ``kind``: ``"loss"`` (the explorer's
    ``grad_of``), ``"logit"`` (``out[0, ..., -1, index]`` of the output's logits, the
    argmax at that position when ``index`` is None) or ``"sum"`` (the sum of the logits).
    The logits are the output's ``.logits`` (Hugging Face), else its first floating array.

    One object per kind and index (`Inspector.scalar`): yax compiles once per function."""

    def __init__(self, kind: str, index: int | None = None, loss: Any = None):
        self.kind, self.index, self.loss = kind, index, loss

    @property
    def key(self) -> tuple:
        return (self.kind, self.index)

    @staticmethod
    def logits(out: Any) -> tuple[str, Any]:
        """The array the logit and the sum are taken of, and its name."""
        found = getattr(out, "logits", None)
        if hasattr(found, "dtype") and jnp.issubdtype(found.dtype, jnp.floating):
            return "logits", found
        for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
                return "out" + jax.tree_util.keystr(path), x
        raise yax.YaxInputError("The model's output holds no floating array, so it has no logit or sum to "
                                "differentiate. Open the explorer with `grad_of=` a function of the output "
                                "giving a scalar, and colour by the gradient of the loss.")

    @staticmethod
    def position(x: Any) -> tuple[int, ...]:
        """Where the logit is read before its last axis: the first example, the last position."""
        return () if x.ndim <= 1 else (0,) if x.ndim == 2 else (0,) * (x.ndim - 2) + (-1,)

    def chosen(self, out: Any) -> Any:
        """The logit's index: the one given, else the argmax at `position` (jittable); -1 for a sum or loss."""
        if self.kind != "logit":
            return jnp.int32(-1)
        _, x = self.logits(out)
        if not x.ndim:
            return jnp.int32(-1)
        if self.index is not None:
            if not 0 <= self.index < x.shape[-1]:
                raise yax.YaxInputError(f"The logit index {self.index} is out of range: the output's logits have "
                                        f"{x.shape[-1]} entries along their last axis. Give an index from 0 to "
                                        f"{x.shape[-1] - 1}, or leave it empty for the argmax.")
            return jnp.int32(self.index)
        return jnp.argmax(jax.lax.stop_gradient(x[self.position(x)])).astype(jnp.int32)

    def __call__(self, out: Any) -> Any:
        if self.kind == "loss":
            return self.loss(out)
        _, x = self.logits(out)
        if self.kind == "sum":
            return x.sum(dtype=jnp.float32)
        if not x.ndim:
            return x.astype(jnp.float32)
        return x[self.position(x)][self.chosen(out)].astype(jnp.float32)

    def describe(self, leaf: tuple[str, int] | None = None, index: int = -1) -> str:
        """What is differentiated, as the legend says it: ``logits[0, -1, 1234] (argmax)``.
        ``leaf``: the name and rank of the output's logits; ``index``: the logit's (-1: not known)."""
        if self.kind == "loss":
            name = getattr(self.loss, "__name__", "")
            return f"{name if name.isidentifier() else 'grad_of'}(output)"
        name, ndim = leaf or ("logits", 3)
        if self.kind == "sum":
            return f"sum({name})"
        if not ndim:
            return name
        pos = () if ndim <= 1 else (0,) if ndim == 2 else (0,) * (ndim - 2) + (-1,)
        at = [*map(str, pos), str(index) if index >= 0 else "argmax"]
        return f"{name}[{', '.join(at)}]" + (" (argmax)" if self.index is None and index >= 0 else "")


def _no_gradient(x: Any, g: Any) -> str:
    """Why the output ``x`` shows no gradient ``g`` ("" when it shows one)."""
    if g is not None and jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(g.dtype, jnp.floating):
        return ""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return f"a {type_str(x)} output has no gradient"
    return f"a {type_str(x)} output: its gradient is not shown"


CHUNK = 4096  # values per chunk of `_dots`


def _chunked(arrays: list[Any]) -> tuple[Any, Any, Any]:
    """``arrays`` (float32) flattened and padded with zeros into chunks of `CHUNK`
    values, stacked: the chunks ``[K, CHUNK]``, the array each chunk belongs to, and
    each array's padding. Reductions along the chunks, then summed per array, make one
    program of a few large operations (a masked sum of each of a 1B model's outputs
    compiled for seconds)."""
    rows, seg, pad = [], [], []
    for n, x in enumerate(arrays):
        k = max(1, -(-x.size // CHUNK))
        rows.append(jnp.pad(x.ravel(), (0, k * CHUNK - x.size)).reshape(k, CHUNK))
        seg += [n] * k
        pad.append(k * CHUNK - x.size)
    return jnp.concatenate(rows), np.asarray(seg, np.int32), np.asarray(pad, np.float32)


def _dots(gs: list[Any], xs: list[Any]) -> Any:
    """``sum(g * x)`` over the finite products of each pair of ``gs`` and ``xs`` (float32),
    `_chunked`."""
    if not gs:
        return jnp.zeros((0,), jnp.float32)
    products = [g.astype(jnp.float32) * x.astype(jnp.float32) for g, x in zip(gs, xs)]
    f, ids, _ = _chunked([jnp.where(jnp.isfinite(p), p, 0.0) for p in products])
    return jax.ops.segment_sum(f.sum(axis=1), ids, len(gs), indices_are_sorted=True)


class _GradProgram:
    """One jitted program per model and `Scalar`: the gradient of the scalar at every
    capturable call's outputs (`yax.capture` with ``grad_of``: one forward and one
    backward pass), kept on the device, and what the colouring needs of each: their
    ``g · g`` (`squared_norms`), ``sum(gradient × output)`` (`_dots`), the
    logit's index and the scalar's value.

    ``where`` (set while tracing) maps a row id to its outputs: ``(name, index in the
    program's gradients or None, type, shape, scan steps, why none)``."""

    def __init__(self, mox: yax.Mox, scalar: Scalar):
        self.where: dict[int, list[tuple]] = {}
        self.leaf: tuple[str, int] | None = None  # the logits' name and rank (set while tracing)
        calls = capturable_calls(mox)
        keys, ids = capture_keys(mox), node_ids(mox)
        rows = [ids[id(c)] for c in calls]
        ref = weakref.ref(mox)

        def program(dyn: list, template: tuple) -> tuple:
            m = ref()
            args, kwargs = rebuilt(m, dyn, template)
            out, got, grads = yax.capture(calls, m, *args, grad_of=scalar, **kwargs) if calls else \
                (yax.eval_mox(m, *args, **kwargs), {}, {})
            gs: list[Any] = []
            xs: list[Any] = []
            for rid, c in zip(rows, calls):
                given = dict(jax.tree_util.tree_flatten_with_path(grads[keys[id(c)]])[0])
                entries = []
                for path, name, x, steps in output_arrays(c, got[keys[id(c)]])[:MAX_OUTPUTS]:
                    g = given.get(path)
                    why = _no_gradient(x, g)
                    entries.append((name, None if why else len(gs), type_str(x), tuple(x.shape), steps, why))
                    if not why:
                        gs.append(g)
                        xs.append(x)
                self.where[rid] = entries
            chosen = scalar.chosen(out)
            if scalar.kind != "loss":
                name, x = scalar.logits(out)
                self.leaf = (name, x.ndim)
            return gs, squared_norms(gs), _dots(gs, xs), chosen, scalar(out)

        self.run = model_jit(program, static_argnums=1)




class Gradients:
    """The gradient of one `Scalar` at every capturable call's outputs, of one model on
    one batch, kept on the device; what the colouring needs crosses to the host."""

    def __init__(self, mox: yax.Mox, scalar: Scalar, args: tuple, kwargs: dict, batch: str):
        progs: dict = memo(mox, "widget.gradients", dict)
        prog = progs.get(scalar.key)
        if prog is None:
            prog = progs[scalar.key] = _GradProgram(mox, scalar)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        self.grads, squares, dots, chosen, value = prog.run([leaves[i] for i in mox.dyn_in],
                                                            Static(leaves, tree, mox))
        squares, self.dots, chosen, value = to_host((squares, dots, chosen, value))
        self.light = Light(self.grads, squares)
        self.program, self.scalar, self.batch = prog, scalar, batch
        self.index = int(chosen)
        self.value = number(value)
        self.overlay: dict[str, Any] | None = None

    def what(self) -> str:
        """The scalar differentiated: ``logits[0, -1, 1234] (argmax)``."""
        return self.scalar.describe(self.program.leaf, self.index)

    def label(self) -> str:
        """What was differentiated: ``d logits[0, -1, 1234] (argmax) / d output of each row, batch `example```."""
        return f"d {self.what()} / d output of each row, batch `{self.batch}`"

    def rows(self) -> tuple[dict[int, float | None], dict[int, float | None], dict[int, str]]:
        """Per row id: the norm of its outputs' gradient, ``sum(gradient × output)``, and why a
        row has no colour (or what its numbers leave out). `nonfinite` then holds, per row id,
        how many values of its gradient are NaN or Inf (only rows with some)."""
        if self.overlay is None:
            norms: dict[int, float | None] = {}
            gxa: dict[int, float | None] = {}
            why: dict[int, str] = {}
            nonfinite: dict[int, int] = {}
            for rid, at in self.program.where.items():
                sq = dot = zeros = bad = size = 0.0
                reasons = []
                for _, i, _, shape, _, reason in at:
                    if i is None:
                        reasons.append(reason)
                        continue
                    norm, nf = self.light.norm(i)
                    n = math.prod(shape)
                    sq += norm**2 if nf < n else 0.0
                    dot += float(self.dots[i])
                    # zeros only where they may be all there is: g . g is 0
                    z = self.light.zeros(i) if self.light.squares[i] == 0 else 0
                    zeros, bad, size = zeros + z, bad + nf, size + n
                if bad:
                    nonfinite[rid] = int(bad)
                if not size:
                    norms[rid] = gxa[rid] = None
                    why[rid] = "; ".join(dict.fromkeys(reasons)) or "this call has no array outputs"
                elif bad == size:
                    norms[rid] = gxa[rid] = None
                    why[rid] = "every value of its gradient is NaN or Inf"
                elif zeros == size:
                    norms[rid] = gxa[rid] = None
                    why[rid] = "its gradient is zero everywhere: to first order the scalar does not change with its outputs here"
                else:
                    norms[rid], gxa[rid] = number(math.sqrt(sq)), number(dot)
                    notes = [f"{int(bad):,} NaN or Inf in its gradient left out"] if bad else []
                    notes += [f"{r} (left out)" for r in dict.fromkeys(reasons)]
                    if notes:
                        why[rid] = "; ".join(notes)
            self.overlay = {"norms": norms, "gxa": gxa, "why": why, "nonfinite": nonfinite}
        o = self.overlay
        return o["norms"], o["gxa"], o["why"]

    def entries(self, rid: int) -> list[dict] | None:
        """The Values tab's gradient entries of call row ``rid`` (summaries of its outputs' gradients)."""
        at = self.program.where.get(rid)
        if at is None:
            return None
        out = []
        for name, i, type_, shape, steps, why in at:
            if i is None:
                out.append({"name": name, "type": type_, "shape": list(shape), "why": why})
            else:
                g = self.grads[i]
                out.append(entry_of(name, type_str(g), shape, steps, g))
        return out


def equation_grad_entries(node: Any, value: Any, grad: Any) -> list[dict]:
    """The gradient entries of an equation's captured ``value`` and its gradient ``grad``."""
    given = dict(jax.tree_util.tree_flatten_with_path(grad)[0])
    out = []
    for path, name, x, steps in output_arrays(node, value)[:MAX_OUTPUTS]:
        g = given.get(path)
        why = _no_gradient(x, g)
        out.append({"name": name, "type": type_str(x), "shape": list(x.shape), "why": why} if why else
                   entry_of(name, type_str(g), tuple(g.shape), steps, g))
    return out
