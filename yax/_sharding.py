"""Sharded models: what yax knows of arrays laid out over several devices.

JAX's own SPMD runs them. `eval_mox` binds the primitives the model binds, so
values keep the shardings JAX gives them (under ``jax.jit`` the program is the
original one, laid out alike); yax adds no distributed engine of its own. What
is here:

* `spread` / `spec_of`: whether a value is laid out over several devices, and
  its ``PartitionSpec``. Where values are spread, `compare`, `first_nonfinite`
  and the explorer reduce them where they are and bring only the statistics to
  the host (`reduced_stats`); a single-device model keeps the host path.
* `input_specs`: the specs of a root's arguments, recorded by `make_mox` on the
  root (``Mox.shardings``), and `call_specs`: for each call, the specs of the
  arguments it reads (its parameters): the view's ``@sharding`` attribute and
  the explorer's tooltip (``kernel=P(None,'model') bias=P('model')``).
* `derived`: the sharding of a variable a rewrite adds (a LoRA adapter's
  ``lora_a``), derived from the replaced layer's, on the same mesh
  (`yax.rewrite.shard`).

Only ``NamedSharding`` has a spec; arrays on one device, and other kinds of
sharding, are "not sharded" here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
from jax.sharding import NamedSharding, PartitionSpec

from ._calls import formals, index, memo
from ._ir import Equation, Mox, Var


def _sharding(x: Any) -> Any:
    """``x.sharding`` of a concrete array or an abstract one, ``None`` for anything else (a tracer)."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return getattr(x, "sharding", None)
    except Exception:  # an array whose buffers were deleted
        return None


def spec_of(x: Any) -> PartitionSpec | None:
    """The ``PartitionSpec`` of ``x`` when it is laid out by a ``NamedSharding``
    over more than one device (replicated ones included: ``P()``), else ``None``."""
    s = _sharding(x)
    if isinstance(s, NamedSharding) and s.mesh.size > 1:
        return s.spec
    return None


def spread(x: Any) -> bool:
    """Whether ``x`` is a concrete ``jax.Array`` held on more than one device
    (sharded or replicated): what is reduced where it is before anything of it
    crosses to the host."""
    if not isinstance(x, jax.Array):
        return False
    s = _sharding(x)
    return s is not None and len(s.device_set) > 1


def to_host(tree: Any) -> Any:
    """``jax.device_get`` of ``tree``, also in a job of several processes (``jax.distributed``):
    an array split over devices of other processes is gathered whole first. That is a
    collective: every process must make the same call, as they make every other."""
    def local(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            from jax.experimental import multihost_utils

            return multihost_utils.process_allgather(x, tiled=True)
        return x

    return jax.device_get(jax.tree_util.tree_map(local, tree))


def any_spread(values: Iterable[Any]) -> bool:
    return any(spread(x) for x in jax.tree_util.tree_leaves(values))


def is_sharded(spec: PartitionSpec | None) -> bool:
    """Whether ``spec`` splits any axis (``P()`` and ``P(None, None)`` do not)."""
    return spec is not None and any(e is not None for e in spec)


def _entry(e: Any) -> str:
    if e is None:
        return "None"
    if isinstance(e, str):
        return repr(e)
    if isinstance(e, (tuple, list)):
        return "(" + ",".join(_entry(a) for a in e) + ")"
    return "U" if e is PartitionSpec.UNCONSTRAINED else str(e)


def spec_text(spec: PartitionSpec) -> str:
    """``P(None,'model')``: a spec as the view and the explorer write it (the
    same on every JAX version; JAX's own repr changed)."""
    return "P(" + ",".join(_entry(e) for e in spec) + ")"


def input_specs(invars: Sequence[Var], values: Sequence[Any]) -> tuple[tuple[Var, PartitionSpec], ...]:
    """``(var, spec)`` of each traced argument laid out over several devices
    (`spec_of`); empty when none is, or when none of them splits an axis."""
    found = tuple((v, s) for v, x in zip(invars, values) if (s := spec_of(x)) is not None)
    return found if any(is_sharded(s) for _, s in found) else ()


# -- the parameters each call reads -------------------------------------------------------

_KEY = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]|\.(\w+)")


def _names(path: str) -> list[str]:
    """A parameter's names in the root's first argument (``[0][0]['params']['Dense_0']['kernel']``
    -> ``['params', 'Dense_0', 'kernel']``), without a boxed variable's ``.value``."""
    names = [a or b or c for a, b, c in _KEY.findall(path)][2:]
    while names and names[-1] in ("value", "raw_value"):
        names.pop()
    return names


def _labels(paths: list[str]) -> list[str]:
    """Short names for the arguments one call reads: each path's last name, longer
    where two would read alike (``query/kernel``, ``value/kernel``)."""
    names = [_names(p) or [p] for p in paths]
    n = [1] * len(names)
    while True:
        labels = ["/".join(ns[-k:]) for ns, k in zip(names, n)]
        twice = {x for x in labels if labels.count(x) > 1}
        grow = [i for i, x in enumerate(labels) if x in twice and n[i] < len(names[i])]
        if not grow:
            return labels
        for i in grow:
            n[i] += 1


def call_specs(root: Mox) -> dict[int, str]:
    """``id(call)`` -> how the parameters it reads are laid out (``kernel=P(None,'model')
    bias=P('model')``), for the calls that read one that is sharded (`is_sharded`);
    empty for a root traced on arrays that are not.

    The parameters are the leaves of the root's first argument (the variables of
    ``model.apply``, an nnx state, an Equinox model, a wrapper's ``params``: the
    argument `yax.compare`'s ``new_params`` replaces). A call's are those its own
    equations read, like a closure (a Flax module's variables), as its inputs (an
    Equinox module's), or inside a nested computation (an ``nn.scan`` body reads a
    stacked parameter's slice: the stacked one's spec is shown). Cached per root."""
    return memo(root, "sharding.call_specs", lambda: _call_specs(root))


def _call_specs(root: Mox) -> dict[int, str]:
    own = {v: s for v, s in root.shardings}
    live = set(root.invars)
    paths = dict(zip(root.invars, root.in_paths))
    specs = {v: s for v, s in own.items() if v in live and paths.get(v, "").startswith("[0][0]")}
    out: dict[int, str] = {}
    if specs:
        for call, read in _reads(root, specs).items():
            if any(is_sharded(specs[v]) for v in read):
                labels = _labels([paths.get(v, "") for v in read])
                out[id(call)] = " ".join(f"{k}={spec_text(specs[v])}" for k, v in zip(labels, read))
    return out


def _reads(root: Mox, wanted: dict[Var, Any]) -> dict[Mox, list[Var]]:
    """Call node -> the ``wanted`` root vars its equations read, in the order first
    read; followed through call inputs and into nested computations (in the node
    index's order: `yax._calls.index`)."""
    alias: dict[Var, Var] = {v: v for v in wanted}
    reads: dict[Mox, dict[Var, None]] = {}

    def bind(formals: Sequence[Var], actuals: Sequence[Any]) -> None:
        for f, a in zip(formals, actuals):
            if isinstance(a, Var) and a in alias:
                alias[f] = alias[a]

    idx = index(root)
    for i, c in enumerate(idx.nodes):
        if isinstance(c, Mox):  # a call (or a nested computation, whose inputs are its own)
            bind(c.invars, c.inputs)
        elif c.subs:
            _into(c, bind)
        elif idx.callers[i] >= 0:
            owner = idx.nodes[idx.callers[i]]
            for a in c.inputs:
                if isinstance(a, Var) and a in alias:
                    reads.setdefault(owner, {})[alias[a]] = None  # type: ignore[arg-type]  # a caller is a call
    return {call: list(vs) for call, vs in reads.items()}


def _into(eqn: Equation, bind: Any) -> None:
    """Alias the parameters of the computations ``eqn`` holds to its inputs."""
    for _, _, pairs in formals(eqn):
        bind([f for f, _, _ in pairs], [a for _, a, _ in pairs])


# -- new variables ----------------------------------------------------------------------

def derived(name: str, shape: tuple[int, ...], refs: Sequence[tuple[str, Any, tuple[int, ...]]]) -> Any:
    """The sharding of a new variable ``name`` of ``shape`` that a rewrite adds
    where a layer had variables ``refs`` (``(name, sharding, shape)``): ``None``
    when none of those is laid out by a ``NamedSharding`` over several devices
    (the new one stays where it was made), else a ``NamedSharding`` on their mesh.

    Each axis takes the spec of a reference axis of the same size at the same
    place, counted from the front or from the back; references of the same name,
    then of the same rank, are asked first. So a LoRA adapter's ``lora_a``
    (inputs × rank) is split like its kernel's input axis and ``lora_b`` (rank ×
    outputs) like its output axis, a replacement's new ``kernel`` like the old
    one; an axis nothing matches (the rank) is not split, nor one a mesh axis
    already splits, nor one the mesh axes do not divide."""
    named = [(n, s, tuple(sh)) for n, s, sh in refs if isinstance(s, NamedSharding) and s.mesh.size > 1]
    if not named:
        return None
    mesh = named[0][1].mesh
    named = [r for r in named if r[1].mesh == mesh]
    order = sorted(named, key=lambda r: (r[0] != name, len(r[2]) != len(shape), -math.prod(r[2])))
    spec: list[Any] = [None] * len(shape)
    used: set[str] = set()
    for j, size in enumerate(shape):
        for _, s, sh in order:
            entries = list(s.spec) + [None] * (len(sh) - len(s.spec))
            back = j - len(shape) + len(sh)
            at = j if j < len(sh) and sh[j] == size else back if 0 <= back < len(sh) and sh[back] == size else None
            if at is None:
                continue
            e = entries[at]
            axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
            if axes and not (used & set(axes)) and size % math.prod(mesh.shape[a] for a in axes) == 0:
                spec[j] = e
                used.update(axes)
            break
    return NamedSharding(mesh, PartitionSpec(*spec))


# -- statistics reduced where the values are ----------------------------------------------------

def _value_sums(x: Any) -> tuple[Any, Any]:
    """``[min, max, mean, std]`` of the finite values of one array and the counts
    ``[finite, NaN, +Inf, -Inf, zeros]``, reduced on its devices: in float32, or in float64
    for float64 values (x64 on), which float32 would narrow (1e300 to +Inf). The mean and
    std are of values scaled by the largest |value|, so that no sum or square under- or
    overflows, and the mean is corrected by a second pass (the float32 sum's rounding).
    Subnormal values are read as 0 here: XLA flushes them in arithmetic and comparisons
    (`subnormal_count` says whether an array holds any)."""
    f = jnp.abs(x) if jnp.iscomplexobj(x) else x
    f = f.astype(jnp.promote_types(f.dtype, jnp.float32))
    fin = jnp.isfinite(f)
    n = fin.sum(dtype=jnp.int32)
    lo = jnp.min(jnp.where(fin, f, jnp.inf), initial=jnp.inf)
    hi = jnp.max(jnp.where(fin, f, -jnp.inf), initial=-jnp.inf)
    big = jnp.maximum(-lo, hi)
    big = jnp.where((n > 0) & (big > 0), big, 1.0)
    s = jnp.where(fin, f, 0.0) / big
    count = jnp.maximum(n, 1).astype(f.dtype)
    mean = s.sum() / count
    mean = mean + jnp.where(fin, s - mean, 0.0).sum() / count
    std = big * jnp.sqrt(jnp.where(fin, (s - mean) ** 2, 0.0).sum() / count)
    counts = [n, jnp.isnan(f).sum(dtype=jnp.int32), (f == jnp.inf).sum(dtype=jnp.int32),
              (f == -jnp.inf).sum(dtype=jnp.int32), (f == 0).sum(dtype=jnp.int32)]
    return jnp.stack([lo, hi, big * mean, std]), jnp.stack(counts)


def subnormal(x: Any) -> Any:
    """Where ``x`` holds a subnormal value (float32's below 1.2e-38), tested on its bits: XLA
    flushes such values to zero in arithmetic and comparisons, on CPU and GPU, so a
    reduction on the devices would read them as 0."""
    if jnp.iscomplexobj(x):
        return subnormal(jnp.real(x)) | subnormal(jnp.imag(x))
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.zeros(jnp.shape(x), bool)
    info = ml_dtypes.finfo(x.dtype)  # type: ignore[no-untyped-call]  # knows bfloat16 and float8; untyped
    u = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{info.bits}"))
    mantissa = (1 << info.nmant) - 1
    exponent = ((1 << info.nexp) - 1) << info.nmant
    return ((u & exponent) == 0) & ((u & mantissa) != 0)


#: How many subnormal values an array holds (`subnormal`), counted where it is.
subnormal_count = jax.jit(lambda x: subnormal(x).sum(dtype=jnp.int32))

#: `_value_sums`, jitted: compiled once per shape, dtype and sharding; only the nine numbers cross.
reduced_stats = jax.jit(_value_sums)
