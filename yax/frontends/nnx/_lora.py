"""LoRA for nnx layers (`NnxFrontend.lora`, `NnxFrontend.merge_lora`).

Each layer kind nnx has an adapter for is one entry of `ADAPTERS`: how to
build the adapter from the layer's call node (its fields), the adapter's
type, and how to fold a trained adapter's variables back into the layer's
kernel and rebuild the layer. The adapter starts exactly equal to the layer
(``lora_b`` is zero), and `sub` keeps the layer's own variables (same
attribute path, type, shape and dtype).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..._ir import Mox
from ._base import flax_nnx


@dataclasses.dataclass(frozen=True)
class Adapter:
    """How LoRA adapts one nnx layer kind."""

    adapted: Callable[[], type]                     #: the adapter's type (``nnx.LoRALinear``)
    build: Callable[[dict[str, Any], int, float], Any]  #: ``(layer fields, rank, alpha) -> adapter``
    #: ``(kernel, lora variables {name: array}) -> merged kernel`` (for one layer; stacked ones are mapped)
    fold: Callable[[jax.Array, dict[str, jax.Array]], jax.Array]
    layer: Callable[[dict[str, Any]], Any]          #: ``adapter fields -> the layer it adapts``


def _linear_kwargs(a: dict[str, Any]) -> dict[str, Any]:
    return dict(use_bias=a.get("use_bias", True), dtype=a.get("dtype"),
                param_dtype=a.get("param_dtype", jnp.float32), precision=a.get("precision"))


def _lora_linear(a: dict[str, Any], rank: int, alpha: float) -> Any:
    nnx = flax_nnx()
    return nnx.LoRALinear(a["in_features"], a["out_features"], lora_rank=rank, rngs=nnx.Rngs(0),
                          **_linear_kwargs(a))


def _linear(a: dict[str, Any]) -> Any:
    nnx = flax_nnx()
    return nnx.Linear(a["in_features"], a["out_features"], rngs=nnx.Rngs(0), **_linear_kwargs(a))


def _adapters() -> dict[type, Adapter]:
    nnx = flax_nnx()
    return {
        nnx.Linear: Adapter(lambda: nnx.LoRALinear, _lora_linear,
                            lambda kernel, lora: kernel + jnp.matmul(lora["lora_a"], lora["lora_b"]), _linear),
    }


#: Layer type -> its `Adapter`, filled on first use (flax.nnx is imported lazily).
ADAPTERS: dict[type, Adapter] = {}

#: The layer kinds `ADAPTERS` holds, as messages name them.
KINDS = ("Linear",)


def adapters() -> dict[type, Adapter]:
    if not ADAPTERS:
        ADAPTERS.update(_adapters())
    return ADAPTERS


def adapter(node: Mox, rank: int, alpha: float) -> Any:
    """The adapter for the nnx layer ``node``, or ``None`` for a kind without one."""
    a = adapters().get(node.module_type)
    return a.build(dict(node.attrs), rank, alpha) if a is not None else None


def merge(mox: Mox, state: Any) -> tuple[Mox, Any] | None:
    """Each adapter of ``mox`` becomes the layer it adapts, its kernel plus
    the adapter's update (per layer, when stacked by ``nnx.vmap``/``nnx.scan``);
    ``None`` when ``mox`` holds no adapter."""
    from ...rewrite import sub
    from ._state import flat_state

    by_type = {a.adapted(): a for a in adapters().values()}
    nodes = [n for n in mox.modules() if n.module_type in by_type]
    if not nodes:
        return None
    flat = flat_state(state)
    at = {p: x for p, _, x in flat}
    merged = dict(at)
    for n in {n.scope: n for n in nodes}.values():
        a = by_type[n.module_type]
        kernel = at[(*n.scope, "kernel")]
        lora = {p[-1]: x for p, x in at.items() if p[: len(n.scope) + 1] == (*n.scope, "lora")}
        fold = a.fold
        for _ in range(lora["lora_a"].ndim - 2):  # layers stacked by `nnx.scan`/`nnx.vmap` lead each leaf
            fold = jax.vmap(fold)
        merged[(*n.scope, "kernel")] = fold(kernel, lora).astype(kernel.dtype)
    new_state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), [merged[p] for p, _, _ in flat])

    def layer_of(path: str, node: Mox) -> Any:
        return by_type[node.module_type].layer(dict(node.attrs))

    out: tuple[Mox, Any] = sub(nodes, layer_of, mox, params=new_state)
    return out
