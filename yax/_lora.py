"""A LoRA adapter for `sub` (``Dense`` → ``LoRA``) and merging it back."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ._ir import Mox
from .errors import YaxRewriteError
from .rewrite import sub


class LoRA(nn.Module):
    """A ``Dense`` layer plus a low-rank update: ``x @ kernel + bias +
    (x @ lora_a @ lora_b) * alpha / rank``.

    Its ``kernel`` and ``bias`` have the names and shapes of ``nn.Dense``'s,
    so `yax.sub` keeps the replaced layer's values for them; ``lora_b``
    starts at zero, so the adapted model starts equal to the original.
    Fields left ``None`` (``features``, ``use_bias``, ``dtype``) are taken
    from the ``Dense`` it replaces. Train only ``lora_a``/``lora_b`` (see
    `yax.lora_mask`), then fold them back with `yax.merge_lora`.
    """

    rank: int = 4
    alpha: float = 4.0
    features: int | None = None
    use_bias: bool | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.features is None:
            raise ValueError("LoRA needs `features` (filled in by `yax.sub` from the Dense it replaces).")
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features),
                            self.param_dtype)
        a = self.param("lora_a", nn.initializers.normal(1.0 / self.rank), (x.shape[-1], self.rank),
                       self.param_dtype)
        b = self.param("lora_b", nn.initializers.zeros, (self.rank, self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias else None
        x, kernel, a, b, bias = nn.dtypes.promote_dtype(x, kernel, a, b, bias, dtype=self.dtype)
        y = x @ kernel + (x @ a) @ b * (self.alpha / self.rank)
        return y + bias if bias is not None else y


def lora_mask(params: Any) -> Any:
    """A pytree of booleans like ``params``: True for ``lora_a``/``lora_b``
    leaves, for ``optax.masked`` or ``optax.multi_transform``."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: getattr(kp[-1], "key", None) in ("lora_a", "lora_b"), params)


def merge_lora(mox: Mox, params: Any) -> tuple[Mox, Any]:
    """Fold every LoRA adapter of ``mox`` back into a plain ``nn.Dense``
    (``kernel + lora_a @ lora_b * alpha / rank``); returns the new MoX and
    parameters, which compute the same function."""
    nodes = [n for n in mox.modules() if n.module_type is LoRA]
    if not nodes:
        raise YaxRewriteError("`merge_lora` found no LoRA module calls in this MoX; nothing to merge.")
    merged = params
    for n in nodes:
        p = params["params"]
        for k in n.scope:
            p = p[k]
        kernel = p["kernel"] + (p["lora_a"] @ p["lora_b"]) * (n.attrs["alpha"] / n.attrs["rank"])
        merged = jax.tree_util.tree_map(lambda x: x, merged)
        d = merged["params"]
        for k in n.scope:
            d[k] = dict(d[k])
            d = d[k]
        d["kernel"] = kernel.astype(p["kernel"].dtype)

    def dense(path: str, node: Mox) -> Any:
        return nn.Dense(node.attrs["features"], use_bias=node.attrs["use_bias"], dtype=node.attrs["dtype"],
                        param_dtype=node.attrs["param_dtype"])

    return sub(nodes, dense, mox, params=merged)
