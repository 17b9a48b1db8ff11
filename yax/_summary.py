"""`summary`: a table of the module calls of a MoX with shapes, parameters
and FLOPs (matrix products and convolutions), like ``flax.linen.tabulate``."""

from __future__ import annotations

import math
from typing import Any

from . import _calls
from ._ir import CALL_KINDS, Equation, Kind, Mox, delegate
from ._precision import is_mixed, precisions
from ._vocab import type_str
from .errors import YaxInputError


def _own_flops(eqn: Equation) -> int | None:
    """FLOPs of an equation that holds no computation (None for one that does)."""
    if eqn.name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        k: int = math.prod(eqn.inputs[0].shape[d] for d in lc)
        return 2 * eqn.outputs[0].size * k
    if eqn.name == "conv_general_dilated":
        rhs = eqn.inputs[1].shape
        dn = eqn.params["dimension_numbers"]
        out_feature_dim = dn.rhs_spec[0]
        per_out: int = math.prod(rhs) // rhs[out_feature_dim]
        return 2 * eqn.outputs[0].size * per_out
    return None


def all_flops(mox: Mox) -> dict[int, int | None]:
    """``id(node)`` -> the FLOPs of matrix products and convolutions of every
    node under ``mox`` (itself included): nested computations times the
    length of a scan. ``None`` where the count is not known before the
    program runs (`flops_unknown_why` says why): a ``while`` loop's body runs a number of times
    known only then, and one branch of a ``cond`` runs, chosen then (unless
    its branches cost the same). One pass over the node index (`_calls.index`)."""
    out: dict[int, int | None] = {}
    for n in reversed(_calls.index(mox).nodes):  # pre-order reversed: children before parents
        if isinstance(n, Mox):
            counts = [out[id(c)] for c in n.children]
            out[id(n)] = None if None in counts else sum(counts)  # type: ignore[arg-type]
            continue
        own = _own_flops(n)
        out[id(n)] = own if own is not None else _held(n, [out[id(s)] for _, s in n.subs])
    return out


def flops_unknown_why(node: Mox | Equation, known: dict[int, int | None]) -> str:
    """Why the FLOPs of ``node`` are not known (``known``: `all_flops`, ``None`` there): the
    ``while`` loop or ``cond`` below it (or itself) whose count is where the unknown starts."""
    inside = node.walk() if isinstance(node, Mox) else (n for _, body in node.subs for n in body.walk())
    for e in (node, *inside):
        if isinstance(e, Equation) and known[id(e)] is None and all(known[id(b)] is not None for _, b in e.subs):
            if _calls.is_loop(e):
                return "not known before it runs: a `while` loop in it runs its body a number of times known only then"
            return "not known before it runs: one branch of a `cond` in it runs, and its branches differ in cost"
    raise ValueError("the FLOPs of this node are known")


def _held(eqn: Equation, subs: list[int | None]) -> int | None:
    """FLOPs of an equation holding computations of ``subs`` FLOPs: a scan's body
    times its length, a ``cond``'s branches if they agree, others once; ``None``
    for a ``while`` loop (its steps are counted when it runs) or what holds one."""
    if None in subs or (_calls.is_loop(eqn) and any(subs)):
        return None
    known = [s for s in subs if s is not None]
    if _calls.is_branch(eqn):
        return known[0] if len(set(known)) == 1 else (0 if not known else None)
    return sum(known) * (eqn.params.get("length", 1) if _calls.is_scan(eqn) else 1)


def flops(mox: Mox) -> int | None:
    """FLOPs of matrix products and convolutions under ``mox`` (``None``: `flops_unknown_why`)."""
    return all_flops(mox)[id(mox)]


def _rows(mox: Mox) -> list[tuple[int, Mox, int]]:
    """``(depth, call, times it runs)`` of every call under ``mox``, in
    document order (calls in a scan body run ``length`` times)."""
    idx = _calls.index(mox)
    depth: dict[int, int] = {-1: 0}
    out: list[tuple[int, Mox, int]] = []
    for i, n in enumerate(idx.nodes):
        if i and isinstance(n, Mox) and n.kind in CALL_KINDS:
            depth[i] = depth[idx.callers[i]] + 1
            out.append((depth[i] - 1, n, math.prod(idx.positions[id(n)].stack)))
    return out


def _params(mox: Mox, node: Mox) -> str:
    """A module call's parameter count, ``×N`` when a scan holds N sets of them."""
    if node.kind != Kind.MODULE_CALL:
        return ""
    n = _calls.param_copies(mox, node)
    return f"{node.num_params:,}".replace(",", "_") + (f" ×{n}" if n > 1 else "")


@delegate("summary")
def summary(mox: Mox, cost: Any = None) -> str:
    """A table of module calls: path, type, input/output shapes, parameters
    owned, FLOPs and, where calls differ in them, the dtypes of their
    parameters, computation and outputs (``f32/bf16/f32``, see
    `yax.mixed_precision`) (FLOPs per call; calls inside a scan body run ``length`` times,
    shown as ``×N``, and hold ``×N`` sets of parameters when the scan slices them per step).
    FLOPs that cannot be known before the program runs (a call holding a ``while`` loop, or a
    ``cond`` whose branches differ in cost) show as ``unknown*``, with a line saying why.

    With ``cost`` (a `yax.Cost` of this MoX from `yax.cost`), three more columns
    from the compiled program: its FLOPs (elementwise ones included, as XLA counts),
    bytes accessed and collectives per run, every run of a call and the calls under
    it included, per device.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3); x = jnp.ones((2, 4))
      >>> print(yax.summary(yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)))
      path   type   inputs     outputs    params  flops
      Dense  Dense  f32[2,4]   f32[2,3]   15      48
      total                               15      48
    """
    rows = _rows(mox)
    known = all_flops(mox)
    pols = precisions(mox)
    mixed = is_mixed(mox)  # shown when calls differ
    compiled = _compiled(mox, cost)
    table = [("path", "type", "inputs", "outputs", "params", "flops") + (("dtypes p/c/o",) if mixed else ())
             + (("xla flops", "xla bytes", "collectives") if compiled else ())]
    for depth, node, mult in rows:
        f = known[id(node)]
        table.append(
            (
                "  " * depth + node.path.rsplit("/", 1)[-1] if depth else node.path,
                node.type + (f"·{node.method}" if node.method not in (None, "__call__", node.name) else ""),
                " ".join(type_str(a) for a in node.inputs),
                " ".join(type_str(a) for a in node.outputs),
                _params(mox, node),
                "unknown*" if f is None else (f"{f:,}".replace(",", "_") + (f" ×{mult}" if mult > 1 else "")) if f
                else "",
            ) + ((pols[id(node)].short(),) if mixed else ()) + (compiled[id(node)] if compiled else ())
        )
    top = [n for d, n, _ in rows if d == 0 and n.kind == Kind.MODULE_CALL]
    total = known[id(mox)]
    table.append(("total", "", "", "", f"{sum(n.num_params for n in top):,}".replace(",", "_"),
                  "unknown*" if total is None else f"{total:,}".replace(",", "_")) + (("",) if mixed else ())
                 + (compiled[id(mox)] if compiled else ()))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    if total is None:
        lines.append(f"* FLOPs {flops_unknown_why(mox, known)}.")
    if compiled:
        whys = sorted({c.why for c in cost.calls.values() if c.why})
        lines += [f"* compiled: {w}." for w in whys]
        if cost.devices > 1:
            lines.append(f"xla flops, bytes and collectives: per device, of the {cost.devices} the program runs on.")
    return "\n".join(lines)


def _compiled(mox: Mox, cost: Any) -> dict[int, tuple[str, str, str]]:
    """``id(call)`` (and the root's) -> its compiled FLOPs, bytes accessed and collectives
    per run, from ``cost`` (a `yax.Cost` of ``mox``); empty without one."""
    if cost is None:
        return {}
    if getattr(cost, "mox", None) is not mox:
        raise YaxInputError("`summary` was given the `yax.Cost` of another MoX; pass "
                       "`yax.cost(mox, *args)` of this one.")
    out: dict[int, tuple[str, str, str]] = {}
    for key, c in cost.calls.items():
        runs = c.collective_runs
        colls = "unknown*" if runs is None else str(runs) if c.collectives else ""
        out[id(cost.node(key))] = (_count(c.total["flops"]), _count(c.total["bytes_accessed"]), colls)
    return out


def _count(v: float | None) -> str:
    return "unknown*" if v is None else f"{v:,.0f}".replace(",", "_")
