"""`compare`: run two MoX on the same inputs and measure how outputs differ,
at the outputs and at every module boundary the two share."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from ._eval import flatten_inputs, run
from ._ir import Mox
from ._print import type_str
from .errors import YaxInputError


@dataclasses.dataclass(frozen=True)
class Stats:
    """How one value of the modified model differs from the original's."""

    max_abs: float
    mean_abs: float
    rel: float        #: ||modified - original|| / ||original||
    cosine: float     #: cosine similarity of the flattened values
    allclose: bool    #: ``|m - o| <= atol + rtol * |o|`` everywhere

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The result of `compare`: per output, and per module boundary (in the
    order the original evaluates them) of the calls both models share."""

    outputs: dict[str, Stats]
    boundaries: dict[str, Stats]
    rtol: float
    atol: float

    @property
    def allclose(self) -> bool:
        return all(s.allclose for s in self.outputs.values())

    @property
    def first_divergence(self) -> str | None:
        """The first boundary (in evaluation order) whose values are not
        allclose: where the outputs start to differ."""
        return next((k for k, s in self.boundaries.items() if not s.allclose), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "allclose": self.allclose,
            "first_divergence": self.first_divergence,
            "outputs": {k: s.to_dict() for k, s in self.outputs.items()},
            "boundaries": {k: s.to_dict() for k, s in self.boundaries.items()},
        }

    def __repr__(self) -> str:
        width = max([len(k) for k in (*self.outputs, *self.boundaries)] + [8])
        head = f"{'':{width}}  {'max|Δ|':>10} {'mean|Δ|':>10} {'rel':>10} {'cos':>8}  close"
        lines = [f"Comparison(allclose={self.allclose}, first_divergence={self.first_divergence!r})", head]
        for title, rows in (("outputs", self.outputs), ("boundaries", self.boundaries)):
            lines.append(f"-- {title}")
            for k, s in rows.items():
                lines.append(f"{k:{width}}  {s.max_abs:10.3g} {s.mean_abs:10.3g} {s.rel:10.3g} {s.cosine:8.5f}  "
                             f"{'yes' if s.allclose else 'NO'}")
        return "\n".join(lines)


def _keys(taps: list[tuple[Mox, list[Any]]]) -> dict[str, tuple[Mox, list[Any]]]:
    seen: collections.Counter = collections.Counter()
    out = {}
    for node, vals in taps:
        base = node.path if node.method in (None, "__call__") or node.kind in ("activation", "function") \
            else f"{node.path}.{node.method}"
        seen[base] += 1
        out[base if seen[base] == 1 else f"{base}#{seen[base]}"] = (node, vals)
    return out


def _stats(a: list[jax.Array], b: list[jax.Array], rtol: float, atol: float) -> dict[str, jax.Array]:
    x = jnp.concatenate([jnp.ravel(v).astype(jnp.float32) for v in a])
    y = jnp.concatenate([jnp.ravel(v).astype(jnp.float32) for v in b])
    d = jnp.abs(y - x)
    nx, ny = jnp.linalg.norm(x), jnp.linalg.norm(y)
    tiny = jnp.finfo(jnp.float32).tiny
    return {
        "max_abs": jnp.max(d, initial=0.0),
        "mean_abs": jnp.mean(d) if d.size else jnp.float32(0),
        "rel": jnp.linalg.norm(y - x) / jnp.maximum(nx, tiny),
        "cosine": jnp.where((nx > 0) & (ny > 0), jnp.dot(x, y) / jnp.maximum(nx * ny, tiny),
                            jnp.where(nx == ny, 1.0, 0.0)),
        "allclose": jnp.all(d <= atol + rtol * jnp.abs(x)),
    }


def _numeric(vals: list[Any]) -> bool:
    return bool(vals) and all(jnp.issubdtype(v.dtype, jnp.number) or v.dtype == jnp.bool_ for v in vals)


def compare(original: Mox, modified: Mox, *args: Any, new_params: Any = None, rtol: float = 1e-5,
            atol: float = 1e-6, boundaries: bool = True, **kwargs: Any) -> Comparison:
    """Run ``original`` and ``modified`` on the same inputs, in one jitted
    computation, and measure the differences: per output, and at every module
    boundary both share (matched by path, method and call order, with equal
    shapes), so the first divergent boundary shows where a change starts to
    matter.

    Args:
      original, modified: root MoX (``modified`` typically from `yax.sub`).
      *args, **kwargs: the inputs, as for `eval_mox(original, ...)`.
      new_params: the modified model's parameters, if a rewrite changed
        them: they replace the first positional argument for ``modified``.
      rtol, atol: the tolerances of the ``allclose`` verdicts.
      boundaries: also compare module boundaries (default True).

    Returns:
      A `Comparison`; its ``repr`` is a table, ``to_dict()`` plain data.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> c = yax.compare(mox, yax.sub('//*[@name="relu"]', jax.nn.gelu, mox), p, x)
      >>> c.first_divergence
      'Sequential/relu'
    """
    for m, what in ((original, "original"), (modified, "modified")):
        if not isinstance(m, Mox) or m.kind != "root":
            raise YaxInputError(f"`compare` expected a root MoX as `{what}`, but got {type(m).__name__}.")
    args_b = args if new_params is None else (new_params, *args[1:])
    if new_params is not None and not args:
        raise YaxInputError("`new_params` replaces the first positional argument, but no arguments were given.")
    flat_a = flatten_inputs(original, args, kwargs)
    flat_b = flatten_inputs(modified, args_b, kwargs)
    keys: list[str] = []

    def both(fa: list[Any], fb: list[Any]) -> Any:
        ta: list = []
        tb: list = []
        oa = run(original, fa, taps=ta if boundaries else None)
        ob = run(modified, fb, taps=tb if boundaries else None)
        if len(oa) != len(ob):
            raise YaxInputError(f"The models return {len(oa)} and {len(ob)} arrays; they cannot be compared.")
        outs = {}
        for i, (x, y) in enumerate(zip(oa, ob)):
            if x.shape != y.shape:
                raise YaxInputError(f"Output {i} has shape {x.shape} in the original but {y.shape} in the modified model.")
            if _numeric([x]):
                outs[str(i)] = _stats([x], [y], rtol, atol)
        bounds = {}
        kb = _keys(tb)
        for k, (node, xs) in _keys(ta).items():
            other = kb.get(k)
            if other is None or not _numeric(xs) or [type_str(a) for a in node.outputs] != [
                    type_str(a) for a in other[0].outputs]:
                continue
            bounds[k] = _stats(xs, other[1], rtol, atol)
        keys[:] = list(bounds)
        return outs, bounds

    outs, bounds = jax.device_get(jax.jit(both)(flat_a, flat_b))
    names = _output_names(original)

    def stats(d: dict[str, Any]) -> Stats:
        return Stats(float(d["max_abs"]), float(d["mean_abs"]), float(d["rel"]), float(d["cosine"]),
                     bool(d["allclose"]))

    return Comparison(
        outputs={names.get(int(i), f"out[{i}]"): stats(d) for i, d in sorted(outs.items(), key=lambda kv: int(kv[0]))},
        boundaries={k: stats(bounds[k]) for k in keys},
        rtol=rtol,
        atol=atol,
    )


def _output_names(mox: Mox) -> dict[int, str]:
    """``out`` / ``out[1]['batch_stats']…`` for each dynamic output."""
    n = len(mox.dyn_out) + len(mox.out_static)
    paths = [jax.tree_util.keystr(kp) for kp, _ in
             jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(mox.out_tree, list(range(n))))[0]]
    return {j: "out" + paths[i] for j, i in enumerate(mox.dyn_out)}
