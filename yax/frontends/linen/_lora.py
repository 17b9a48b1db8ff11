"""LoRA for linen layers (registered in `yax._lora.ADAPTERS` at the end).

`LoRA` adapts any layer that is linear in one weight (its ``kernel``, or its
only parameter of two or more axes) without knowing its math: it runs the
replaced layer itself (rebuilt from the node's fields) with ``weight +
(lora_a @ lora_b) * alpha / rank``, the low-rank update laid out over the
weight's input and output axes (`yax._lora.delta`). Which axes meet the input
is read from the layer's own jaxpr (`yax._lora.contraction`), so a ``Dense``,
an ``Einsum``, gemma's ``Einsum`` or GPT-2's transposed ``FlaxConv1D`` are one
case. Since ``lora_b`` starts at zero the adapted model starts exactly equal
to the original, whatever the layer's dtype, precision or contraction.
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
import numpy as np

from ..._ir import Mox
from ..._lora import Adapters, abstract_inputs, contraction, delta, no_weight, register_adapters, weight_name
from ...errors import CannotAdapt, NeedsParams, ParamDtypeDiffers
from .._protocol import engine


class LoRA(nn.Module):
    """A low-rank adapter around a linen layer linear in one weight: the layer's
    own computation with ``weight + (lora_a @ lora_b) * alpha / rank``. What
    ``yax.sub(pattern, yax.LoRA(rank=4), mox, params=, key=)`` puts in place of
    each linen layer it adapts; the layer's variables keep their names, so
    `sub` keeps their values."""

    rank: int = 4
    alpha: float = 4.0
    base: Callable[..., nn.Module] | None = None  #: builds the adapted layer (filled by `sub`)
    weight: str = "kernel"  #: the adapted parameter
    in_axes: tuple[int, ...] = (0,)  #: its axes contracted with the input (`yax._lora.contraction`)
    held_dtype: Any = None  #: the dtype the model holds the layer's parameters in, where its class has no field for it

    #: the adapted layer runs as part of this call: one node, as the layer was
    __yax_inline__ = True
    #: what yax worked out about the layer, not shown on its row (`yax._print.shown_attrs`)
    __yax_internal__ = ("weight", "in_axes", "held_dtype")

    @nn.compact
    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if self.base is None:
            raise ValueError("LoRA needs `base` (filled in by `yax.sub` from the layer it replaces).")
        layer = self.base(parent=None)
        shapes = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, *args, **kwargs))["params"]
        # the shape is passed (and ignored) for libraries that wrap `nn.Module.param` to require it (gemma)
        own = {name: self.param(name, lambda key, *_, name=name: layer.init(key, x, *args, **kwargs)["params"][name],
                                shapes[name].shape) for name in shapes}
        if self.held_dtype is not None:
            own = {k: v.astype(self.held_dtype) for k, v in own.items()}
        kernel = own[self.weight]
        n_in = math.prod(kernel.shape[i] for i in self.in_axes)
        n_out = kernel.size // n_in
        a = self.param("lora_a", nn.initializers.normal(1.0 / self.rank), (n_in, self.rank), kernel.dtype)
        b = self.param("lora_b", nn.initializers.zeros, (self.rank, n_out), kernel.dtype)
        adapted = {**own, self.weight: kernel + delta(kernel, a, b, self.in_axes, self.alpha / self.rank)}
        return layer.apply({"params": adapted}, x, *args, **kwargs)


def adapter(node: Mox, rank: int, alpha: float) -> LoRA | None:
    """The `LoRA` for the linen layer ``node``, or ``None`` for a module without
    parameters; raises, saying why, for a layer that is not linear in one weight."""
    from . import frontend

    params = dict((node.var_tree or {}).get("params", {}))
    if not params:
        return None  # no weight: not a layer
    base: nn.Module = frontend.rebuild(node)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
              if f.init and f.name not in ("parent", "name")}
    # the layer's parameters as the model holds them (cast to bfloat16 after loading, say), not as its
    # class declares them: the kernel is kept as it is, and the adapters take its type
    held = {np.dtype(x.dtype) for x in jax.tree_util.tree_leaves(params)}
    held_dtype = held.pop().type if len(held) == 1 else None
    if "param_dtype" in fields and held_dtype is not None:
        if np.dtype(held_dtype) != np.dtype(fields["param_dtype"]):
            fields["param_dtype"] = held_dtype
            base = type(base)(**fields)
        held_dtype = None
    own = _own(node, base)
    if not isinstance(own, str):
        own = {k: v for k, v in own.items() if not isinstance(v, dict)}
        if not own:
            return None  # its parameters all live in submodules: a block, not a layer
    name = weight_name(own) if not isinstance(own, str) else None
    if isinstance(own, str) or {np.dtype(v.dtype) for v in own.values()} == {np.dtype(held_dtype)}:
        held_dtype = None  # the layer makes its parameters in the type the model holds them
    axes = own if isinstance(own, str) else _axes(node, base, own, name) if name else no_weight(own)
    if not isinstance(own, str) and set(params) - set(own):
        axes = (f"its variables in a scope it shares with other variables ({', '.join(sorted(set(params) - set(own)))}; "
                "`nn.share_scope`), where an adapter's `lora_a`/`lora_b` would meet the other layer's")
    if isinstance(axes, str):
        raise CannotAdapt(node, "a layer linear in one weight", f"has {axes}")
    assert name is not None
    return LoRA(rank=rank, alpha=alpha, base=functools.partial(type(base), **fields), weight=name, in_axes=axes,
                held_dtype=held_dtype, parent=None)


def _own(node: Mox, base: nn.Module) -> dict[str, Any] | str:
    """The parameters the layer makes itself, abstract (one layer's: a scanned layer's leaves carry
    more axes in front), or why it cannot be run again."""
    def init(inputs: list[Any]) -> Any:
        args, kwargs = node.sig.args(inputs)
        return base.init(jax.random.key(0), *args, **kwargs).get("params", {})

    try:
        return dict(jax.eval_shape(init, abstract_inputs(node)))
    except Exception as e:
        return f"a computation yax could not re-trace ({type(e).__name__}: {e})"


def _axes(node: Mox, base: nn.Module, own: dict[str, Any], name: str) -> tuple[int, ...] | str:
    """The axes of the layer's weight ``name`` contracted with its input, as the node called it."""
    def apply(w: Any, inputs: list[Any]) -> Any:
        args, kwargs = node.sig.args(inputs)
        fixed = {k: jnp.zeros(v.shape, v.dtype) for k, v in own.items() if k != name}
        return base.apply({"params": {**fixed, name: w}}, *args, **kwargs)

    return contraction(apply, own[name], abstract_inputs(node))


def merge(mox: Mox, params: Any) -> tuple[Mox, Any] | None:
    """Every `LoRA` of ``mox`` folded back into the layer it adapts, or ``None`` when there is none."""
    sub = engine.sub
    from . import DictVariables, _get, _put

    nodes = [n for n in mox.modules() if n.module_type is LoRA]
    if not nodes:
        return None
    if params is None:
        raise NeedsParams("`merge_lora` folds the adapters' trained values into the layers: pass the "
                          "parameters (`yax.merge_lora(mox, params)`).", "merge_lora")
    odd = next((n for n in nodes if n.attrs["held_dtype"] is not None), None)
    if odd is not None:
        layer = odd.attrs["base"].func
        raise ParamDtypeDiffers("merge", f"{layer.__module__}.{layer.__qualname__}", odd.path,
                                np.dtype(odd.attrs["held_dtype"]).name, node=odd)
    layout = DictVariables(mox, params)
    merged = params
    once = {n.scope: n for n in reversed(nodes)}  # a layer called twice (shared weights) is merged once
    for n in once.values():
        keys = layout._keys("params", n.scope)
        assert keys is not None  # the params collection always has a place
        p = _get(merged, keys)
        w = n.attrs["weight"]
        n_stack = p["lora_a"].ndim - 2  # layers (`nn.scan`) and instances (`nn.vmap`) lead each leaf
        d = functools.partial(delta, in_axes=n.attrs["in_axes"], scale=n.attrs["alpha"] / n.attrs["rank"])
        for _ in range(n_stack):
            d = jax.vmap(d)
        kernel = p[w] + d(p[w], p["lora_a"], p["lora_b"])
        merged = _put(merged, (*keys, w), kernel.astype(p[w].dtype))

    def layer_of(path: str, node: Mox) -> Any:
        return node.attrs["base"](parent=None)

    out: tuple[Mox, Any] = sub(nodes, layer_of, mox, params=merged)
    return out


register_adapters("linen", Adapters(kinds=("Dense", "DenseGeneral", "Einsum", "Conv"),  # and any other layer linear in one weight
                           make=lambda node, spec: adapter(node, spec.rank, spec.alpha), merge=merge))
