"""LoRA for `sub`, and merging it back: a description here, the adapters in the frontends.

`LoRA` says what to do (rank, alpha) and knows no module system: for each layer it replaces, the
adapters the layer's module system registered (`yax._lora.ADAPTERS`) build the adapter for that
kind of layer, and `merge_lora` asks the registered systems to fold theirs back. What the adapters
share lives in `yax._lora`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from .. import frontends
from .._check import check_if_enabled
from .._ir import Mox
from .._lora import ADAPTERS
from ..errors import CannotAdapt, YaxRewriteError
from .shard import kept_layout


@dataclasses.dataclass(frozen=True)
class LoRA:
    """A low-rank adapter for every layer a `sub` matches: the layer's own
    computation with its weight plus ``(lora_a @ lora_b) * alpha / rank``.

    ``yax.sub(pattern, yax.LoRA(rank=4), mox, params=, key=)`` builds, for each
    layer it replaces, its module system's adapter (linen: yax's own ``LoRA``
    module around any layer linear in one weight, ``Dense``, ``Einsum``,
    ``Conv``, GPT-2's ``FlaxConv1D``, gemma's ``Einsum``; nnx ``Linear``:
    ``nnx.LoRALinear`` with the ``alpha / rank`` scale; any other nnx layer
    linear in one weight: yax's own nnx ``LoRA`` module; ``eqx.nn.Linear``:
    yax's ``LoRALinear``), refusing, with the reason, layers that are not
    linear in one weight (a grouped ``Conv``, an ``Embed``); which axes of the
    weight meet the input is read from the layer's jaxpr (`contraction`). The
    layer's weights keep their values and ``lora_b`` starts at zero, so the adapted
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
            raise CannotAdapt(node, "layers", f"is {'an equation' if not isinstance(node, Mox) else f'a `{node.kind}`'}",
                              adapter=False)
        fe = frontends.of_node(node)
        adapters = ADAPTERS.get(fe.name)
        adapter = adapters.make(node, self) if adapters is not None else None
        if adapter is None:
            kinds = ", ".join(f"`{k}`" for k in (adapters.kinds if adapters is not None else ()))
            knows = f"{fe.name}'s {kinds} layers, whose math it knows" if kinds else "no layers of " + (
                f"`{fe.name}`" if fe.name else "this module system")
            raise CannotAdapt(node, knows, f"is a `{node.type}`")
        return adapter


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
    found = frontends.first_answer(mox, lambda f: ADAPTERS[f.name].merge(mox, params) if f.name in ADAPTERS else None)
    if found is None:
        raise YaxRewriteError("`merge_lora` found no LoRA adapters in this MoX; nothing to merge.")
    return check_if_enabled(kept_layout(mox, found[0], params, found[1]))  # a merged kernel keeps the kernel's sharding
