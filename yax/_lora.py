"""What the frontends' LoRA adapters share (`yax.rewrite.lora` holds `yax.LoRA`, the description,
and `merge_lora`).

`LoRA` says what to do (rank, alpha) and knows no module system: for each
layer it replaces, the adapters its module system registered here
(`register_adapters`, one `Adapters` a system, in the style of JAX's per-pass rule
tables) build the adapter for that kind of layer: a linen layer linear in one
weight as a `LoRA` linen module running the layer itself with ``weight +
(lora_a @ lora_b) * alpha / rank``; nnx's ``Linear`` as ``nnx.LoRALinear``
with that scale, any other nnx layer linear in one weight as a `LoRA` nnx
module doing the same; Equinox's ``Linear`` as a ``LoRALinear``. `merge_lora`
asks the registered systems to fold their adapters back. A module system
(a frontend, or a plug-in for one) adds LoRA by registering here, in its own
files. What the adapters share lives here too: `contraction` reads from a
layer's jaxpr which axes of its weight meet the input.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._ir import Mox


@dataclasses.dataclass(frozen=True)
class Adapters:
    """One module system's LoRA: ``kinds``, the layer kinds it adapts as
    messages name them (``"Dense"``); ``make(node, spec)``, the module that
    adapts the layer ``node`` as ``spec`` (`yax.LoRA`: rank, alpha) says,
    starting exactly equal to it, or ``None`` for a kind it has no adapter
    for; ``merge(mox, params)``, ``(mox, params)`` with every adapter it made
    folded back into its layer, or ``None`` where ``mox`` holds none of them."""

    kinds: tuple[str, ...]
    make: Callable[[Mox, Any], Any]
    merge: Callable[[Mox, Any], tuple[Mox, Any] | None]


#: The LoRA adapters of each module system, by frontend name (`register_adapters`).
ADAPTERS: dict[str, Adapters] = {}


def register_adapters(system: str, adapters: Adapters) -> None:
    """Give the module system ``system`` (a frontend's name) its LoRA adapters."""
    ADAPTERS[system] = adapters


def weight_name(params: dict[str, Any]) -> str | None:
    """The parameter LoRA adapts among a layer's own (name -> array): ``kernel``, or else
    its one parameter of two or more axes (gemma's ``Einsum`` calls it ``w``); ``None``
    when there is none, or several."""
    if "kernel" in params:
        return "kernel"
    names = [k for k, v in params.items() if len(getattr(v, "shape", ())) >= 2]
    return names[0] if len(names) == 1 else None


def no_weight(params: dict[str, Any]) -> str:
    """Why `weight_name` found no weight among ``params``, for messages."""
    names = sorted(k for k, v in params.items() if len(getattr(v, "shape", ())) >= 2)
    if not names:
        return "no weight of two or more axes (only " + ", ".join(f"`{k}`" for k in sorted(params)) + ")"
    return "several weights (" + ", ".join(f"`{k}`" for k in names) + ") and none called `kernel`"


def abstract_inputs(node: Mox) -> list[Any]:
    """The call ``node``'s traced inputs as its module saw them (one instance's inside a
    mapping transform, `ModuleInfo.seen`), as ``jax.ShapeDtypeStruct``."""
    seen = node.info.seen[0] if node.info.seen is not None else [v.shape for v in node.inputs]
    return [jax.ShapeDtypeStruct(s, v.dtype) for s, v in zip(seen, node.inputs)]


#: Equations a weight may pass through on its way to the contraction: a dtype cast keeps its axes.
_CASTS = ("convert_element_type", "copy", "copy_p", "reduce_precision")


def contraction(apply: Callable[..., Any], weight: Any, *args: Any) -> tuple[int, ...] | str:
    """The axes of ``weight`` contracted with the input in ``apply(weight, *args)``
    (a layer, its weight and its inputs, all abstract), or why LoRA cannot adapt
    that weight: read from the jaxpr (`jax.make_jaxpr`), so any layer that is
    linear in one weight is adapted, whatever its type or einsum. The weight
    must reach exactly one ``dot_general`` (or an ungrouped convolution), through
    dtype casts and transposes only, and share no batch axis with the input.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> contraction(lambda w: jnp.einsum("btd,dnh->btnh", jnp.ones((1, 2, 4)), w),
      ...             jax.ShapeDtypeStruct((4, 2, 3), jnp.float32))
      (0,)
    """
    try:
        closed = jax.make_jaxpr(apply)(weight, *args)
    except Exception as e:  # the layer does not run on these arguments: say why, do not guess
        return f"a computation yax could not re-trace with a new weight ({type(e).__name__}: {e})"
    uses = _uses(closed.jaxpr, closed.jaxpr.invars[0], tuple(range(len(weight.shape))))
    other = [u[0].primitive.name for u in uses if u[1] < 0]
    if other:
        return f"a weight that goes through `{other[0]}`, not straight into a contraction with the input"
    if len(uses) != 1:
        return (f"a weight that reaches {len(uses)} contractions" if uses else
                "a weight that is not contracted with the input by one `dot_general` or convolution")
    eqn, operand, axes = uses[0]
    ndim = len(weight.shape)
    if eqn.primitive.name == "dot_general":
        (contract, batch) = (dims[operand] for dims in eqn.params["dimension_numbers"])
        if batch:
            return "a weight with batch axes shared with the input"
        found = tuple(sorted(axes[i] for i in contract))
    else:  # conv_general_dilated: the weight as its kernel, not grouped
        if operand != 1 or eqn.params["feature_group_count"] != 1 or eqn.params["batch_group_count"] != 1:
            return "a grouped convolution" if operand == 1 else "a weight convolved as the input"
        out_dim = eqn.params["dimension_numbers"].rhs_spec[0]
        found = tuple(sorted(axes[i] for i in range(ndim) if i != out_dim))
    return found if 0 < len(found) < ndim else "a weight whose axes are all contracted (no output axis)"


def _uses(jaxpr: Any, var: Any, axes: tuple[int, ...]) -> list[tuple[Any, int, tuple[int, ...]]]:
    """``(equation, operand, axes)`` for each contraction ``var`` reaches, ``axes[i]`` being
    the weight's axis at that operand's axis ``i``; anything else ``var`` reaches counts as a use
    that is no contraction (``(equation, -1, ())``), so LoRA refuses it."""
    out: list[tuple[Any, int, tuple[int, ...]]] = []
    for eqn in jaxpr.eqns:
        for i, v in enumerate(eqn.invars):
            if v is not var:
                continue
            name, inner = eqn.primitive.name, eqn.params.get("jaxpr")
            if name in ("dot_general", "conv_general_dilated"):
                out.append((eqn, i, axes))
            elif name in _CASTS:
                out += _uses(jaxpr, eqn.outvars[0], axes)
            elif name == "transpose":
                out += _uses(jaxpr, eqn.outvars[0], tuple(axes[p] for p in eqn.params["permutation"]))
            elif inner is not None and hasattr(inner, "jaxpr") and len(inner.jaxpr.invars) == len(eqn.invars):
                out += _uses(inner.jaxpr, inner.jaxpr.invars[i], axes)  # a nested `jit` (`jnp.einsum`)
            else:
                out.append((eqn, -1, ()))
    return out


def delta(kernel: jax.Array, a: jax.Array, b: jax.Array, in_axes: tuple[int, ...], scale: float) -> jax.Array:
    """``(a @ b) * scale`` laid out like ``kernel``: rows over ``in_axes``, columns over the others."""
    out_axes = tuple(i for i in range(kernel.ndim) if i not in in_axes)
    shape = [kernel.shape[i] for i in (*in_axes, *out_axes)]
    d = (a @ b).reshape(shape) * scale
    return jnp.transpose(d, tuple(sorted(range(kernel.ndim), key=lambda i: (*in_axes, *out_axes)[i])))


def first_a(key: Any, index: int, stack: tuple[int, ...], shape: tuple[int, ...], dtype: Any,
            rank: int) -> jax.Array:
    """The initial ``lora_a`` (of ``shape``, per layer) of the ``index``-th layer one `sub` adapts,
    drawn from ``key`` by the rule linen's initialiser follows (docs/rewrite.md): ``normal(1 / rank)``
    with ``fold_in(key, index)``, and for layers stacked along ``stack`` (a scan over layers, a
    mapped ensemble) one key per layer split from it. So different keys give different adapters, so
    do different layers, and the same key gives the same ones. The nnx and Equinox frontends, whose
    adapters come built, draw theirs with it; without a key, as with ``jax.random.key(0)``."""
    if key is None:
        key = jax.random.key(0)
    elif not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)  # a raw ``uint32[2]`` key
    a: jax.Array = _first_a(key, jnp.uint32(index), tuple(stack), tuple(shape), jnp.dtype(dtype), rank)
    return a


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _first_a(key: Any, index: jax.Array, stack: tuple[int, ...], shape: tuple[int, ...], dtype: Any,
             rank: int) -> jax.Array:
    def one(k: Any) -> jax.Array:
        return jax.random.normal(k, shape, dtype) * (1.0 / rank)  # `initializers.normal(1 / rank)`

    key = jax.random.fold_in(key, index)
    if not stack:
        return one(key)
    draw = one
    for _ in stack:
        draw = jax.vmap(draw)
    return draw(jax.random.split(key, math.prod(stack)).reshape(stack))
