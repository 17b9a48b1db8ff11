"""LoRA for `sub`, and merging it back: a description here, the adapters in
the frontends.

`LoRA` says what to do (rank, alpha) and knows no module system: for each
layer it replaces, the layer's frontend builds the adapter for that kind of
layer (`Frontend.lora`: linen's ``Dense``/``DenseGeneral``/``Einsum`` as a
`LoRA` linen module running the layer itself with ``kernel + (lora_a @
lora_b) * alpha / rank``; nnx's ``Linear`` as ``nnx.LoRALinear`` with that
scale, its
``LinearGeneral``/``Einsum``/``Conv`` as a `LoRA` nnx module doing the
same), and `merge_lora` asks the frontends to fold their adapters back
(`Frontend.merge_lora`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from . import frontends
from ._check import check_if_enabled
from ._ir import Mox
from .errors import YaxRewriteError, where


@dataclasses.dataclass(frozen=True)
class LoRA:
    """A low-rank adapter for every layer a `sub` matches: the layer's own
    computation with its weight plus ``(lora_a @ lora_b) * alpha / rank``.

    ``yax.sub(pattern, yax.LoRA(rank=4), mox, params=, key=)`` builds, for each
    layer it replaces, its module system's adapter for that kind of layer
    (linen ``Dense``, ``DenseGeneral``, ``Einsum``: yax's own ``LoRA`` module;
    nnx ``Linear``: ``nnx.LoRALinear`` with the ``alpha / rank`` scale; nnx
    ``LinearGeneral``, ``Einsum``, ``Conv``: yax's own nnx ``LoRA`` module;
    ``eqx.nn.Linear``: yax's ``LoRALinear``), refusing layers whose math it
    does not know (GPT-2's ``FlaxConv1D``, a grouped ``Conv``); the layer's
    weights keep their values and ``lora_b`` starts at zero, so the adapted
    model starts exactly equal to the original. ``lora_a`` is drawn from
    ``key``, folded with the layer's index among those the `sub` adapts (and
    split per layer of a scanned stack): other keys, other adapters; every
    layer its own; the same key, the same ones (`first_a`). Train only
    ``lora_a``/``lora_b`` (`yax.lora_mask`), then fold them back with
    `yax.merge_lora`.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3); x = jnp.ones((2, 4)); v = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(v, x)
      >>> new, nv = yax.sub("//module_call", yax.LoRA(rank=2), mox, params=v, key=jax.random.key(1))
      >>> sorted(nv["params"]), bool((yax.eval_mox(new, nv, x) == m.apply(v, x)).all())
      (['bias', 'kernel', 'lora_a', 'lora_b'], True)
    """

    rank: int = 4
    alpha: float = 4.0

    def __yax_fill__(self, node: Any) -> Any:
        """The adapter for the layer ``node`` called (see `yax.sub`)."""
        if not isinstance(node, Mox) or node.module_type is None:
            raise YaxRewriteError(f"`yax.LoRA` adapts layers, but {where(node)} is "
                                  f"{'an equation' if not isinstance(node, Mox) else f'a `{node.kind}`'}.")
        fe = frontends.of_node(node)
        adapter = fe.lora(node, self)
        if adapter is None:
            kinds = ", ".join(f"`{k}`" for k in fe.lora_kinds)
            knows = f"{fe.name}'s {kinds} layers, whose math it knows" if kinds else "no layers of " + (
                f"`{fe.name}`" if fe.name else "this module system")
            raise YaxRewriteError(
                f"`yax.LoRA` adapts {knows}, but {where(node)} is a `{node.type}`. Write an adapter for that "
                "layer (a module computing the layer plus a low-rank update) and pass it to `yax.sub`."
            )
        return adapter


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


def lora_mask(params: Any) -> Any:
    """A pytree of booleans like ``params``: True for ``lora_a``/``lora_b``
    leaves, for ``optax.masked`` or ``optax.multi_transform``."""
    def names(kp: Any) -> set[Any]:  # an nnx state's leaf path ends in its variable's `.value`
        return {getattr(k, "key", getattr(k, "name", None)) for k in kp[-2:]}

    return jax.tree_util.tree_map_with_path(lambda kp, _: bool(names(kp) & {"lora_a", "lora_b"}), params)


def merge_lora(mox: Mox, params: Any) -> tuple[Mox, Any]:
    """Fold every adapter `yax.LoRA` put in ``mox`` back into the layer it
    adapts (``kernel + lora_a @ lora_b * alpha / rank``); returns the new MoX
    and parameters (in the layout given), which compute the same function."""
    found = frontends.first_answer(mox, lambda f: f.merge_lora(mox, params))
    if found is None:
        raise YaxRewriteError("`merge_lora` found no LoRA adapters in this MoX; nothing to merge.")
    from .rewrite.shard import kept_layout

    return check_if_enabled(kept_layout(mox, found[0], params, found[1]))  # a merged kernel keeps the kernel's sharding
