"""LoRA for linen layers (`LinenFrontend.lora`, `LinenFrontend.merge_lora`).

`LoRA` adapts a layer that is linear in its ``kernel`` without knowing its
math: it runs the replaced layer itself (rebuilt from the node's fields) with
``kernel + (lora_a @ lora_b) * alpha / rank``, the low-rank update laid out
over the kernel's input and output axes (`yax._lora.delta`). Since
``lora_b`` starts at zero the adapted model starts exactly equal to the
original, whatever the layer's dtype, precision or contraction. A layer kind
is adapted when `KERNEL_AXES` says which of its kernel's axes meet the input.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from ..._ir import Mox
from ..._lora import delta
from ...errors import YaxRewriteError


def _dense_general(m: Any, kernel_ndim: int) -> tuple[int, ...] | None:
    if m.batch_dims:
        return None
    return tuple(range(len(m.axis) if isinstance(m.axis, (tuple, list)) else 1))


def _einsum(m: Any, kernel_ndim: int) -> tuple[int, ...] | None:
    if not isinstance(m.einsum_str, str):
        return None
    lhs, _ = m.einsum_str.replace(" ", "").split("->")
    x_spec, k_spec = lhs.split(",")
    axes = tuple(i for i, c in enumerate(k_spec) if c in x_spec)
    return axes if 0 < len(axes) < kernel_ndim else None


#: Layer type -> ``axes(module, kernel_ndim)``: the kernel axes contracted with
#: the input (the rest are output axes), or ``None`` for a configuration whose
#: math LoRA does not know. Adding a kind of layer is one entry.
KERNEL_AXES: dict[type, Callable[[Any, int], tuple[int, ...] | None]] = {
    nn.Dense: lambda m, n: (0,),
    nn.DenseGeneral: _dense_general,
    nn.Einsum: _einsum,
}


def kernel_axes(module: Any, kernel_ndim: int) -> tuple[int, ...] | None:
    """The kernel axes of ``module`` contracted with the input, or ``None``."""
    axes = KERNEL_AXES.get(type(module))
    return axes(module, kernel_ndim) if axes is not None else None


class LoRA(nn.Module):
    """A low-rank adapter around a linen layer (`KERNEL_AXES`): the layer's own
    computation with ``kernel + (lora_a @ lora_b) * alpha / rank``. What
    ``yax.sub(pattern, yax.LoRA(rank=4), mox, params=, key=)`` puts in place of
    each linen layer it adapts; the layer's variables keep their names, so
    `sub` keeps their values."""

    rank: int = 4
    alpha: float = 4.0
    base: Callable[..., nn.Module] | None = None  #: builds the adapted layer (filled by `sub`)

    #: the adapted layer runs as part of this call: one node, as the layer was
    __yax_inline__ = True

    @nn.compact
    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if self.base is None:
            raise ValueError("LoRA needs `base` (filled in by `yax.sub` from the layer it replaces).")
        layer = self.base(parent=None)
        shapes = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, *args, **kwargs))["params"]
        own = {name: self.param(name, lambda key, name=name: layer.init(key, x, *args, **kwargs)["params"][name])
               for name in shapes}
        kernel = own["kernel"]
        in_axes = kernel_axes(layer, kernel.ndim)
        if in_axes is None:
            raise ValueError(f"LoRA does not know the kernel's input axes in `{type(layer).__name__}`.")
        n_in = math.prod(kernel.shape[i] for i in in_axes)
        n_out = kernel.size // n_in
        a = self.param("lora_a", nn.initializers.normal(1.0 / self.rank), (n_in, self.rank), kernel.dtype)
        b = self.param("lora_b", nn.initializers.zeros, (self.rank, n_out), kernel.dtype)
        adapted = {**own, "kernel": kernel + delta(kernel, a, b, in_axes, self.alpha / self.rank)}
        return layer.apply({"params": adapted}, x, *args, **kwargs)


def adapter(node: Mox, rank: int, alpha: float) -> LoRA | None:
    """The `LoRA` for the linen layer ``node``, or ``None`` for a layer it does not know."""
    from . import frontend

    t = node.module_type
    if t not in KERNEL_AXES:
        return None
    base: nn.Module = frontend.rebuild(node)
    if kernel_axes(base, 2 if not isinstance(base, nn.Einsum) else len(base.shape)) is None:
        return None
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
              if f.init and f.name not in ("parent", "name")}
    held = {np.dtype(x.dtype) for x in jax.tree_util.tree_leaves((node.var_tree or {}).get("params", {}))}
    if "param_dtype" in fields and len(held) == 1 and held != {np.dtype(fields["param_dtype"])}:
        # the layer's parameters as the model holds them (cast to bfloat16 after loading, say), not
        # as its class declares them: the kernel is kept as it is, and the adapters take its type
        fields["param_dtype"] = held.pop().type
    return LoRA(rank=rank, alpha=alpha, base=functools.partial(type(base), **fields), parent=None)


def merge(mox: Mox, params: Any) -> tuple[Mox, Any] | None:
    """Every `LoRA` of ``mox`` folded back into the layer it adapts, or ``None`` when there is none."""
    from ...rewrite import sub
    from . import DictVariables, _get, _put

    nodes = [n for n in mox.modules() if n.module_type is LoRA]
    if not nodes:
        return None
    if params is None:
        raise YaxRewriteError("`merge_lora` folds the adapters' trained values into the layers: pass the "
                              "parameters (`yax.merge_lora(mox, params)`).")
    layout = DictVariables(mox, params)
    merged = params
    once = {n.scope: n for n in reversed(nodes)}  # a layer called twice (shared weights) is merged once
    for n in once.values():
        keys = layout._keys("params", n.scope)
        assert keys is not None  # the params collection always has a place
        p = _get(merged, keys)
        layer = n.attrs["base"](parent=None)
        n_stack = p["lora_a"].ndim - 2  # layers (`nn.scan`) and instances (`nn.vmap`) lead each leaf
        in_axes = kernel_axes(layer, p["kernel"].ndim - n_stack)
        assert in_axes is not None  # `adapter` made this LoRA only for a layout it knows
        d = functools.partial(delta, in_axes=in_axes, scale=n.attrs["alpha"] / n.attrs["rank"])
        for _ in range(n_stack):
            d = jax.vmap(d)
        kernel = p["kernel"] + d(p["kernel"], p["lora_a"], p["lora_b"])
        merged = _put(merged, (*keys, "kernel"), kernel.astype(p["kernel"].dtype))

    def layer_of(path: str, node: Mox) -> Any:
        return node.attrs["base"](parent=None)

    out: tuple[Mox, Any] = sub(nodes, layer_of, mox, params=merged)
    return out
