"""`compare`: run two MoX on the same inputs and measure how outputs differ,
at the outputs and at every module boundary the two share."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import frontends
from ._eval import flatten_inputs, run
from ._ir import FN_KINDS, Kind, Mox
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
    #: output name -> (original, modified) values as float32 NumPy arrays, for plots
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict, repr=False,
                                                                         compare=False)

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


def _calls(node: Mox) -> Iterator[Mox]:
    """Call nodes in the order `eval_mox` finishes them (not inside nested
    computations, whose values live in a compiled loop or branch). Without
    recursion: a tree of any depth."""
    stack = [(node, iter(node.children))]
    while stack:
        n, it = stack[-1]
        c = next(it, None)
        if c is None:
            stack.pop()
            if stack:  # every call below `node`, not `node` itself
                yield n
        elif isinstance(c, Mox):
            stack.append((c, iter(c.children)))


def call_keys(mox: Mox) -> dict[str, Mox]:
    """``path`` (``path.method`` for other methods; ``#k`` for the k-th call) -> call node."""
    seen: collections.Counter = collections.Counter()
    out = {}
    for node in _calls(mox):
        base = node.path if node.method in (None, "__call__") or node.kind in FN_KINDS \
            else f"{node.path}.{node.method}"
        seen[base] += 1
        out[base if seen[base] == 1 else f"{base}#{seen[base]}"] = node
    return out


def _flat(vals: list[jax.Array]) -> jax.Array:
    return jnp.concatenate([jnp.ravel(v).astype(jnp.float32) for v in vals])


def _stats(pairs: list[tuple[np.ndarray, np.ndarray]], rtol: float, atol: float) -> list[Stats]:
    """Per-pair statistics of flat float32 host arrays, in NumPy after the models ran (float32 values;
    BLAS dot products, float64 sums). Reducing hundreds of boundaries inside the models' jitted
    programs multiplied XLA's compile time by ten; NumPy compiles nothing."""
    out = []
    for x, y in pairs:
        d = np.abs(y - x)
        nx, ny, nd = (float(np.sqrt(np.dot(v, v), dtype=np.float64)) for v in (x, y, d))  # BLAS
        out.append(Stats(
            max_abs=float(d.max(initial=0.0)),
            mean_abs=float(d.sum(dtype=np.float64) / d.size) if d.size else 0.0,
            rel=nd / nx if nx > 0 else (0.0 if nd == 0 else float("inf")),
            cosine=float(np.dot(x, y)) / (nx * ny) if nx > 0 and ny > 0 else float(nx == ny),
            allclose=bool(np.all(d <= atol + rtol * np.abs(x))),
        ))
    return out


def _numeric(vals: Any) -> bool:
    return bool(vals) and all(jnp.issubdtype(v.dtype, jnp.number) or v.dtype == jnp.bool_ for v in vals)


_programs: weakref.WeakKeyDictionary[Mox, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def _tapped(mox: Mox) -> dict[str, Mox]:
    """The numeric call boundaries, by key, in the order `_program` returns their values."""
    return {k: n for k, n in call_keys(mox).items() if _numeric(n.outputs)}


def _program(mox: Mox, out_idx: tuple[int, ...], taps: bool) -> Any:
    """The jitted program computing ``mox``'s outputs and the values at all
    its numeric call boundaries, flattened to float32. One per MoX (kept while
    the MoX lives), so comparing many rewrites against one original compiles
    the original once."""
    cache = _programs.setdefault(mox, {})
    key = (out_idx, taps)
    f = cache.get(key)
    if f is None:
        tapped = {id(n): j for j, n in enumerate(_tapped(mox).values())} if taps else {}

        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(flat: list[Any]) -> Any:
            got: list = []
            outs = run(ref(), flat, taps=got if taps else None)
            vals: list = [None] * len(tapped)
            for node, xs in got:
                j = tapped.get(id(node))
                if j is not None:
                    vals[j] = _flat(xs)
            return [_flat([outs[i]]) for i in out_idx], vals

        f = cache[key] = jax.jit(program)
    return f


@dataclasses.dataclass(frozen=True)
class Measured:
    """One model's values on one set of inputs, on the host as flat float32:
    the outputs `compare` looks at and, when measured with boundaries, the
    values at every numeric call boundary (by `call_keys`)."""

    out_idx: tuple[int, ...]
    outs: list[np.ndarray]
    taps: dict[str, np.ndarray] | None


def paired_outputs(original: Mox, modified: Mox) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dynamic outputs of each model that `compare` pairs up (numeric,
    equal shapes); raises `YaxInputError` when they cannot be paired."""
    for m, what in ((original, "original"), (modified, "modified")):
        if not isinstance(m, Mox) or m.kind != Kind.ROOT:
            raise YaxInputError(f"`compare` expected a root MoX as `{what}`, but got {type(m).__name__}.")
    sel_a, sel_b = (frontends.of_root(m).compared(m) for m in (original, modified))
    if frontends.of_root(original).pair_by_name and frontends.of_root(modified).pair_by_name:
        names_b = {_output_names(modified)[j]: j for j in sel_b}
        names_a = _output_names(original)
        sel_a = [i for i in sel_a if names_a[i] in names_b]
        sel_b = [names_b[names_a[i]] for i in sel_a]
    if len(sel_a) != len(sel_b):
        raise YaxInputError(
            f"The models return {len(sel_a)} and {len(sel_b)} arrays; they cannot be compared."
        )
    for i, (x, y) in enumerate(zip((original.outvars[j] for j in sel_a), (modified.outvars[j] for j in sel_b))):
        if x.shape != y.shape:
            raise YaxInputError(f"Output {i} has shape {x.shape} in the original but {y.shape} in the modified model.")
    pos = [k for k, i in enumerate(sel_a) if _numeric([original.outvars[i]])]
    return tuple(sel_a[k] for k in pos), tuple(sel_b[k] for k in pos)


def measure(mox: Mox, args: tuple, kwargs: dict, out_idx: tuple[int, ...], boundaries: bool = True,
            lowered: threading.Event | None = None) -> Measured:
    """Run ``mox`` (jitted, compiled once per MoX) and bring its outputs
    ``out_idx`` and, with ``boundaries``, its call boundaries to the host.
    ``lowered`` is set once the program is traced and lowered (Python work,
    holding the GIL): XLA compiles it without holding the GIL, so another
    thread can work meanwhile."""
    return _to_host(_dispatch(mox, flatten_inputs(mox, args, kwargs), out_idx, boundaries, lowered))


def _dispatch(mox: Mox, flat: list[Any], out_idx: tuple[int, ...], boundaries: bool,
              lowered: threading.Event | None = None) -> Measured:
    """`measure` of flattened inputs, without waiting: the values are device arrays still being computed."""
    program = _program(mox, out_idx, boundaries)
    if lowered is not None:
        low = program.lower(flat)
        lowered.set()
        low.compile()  # the jitted program's caches keep it: the call below runs it
    outs, taps = program(flat)
    return Measured(out_idx, outs, dict(zip(_tapped(mox), taps)) if boundaries else None)


def _to_host(m: Measured) -> Measured:
    outs, taps = jax.device_get((m.outs, m.taps))
    return Measured(m.out_idx, outs, taps)


def compare_measured(original: Mox, modified: Mox, a: Measured, b: Measured, *, rtol: float = 1e-5,
                     atol: float = 1e-6) -> Comparison:
    """The `Comparison` of two measurements (`measure`) of ``original`` and
    ``modified``; boundaries are compared when both were measured with them."""
    keys = []
    if a.taps is not None and b.taps is not None:
        # The boundaries both models have, with equal output types, in the original's evaluation order.
        ka, kb = call_keys(original), call_keys(modified)
        keys = [k for k, n in ka.items() if k in kb and k in a.taps and k in b.taps
                and [type_str(x) for x in n.outputs] == [type_str(x) for x in kb[k].outputs]]
    stats = _stats(list(zip(a.outs + [a.taps[k] for k in keys], b.outs + [b.taps[k] for k in keys])), rtol, atol)
    names = [_output_names(original).get(i, f"out[{i}]") for i in a.out_idx]
    shapes = [original.outvars[i].shape for i in a.out_idx]
    return Comparison(
        outputs=dict(zip(names, stats)),
        boundaries=dict(zip(keys, stats[len(a.out_idx):])),
        rtol=rtol,
        atol=atol,
        arrays={k: (x.reshape(s), y.reshape(s)) for k, x, y, s in zip(names, a.outs, b.outs, shapes)},
    )


def compare(original: Mox, modified: Mox, *args: Any, new_params: Any = None, rtol: float = 1e-5,
            atol: float = 1e-6, boundaries: bool = True, **kwargs: Any) -> Comparison:
    """Run ``original`` and ``modified`` on the same inputs (each compiled
    once, with ``jax.jit``) and measure the differences: per output, and at every module
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
    idx_a, idx_b = paired_outputs(original, modified)
    if new_params is not None and not args:
        raise YaxInputError("`new_params` replaces the first positional argument, but no arguments were given.")
    args_b = args if new_params is None else (new_params, *args[1:])
    flat_a = flatten_inputs(original, args, kwargs)  # both inputs are checked before either model runs
    flat_b = flatten_inputs(modified, args_b, kwargs)
    # The two programs compile side by side: XLA compiles without holding Python's lock, so the
    # modified model is traced and compiled while the original compiles and runs in a helper thread
    # (started once the original is lowered, so the two traces do not contend for the lock).
    lowered = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fa = pool.submit(_dispatch, original, flat_a, idx_a, boundaries, lowered)
        fa.add_done_callback(lambda _: lowered.set())  # also when it fails
        lowered.wait()
        b = _dispatch(modified, flat_b, idx_b, boundaries)
        a = fa.result()
    return compare_measured(original, modified, _to_host(a), _to_host(b), rtol=rtol, atol=atol)


def _output_names(mox: Mox) -> dict[int, str]:
    """``out`` / ``out[1]['batch_stats']…`` for each dynamic output."""
    paths = mox.sig.outs.leaf_paths()
    return {j: "out" + paths[i] for j, i in enumerate(mox.dyn_out)}


def compiled_programs(mox: Mox) -> dict:
    """The jitted programs `compare` keeps for ``mox`` (empty until it ran)."""
    return _programs.get(mox, {})
