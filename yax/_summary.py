"""`summary`: a table of the module calls of a MoX with shapes, parameters
and FLOPs (matrix products and convolutions), like ``flax.linen.tabulate``."""

from __future__ import annotations

import math

from ._ir import CALL_KINDS, Equation, Kind, Mox
from ._print import type_str


def eqn_flops(eqn: Equation) -> int:
    """FLOPs of one equation where they are known (dot_general, convolutions,
    and nested computations, times the length of a scan)."""
    if eqn.name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(eqn.inputs[0].shape[d] for d in lc)
        return 2 * eqn.outputs[0].size * k
    if eqn.name == "conv_general_dilated":
        rhs = eqn.inputs[1].shape
        dn = eqn.params["dimension_numbers"]
        out_feature_dim = dn.rhs_spec[0]
        per_out = math.prod(rhs) // rhs[out_feature_dim]
        return 2 * eqn.outputs[0].size * per_out
    total = sum(flops(sub) for _, sub in eqn.subs)
    if eqn.name == "scan":
        total *= eqn.params.get("length", 1)
    elif eqn.name == "cond":
        total = max((flops(sub) for _, sub in eqn.subs), default=0)
    return total


def flops(mox: Mox) -> int:
    """Known FLOPs of everything under ``mox``."""
    total = 0
    for c in mox.children:
        total += eqn_flops(c) if isinstance(c, Equation) else flops(c)
    return total


def _rows(mox: Mox, depth: int, mult: int, out: list) -> None:
    for c in mox.children:
        if isinstance(c, Mox):
            if c.kind in CALL_KINDS:
                out.append((depth, c, mult))
            _rows(c, depth + 1 if c.kind in CALL_KINDS else depth, mult, out)
        else:
            for _, sub in c.subs:
                _rows(sub, depth, mult * (c.params.get("length", 1) if c.name == "scan" else 1), out)


def summary(mox: Mox) -> str:
    """A table of module calls: path, type, input/output shapes, parameters
    owned and FLOPs (per call; calls inside a scan body run ``length`` times,
    shown as ``×N``).

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3); x = jnp.ones((2, 4))
      >>> print(yax.summary(yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)))
      path   type   inputs     outputs    params  flops
      Dense  Dense  f32[2,4]   f32[2,3]   15      48
      total                               15      48
    """
    rows = []
    _rows(mox, 0, 1, rows)
    table = [("path", "type", "inputs", "outputs", "params", "flops")]
    for depth, node, mult in rows:
        f = flops(node)
        table.append(
            (
                "  " * depth + node.path.rsplit("/", 1)[-1] if depth else node.path,
                node.type + (f"·{node.method}" if node.method not in (None, "__call__", node.name) else ""),
                " ".join(type_str(a) for a in node.inputs),
                " ".join(type_str(a) for a in node.outputs),
                f"{node.num_params:,}".replace(",", "_") if node.kind == Kind.MODULE_CALL else "",
                (f"{f:,}".replace(",", "_") + (f" ×{mult}" if mult > 1 else "")) if f else "",
            )
        )
    top = [n for d, n, _ in rows if d == 0 and n.kind == Kind.MODULE_CALL]
    table.append(("total", "", "", "", f"{sum(n.num_params for n in top):,}".replace(",", "_"),
                  f"{flops(mox):,}".replace(",", "_")))
    widths = [max(len(r[i]) for r in table) for i in range(6)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table
    )
