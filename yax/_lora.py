"""A LoRA adapter for `sub` and merging it back.

`LoRA` adapts a layer that is linear in its ``kernel`` without knowing its
math: it runs the replaced layer itself (rebuilt from the node's fields) with
``kernel + (lora_a @ lora_b) * alpha / rank``, the low-rank update laid out
over the kernel's input and output axes. Since ``lora_b`` starts at zero the
adapted model starts exactly equal to the original, whatever the layer's
dtype, precision or contraction.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ._ir import Mox
from .errors import YaxRewriteError, where
from .rewrite import sub

#: The layers `LoRA` adapts, by how their kernel's axes split into input and output.
SUPPORTED = ("Dense", "DenseGeneral", "Einsum", "nnx Linear")


def _kernel_axes(module: Any, kernel_ndim: int) -> tuple[int, ...] | None:
    """The kernel axes contracted with the input (the rest are output axes),
    or ``None`` for a layer whose math `LoRA` does not know."""
    if isinstance(module, nn.DenseGeneral):
        if module.batch_dims:
            return None
        n_in = len(module.axis) if isinstance(module.axis, (tuple, list)) else 1
        return tuple(range(n_in))
    if isinstance(module, nn.Dense):
        return (0,)
    if isinstance(module, nn.Einsum) and isinstance(module.einsum_str, str):
        lhs, _ = module.einsum_str.replace(" ", "").split("->")
        x_spec, k_spec = lhs.split(",")
        axes = tuple(i for i, c in enumerate(k_spec) if c in x_spec)
        return axes if 0 < len(axes) < kernel_ndim else None
    return None


def _refusal(node: Mox) -> YaxRewriteError:
    return YaxRewriteError(
        f"`yax.LoRA` adapts {', '.join(SUPPORTED)} layers, whose math it knows, but {where(node)} is a "
        f"`{node.type}`. Write an adapter for that layer and pass it to `yax.sub`."
    )


def _delta(kernel: jax.Array, a: jax.Array, b: jax.Array, in_axes: tuple[int, ...], scale: float) -> jax.Array:
    """``(a @ b) * scale`` laid out like ``kernel``: rows over ``in_axes``, columns over the others."""
    out_axes = tuple(i for i in range(kernel.ndim) if i not in in_axes)
    shape = [kernel.shape[i] for i in (*in_axes, *out_axes)]
    d = (a @ b).reshape(shape) * scale
    return jnp.transpose(d, tuple(sorted(range(kernel.ndim), key=lambda i: (*in_axes, *out_axes)[i])))


class LoRA(nn.Module):
    """A low-rank adapter around a ``Dense``, ``DenseGeneral`` or ``Einsum``
    layer: the layer's own computation with ``kernel + (lora_a @ lora_b) *
    alpha / rank``.

    ``yax.sub(pattern, yax.LoRA(rank=4), mox, params=, key=)`` fills ``base``
    from each layer it replaces (refusing layers whose math it does not know,
    such as GPT-2's ``FlaxConv1D``); the layer's variables keep their names,
    so `sub` keeps their values, and ``lora_b`` starts at zero, so the adapted
    model starts exactly equal to the original. On an nnx model it becomes
    ``nnx.LoRALinear`` for each ``nnx.Linear``. Train only ``lora_a``/``lora_b``
    (`yax.lora_mask`), then fold them back with `yax.merge_lora`.
    """

    rank: int = 4
    alpha: float = 4.0
    base: Callable[..., nn.Module] | None = None  #: builds the adapted layer (filled by `sub`)

    #: the adapted layer runs as part of this call: one node, as the layer was
    __yax_inline__ = True

    @nn.nowrap
    def __yax_fill__(self, node: Any) -> Any:
        """This adapter for the layer ``node`` called (see `yax.sub`)."""
        if self.base is not None:
            return self
        if not isinstance(node, Mox) or node.module_type is None:
            raise _refusal(node) if isinstance(node, Mox) else YaxRewriteError(
                f"`yax.LoRA` adapts layers, but {where(node)} is an equation.")
        if node.info.frontend == "nnx":
            return _nnx_lora(node, self.rank)
        from .frontends.linen import module_of

        base = module_of(node)
        if _kernel_axes(base, 2 if not isinstance(base, nn.Einsum) else len(base.shape)) is None:
            raise _refusal(node)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                  if f.init and f.name not in ("parent", "name")}
        return self.clone(base=functools.partial(type(base), **fields))

    @nn.compact
    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if self.base is None:
            raise ValueError("LoRA needs `base` (filled in by `yax.sub` from the layer it replaces).")
        layer = self.base(parent=None)
        shapes = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, *args, **kwargs))["params"]
        own = {name: self.param(name, lambda key, name=name: layer.init(key, x, *args, **kwargs)["params"][name])
               for name in shapes}
        kernel = own["kernel"]
        in_axes = _kernel_axes(layer, kernel.ndim)
        n_in = math.prod(kernel.shape[i] for i in in_axes)
        n_out = kernel.size // n_in
        a = self.param("lora_a", nn.initializers.normal(1.0 / self.rank), (n_in, self.rank), kernel.dtype)
        b = self.param("lora_b", nn.initializers.zeros, (self.rank, n_out), kernel.dtype)
        adapted = {**own, "kernel": kernel + _delta(kernel, a, b, in_axes, self.alpha / self.rank)}
        return layer.apply({"params": adapted}, x, *args, **kwargs)


def _nnx_lora(node: Mox, rank: int) -> Any:
    from flax import nnx

    if node.module_type is not nnx.Linear:
        raise _refusal(node)
    a = node.attrs
    return nnx.LoRALinear(a["in_features"], a["out_features"], lora_rank=rank, use_bias=a.get("use_bias", True),
                          dtype=a.get("dtype"), param_dtype=a.get("param_dtype", jnp.float32),
                          precision=a.get("precision"), rngs=nnx.Rngs(0))


def lora_mask(params: Any) -> Any:
    """A pytree of booleans like ``params``: True for ``lora_a``/``lora_b``
    leaves, for ``optax.masked`` or ``optax.multi_transform``."""
    def names(kp: Any) -> set:  # an nnx state's leaf path ends in its variable's `.value`
        return {getattr(k, "key", None) for k in kp[-2:]}

    return jax.tree_util.tree_map_with_path(lambda kp, _: bool(names(kp) & {"lora_a", "lora_b"}), params)


def merge_lora(mox: Mox, params: Any) -> tuple[Mox, Any]:
    """Fold every `LoRA` adapter of ``mox`` back into the layer it adapts
    (``kernel + lora_a @ lora_b * alpha / rank``); returns the new MoX and
    parameters (in the layout given), which compute the same function."""
    from .frontends.linen import DictVariables, _get, _put

    if mox.frontend == "nnx":
        return _merge_nnx(mox, params)
    nodes = [n for n in mox.modules() if n.module_type is LoRA]
    if not nodes:
        raise YaxRewriteError("`merge_lora` found no LoRA module calls in this MoX; nothing to merge.")
    layout = DictVariables(mox, params)
    merged = params
    once = {n.scope: n for n in reversed(nodes)}  # a layer called twice (shared weights) is merged once
    for n in once.values():
        keys = layout._keys("params", n.scope)
        p = _get(merged, keys)
        layer = n.attrs["base"](parent=None)
        n_stack = p["lora_a"].ndim - 2  # layers (`nn.scan`) and instances (`nn.vmap`) lead each leaf
        in_axes = _kernel_axes(layer, p["kernel"].ndim - n_stack)
        delta = functools.partial(_delta, in_axes=in_axes, scale=n.attrs["alpha"] / n.attrs["rank"])
        for _ in range(n_stack):
            delta = jax.vmap(delta)
        kernel = p["kernel"] + delta(p["kernel"], p["lora_a"], p["lora_b"])
        merged = _put(merged, (*keys, "kernel"), kernel.astype(p["kernel"].dtype))

    def layer_of(path: str, node: Mox) -> Any:
        return node.attrs["base"](parent=None)

    return sub(nodes, layer_of, mox, params=merged)


def _merge_nnx(mox: Mox, state: Any) -> tuple[Mox, Any]:
    """`merge_lora` on an nnx MoX: each ``nnx.LoRALinear`` becomes the
    ``nnx.Linear`` it adapts, with ``kernel + lora_a @ lora_b`` (per layer,
    when stacked by ``nnx.vmap``/``nnx.scan``)."""
    from flax import nnx

    from .frontends.nnx._state import flat_state

    nodes = [n for n in mox.modules() if n.module_type is nnx.LoRALinear]
    if not nodes:
        raise YaxRewriteError("`merge_lora` found no `nnx.LoRALinear` calls in this MoX; nothing to merge.")
    flat = flat_state(state)
    at = {p: x for p, _, x in flat}
    merged = dict(at)
    for scope in {n.scope for n in nodes}:
        kernel = at[(*scope, "kernel")]
        delta = jnp.matmul(at[(*scope, "lora", "lora_a")], at[(*scope, "lora", "lora_b")])
        merged[(*scope, "kernel")] = (kernel + delta).astype(kernel.dtype)
    merged_state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), [merged[p] for p, _, _ in flat])

    def linear_of(path: str, node: Mox) -> Any:
        a = node.attrs
        return nnx.Linear(a["in_features"], a["out_features"], use_bias=a.get("use_bias", True),
                          dtype=a.get("dtype"), param_dtype=a.get("param_dtype", jnp.float32),
                          precision=a.get("precision"), rngs=nnx.Rngs(0))

    return sub(nodes, linear_of, mox, params=merged_state)
