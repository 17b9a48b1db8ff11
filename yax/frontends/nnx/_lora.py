"""LoRA for nnx layers (registered in `yax._lora.ADAPTERS` at the end).

``nnx.Linear`` becomes `LoRALinear`: nnx's own ``nnx.LoRALinear`` (its state
laid out the same) with LoRA's scale, ``(x @ lora_a @ lora_b) * alpha / rank``,
which nnx's leaves out. Every other layer kind
that is linear in its ``kernel`` and whose kernel's input axes `KERNEL_AXES`
knows (``LinearGeneral``, ``Einsum``, ``Conv``) becomes yax's `LoRA`
adapter, which, like the linen frontend's, runs the layer itself with
``kernel + (lora_a @ lora_b) * alpha / rank``, the low-rank update laid out
over the kernel's input and output axes (`yax._lora.delta`): the layer's own
math (dtype, precision, padding, strides, its einsum) is kept, and since
``lora_b`` starts at zero the adapter starts exactly equal to the layer.

How `LoRA` runs the layer without being it: it holds the layer's variables
where the layer held them (``kernel``, ``bias`` as ``nnx.Param`` at the
layer's attribute path, so `sub` keeps their values), ``lora_a``/``lora_b``
(``nnx.LoRAParam``) beside them, and the layer's graphdef without values
(``nnx.split`` of the layer rebuilt from the node's fields). Each call merges
that graphdef with the adapted kernel, a layer object that lives for the
call (nothing is mutated, so this works inside jax traces and nnx
transforms), and runs the layer class's own ``__call__`` on it, not the one
yax wraps while tracing, so the adapter is one node, as the layer was.

Adapters come built, with their own values; `sub` keeps the layer's and
draws each adapter's ``lora_a`` from its ``key`` (`drawn`), by linen's rule:
folded with the layer's index, split per stacked layer.

Each adapter type `merge` folds back is one `Folding`: where it holds
``lora_a``/``lora_b``, how they fold into the kernel, and the layer to
rebuild.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..._ir import Mox
from ..._lora import (
    Adapters,
    abstract_inputs,
    contraction,
    delta,
    first_a,
    no_weight,
    register_adapters,
    weight_name,
)
from ...errors import CannotAdapt
from .._protocol import engine
from ._base import NAME, flax_nnx
from ._rebuild import builder


def _conv(a: dict[str, Any], ndim: int) -> tuple[int, ...] | str:
    if a.get("feature_group_count", 1) != 1:
        return f"`feature_group_count={a['feature_group_count']}` (a grouped convolution)"
    return tuple(range(ndim - 1))  # (*kernel_size, in_features) -> out_features


def _linear_general(a: dict[str, Any], ndim: int) -> tuple[int, ...] | str:
    n_in = len(a["in_features"])
    if ndim != n_in + len(a["out_features"]):  # `batch_axis` leads the kernel (not a recorded field)
        return "batch axes (`batch_axis`)"
    return tuple(range(n_in))


def _einsum(a: dict[str, Any], ndim: int) -> tuple[int, ...] | str:
    spec = a.get("einsum_str")
    if not isinstance(spec, str):
        return "no `einsum_str`"
    lhs, _ = spec.replace(" ", "").split("->")
    x_spec, k_spec = lhs.split(",")
    axes = tuple(i for i, c in enumerate(k_spec) if c in x_spec)
    return axes if 0 < len(axes) < ndim else f"`einsum_str={spec!r}`, whose kernel axes are not all inputs or outputs"


def _kernel_axes() -> dict[type, Callable[[dict[str, Any], int], tuple[int, ...] | str]]:
    nnx = flax_nnx()
    return {nnx.LinearGeneral: _linear_general, nnx.Einsum: _einsum, nnx.Conv: _conv}


#: Layer type -> ``axes(layer fields, kernel ndim)``: the kernel axes contracted
#: with the input (the rest are output axes), or why LoRA does not know the
#: math of that configuration. Adding a kind of layer is one entry. Filled on
#: first use (flax.nnx is imported lazily).
KERNEL_AXES: dict[type, Callable[[dict[str, Any], int], tuple[int, ...] | str]] = {}

#: The layer kinds LoRA adapts, as messages name them.
KINDS = ("Linear", "LinearGeneral", "Einsum", "Conv")


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A method's own function, not the one `._trace` wraps it with while yax traces."""
    return getattr(fn, "__yax_method__", fn)


@functools.cache
def lora_type() -> type:
    """The `LoRA` nnx module type (defined on first use: flax.nnx is imported lazily)."""
    nnx = flax_nnx()
    module: Any = nnx.Module

    class LoRA(module):  # type: ignore[misc]  # nnx is imported lazily: its types are `Any` here
        """A low-rank adapter around an nnx layer (`KERNEL_AXES`): the layer's own
        computation with ``kernel + (lora_a @ lora_b) * alpha / rank``. What
        ``yax.sub(pattern, yax.LoRA(rank=4), mox, params=state)`` puts in place
        of each ``LinearGeneral``, ``Einsum`` and ``Conv`` it adapts."""

        #: what yax worked out about the layer, not shown on its row (`yax._print.shown_attrs`)
        __yax_internal__ = ("adapts", "in_axes")

        def __init__(self, base: Callable[..., Any], in_axes: tuple[int, ...], rank: int, alpha: float, *,
                     rngs: Any, weight: str = "kernel"):
            self.base = base          # builds the adapted layer (``base(rngs=…)``), for `merge`
            self.in_axes = in_axes    # the weight's axes that meet the input
            self.adapts = weight      # the adapted variable: ``kernel``, or a custom layer's one weight
            self.rank, self.alpha = rank, alpha
            self._layer, own = nnx.split(base(rngs=nnx.Rngs(0)))
            self._own = tuple(own)    # the layer's variables, held here under their own names
            for name, v in own.items():
                setattr(self, name, type(v)(v.get_value(), **v.get_metadata()))  # its sharding kept
            kernel = getattr(self, weight).get_value()
            n_in = math.prod(kernel.shape[i] for i in in_axes)
            init = nnx.initializers.normal(1.0 / rank)
            self.lora_a = nnx.LoRAParam(init(rngs.params(), (n_in, rank), kernel.dtype))
            self.lora_b = nnx.LoRAParam(jnp.zeros((rank, kernel.size // n_in), kernel.dtype))

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            own = {name: getattr(self, name) for name in self._own}
            kernel = own[self.adapts][...]
            kernel = kernel + delta(kernel, self.lora_a[...], self.lora_b[...], self.in_axes, self.alpha / self.rank)
            state = {name: type(v)(kernel if name == self.adapts else v[...]) for name, v in own.items()}
            layer = nnx.merge(self._layer, nnx.State(state))
            return _unwrapped(type(layer).__call__)(layer, *args, **kwargs)

    LoRA.__qualname__ = "LoRA"
    return LoRA


def _base(node: Mox) -> tuple[Callable[..., Any], Any] | str:
    """``type(**fields)`` for the layer ``node`` called (``rngs`` left to give)
    and the layer it builds, or why it cannot be rebuilt (`_rebuild.builder`)."""
    build = builder(node)
    if isinstance(build, str):
        return build
    return build, build(rngs=flax_nnx().Rngs(0))


def _generic(node: Mox, rank: int, alpha: float) -> Any:
    """The `LoRA` for the layer ``node`` of a kind in `KERNEL_AXES`; raises for a
    configuration whose math LoRA does not know."""
    shape = tuple(getattr((node.var_tree or {}).get("kernel"), "shape", ()))
    axes = KERNEL_AXES[node.module_type](dict(node.attrs), len(shape)) if shape else "no `kernel`"
    built = _base(node) if not isinstance(axes, str) else axes
    if isinstance(built, str) or isinstance(axes, str):
        why = built if isinstance(built, str) else axes
        raise CannotAdapt(node, f"nnx's `{node.type}` layers whose math it knows", f"has {why}")
    return lora_type()(built[0], axes, rank, alpha, rngs=flax_nnx().Rngs(0))


def _any(node: Mox, rank: int, alpha: float) -> Any:
    """The `LoRA` for a layer of a kind `KERNEL_AXES` does not list (a custom ``ShardedLinear``,
    an ``Einsum`` of one's own): any layer linear in one weight, the axes that meet the input
    read from its jaxpr (`yax._lora.contraction`); ``None`` for a module without a weight of its
    own; raises, saying why, for one LoRA cannot adapt."""
    nnx = flax_nnx()
    held = {k: v for k, v in (node.var_tree or {}).items() if len(getattr(v, "shape", ())) >= 2}
    if not held:
        return None
    built = _base(node)
    why = built if isinstance(built, str) else None
    if not isinstance(built, str):
        graph, state = nnx.split(built[1])
        own = {k: v for k, v in state.items() if hasattr(v, "get_value")}
        values = {k: v.get_value() for k, v in own.items()}
        name = weight_name(values)
        why = no_weight(values) if name is None else None
    if why is None:
        def apply(w: Any, inputs: list[Any]) -> Any:
            args, kwargs = node.sig.args(inputs)
            layer = nnx.merge(graph, nnx.State({k: type(v)(w if k == name else v.get_value()) for k, v in own.items()}))
            return _unwrapped(type(layer).__call__)(layer, *args, **kwargs)

        w = own[name].get_value()
        axes = contraction(apply, jax.ShapeDtypeStruct(w.shape, w.dtype), abstract_inputs(node))
        why = axes if isinstance(axes, str) else None
    if why is not None:
        raise CannotAdapt(node, "an nnx layer linear in one weight", f"has {why}")
    return lora_type()(built[0], axes, rank, alpha, rngs=nnx.Rngs(0), weight=name)


def _linear_kwargs(a: dict[str, Any]) -> dict[str, Any]:
    return dict(use_bias=a.get("use_bias", True), dtype=a.get("dtype"),
                param_dtype=a.get("param_dtype", jnp.float32), precision=a.get("precision"))


@functools.cache
def lora_linear_type() -> type:
    """yax's `LoRALinear` (defined on first use: flax.nnx is imported lazily)."""
    nnx = flax_nnx()
    base: Any = nnx.LoRALinear

    class LoRALinear(base):  # type: ignore[misc]  # nnx is imported lazily: its types are `Any` here
        """``nnx.LoRALinear`` with LoRA's scale, what ``yax.sub(pattern,
        yax.LoRA(rank=4, alpha=8), mox, params=state)`` puts in place of each
        ``nnx.Linear``: ``x @ kernel + bias + (x @ lora_a @ lora_b) * alpha /
        rank``, as every other adapter computes (nnx's own adds ``x @ lora_a @
        lora_b`` unscaled). Its state is laid out as nnx's (``lora/lora_a``)."""

        def __init__(self, in_features: int, out_features: int, *, lora_rank: int, alpha: float, rngs: Any,
                     **kwargs: Any):
            super().__init__(in_features, out_features, lora_rank=lora_rank, rngs=rngs, **kwargs)
            self.rank, self.alpha = lora_rank, alpha

        def __call__(self, x: Any, out_sharding: Any = None) -> Any:
            y = nnx.Linear.__call__(self, x, out_sharding=out_sharding)  # the layer itself, part of this call
            return y + self.lora(x) * (self.alpha / self.rank)

    LoRALinear.__qualname__ = "LoRALinear"
    return LoRALinear


def _lora_linear(node: Mox, rank: int, alpha: float) -> Any:
    nnx = flax_nnx()
    a = node.attrs
    kwargs = _linear_kwargs(a)
    held = getattr((node.var_tree or {}).get("kernel"), "dtype", None)
    if held is not None:
        # the layer's parameters as the model holds them (cast to bfloat16 after loading, say), not as
        # its class declares them: the kernel is kept as it is, and the adapters take its type
        kwargs["param_dtype"] = held
    return lora_linear_type()(a["in_features"], a["out_features"], lora_rank=rank, alpha=alpha,
                              lora_param_dtype=kwargs["param_dtype"], lora_dtype=kwargs["dtype"],
                              a_initializer=nnx.initializers.normal(1.0 / rank), rngs=nnx.Rngs(0), **kwargs)


def drawn(module: Any, key: Any, index: int, stack: tuple[int, ...]) -> dict[tuple[str, ...], jax.Array]:
    """``{path in the adapter's state: lora_a}`` for an adapter `adapter` built, ``lora_a`` drawn
    from ``key`` as the ``index``-th layer a `sub` adapts (`yax._lora.first_a`); ``{}`` for any
    other module (it comes built, with its own values)."""
    where = {lora_linear_type(): ("lora", "lora_a"), lora_type(): ("lora_a",)}.get(type(module))
    if where is None:
        return {}
    a = module.lora.lora_a if where[0] == "lora" else module.lora_a
    shape, dtype = a.get_value().shape, a.get_value().dtype
    return {where: first_a(key, index, stack, shape, dtype, module.rank)}


def adapter(node: Mox, rank: int, alpha: float) -> Any:
    """The adapter for the nnx layer ``node``, or ``None`` for a kind without
    one; raises for a kind LoRA adapts in a configuration whose math it does
    not know (a grouped ``Conv``)."""
    if not KERNEL_AXES:
        KERNEL_AXES.update(_kernel_axes())
    if node.module_type is flax_nnx().Linear:
        return _lora_linear(node, rank, alpha)
    return _generic(node, rank, alpha) if node.module_type in KERNEL_AXES else _any(node, rank, alpha)


@dataclasses.dataclass(frozen=True)
class Folding:
    """How `merge` folds one adapter type back into the layer it adapts."""

    lora: tuple[str, ...]  #: where the adapter holds ``lora_a``/``lora_b``, below its own scope
    #: ``adapter node -> (kernel, lora_a, lora_b) -> merged kernel`` (one layer; stacked ones are mapped)
    fold: Callable[[Mox], Callable[[jax.Array, jax.Array, jax.Array], jax.Array]]
    layer: Callable[[Mox], Any]  #: ``adapter node -> the layer it adapts``


def _linear(node: Mox) -> Any:
    nnx = flax_nnx()
    a = node.attrs
    return nnx.Linear(a["in_features"], a["out_features"], rngs=nnx.Rngs(0), **_linear_kwargs(a))


def _fold_generic(node: Mox) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    a = node.attrs
    def fold(k: jax.Array, la: jax.Array, lb: jax.Array) -> jax.Array:
        return k + delta(k, la, lb, tuple(a["in_axes"]), a["alpha"] / a["rank"])

    return fold


def _fold_linear(node: Mox) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    scale = node.attrs["alpha"] / node.attrs["rank"]
    return lambda k, la, lb: k + delta(k, la, lb, (0,), scale)


def _foldings() -> dict[type, Folding]:
    nnx = flax_nnx()
    return {
        nnx.LoRALinear: Folding(("lora",), lambda n: lambda k, la, lb: k + jnp.matmul(la, lb), _linear),
        lora_linear_type(): Folding(("lora",), _fold_linear, _linear),
        lora_type(): Folding((), _fold_generic, lambda n: n.attrs["base"](rngs=nnx.Rngs(0))),
    }


def merge(mox: Mox, state: Any) -> tuple[Mox, Any] | None:
    """Each adapter of ``mox`` becomes the layer it adapts, its kernel plus
    the adapter's update (per layer, when stacked by ``nnx.vmap``/``nnx.scan``);
    ``None`` when ``mox`` holds no adapter."""
    sub = engine.sub
    from ._state import flat_state

    by_type = _foldings()
    nodes = [n for n in mox.modules() if n.module_type in by_type]
    if not nodes:
        return None
    flat = flat_state(state)
    at = {p: x for p, _, x in flat}
    merged = dict(at)
    for n in {n.scope: n for n in nodes}.values():
        f = by_type[n.module_type]
        w = n.attrs.get("adapts", "kernel")  # yax's `LoRA` says which; the `LoRALinear`s adapt `kernel`
        kernel = at[(*n.scope, w)]
        a, b = (at[(*n.scope, *f.lora, name)] for name in ("lora_a", "lora_b"))
        fold = f.fold(n)
        for _ in range(a.ndim - 2):  # layers stacked by `nnx.scan`/`nnx.vmap` lead each leaf
            fold = jax.vmap(fold)
        merged[(*n.scope, w)] = fold(kernel, a, b).astype(kernel.dtype)
    new_state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), [merged[p] for p, _, _ in flat])

    def layer_of(path: str, node: Mox) -> Any:
        return by_type[node.module_type].layer(node)

    out: tuple[Mox, Any] = sub(nodes, layer_of, mox, params=new_state)
    return out


register_adapters(NAME, Adapters(kinds=KINDS, make=lambda node, spec: adapter(node, spec.rank, spec.alpha),
                        merge=lambda mox, state: merge(mox, state) if mox.frontend == NAME else None))
