"""Threading new root inputs into nested computations.

A replacement with variables inside a lifted transform (``nn.remat``,
``nn.jit``, ``nn.scan`` over layers) reads variables the root does not pass
down yet. Each equation on the way from the root to the node (its *chain*)
gets the new value as one more input, and the computation it holds one more
parameter, by a rule per primitive (as jax's ``pp_eqn_rules`` dispatch per
primitive): ``checkpoint``/``remat`` and ``jit`` pass it through; ``scan``
scans it (a variable stacked along the scan's axis, one slice per layer).
Variables the program already passes down are followed, not added twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .._ir import Equation, Mox, Var
from ..errors import YaxRewriteError, where


def _passed(params: dict[str, Any], key: str) -> dict[str, Any]:
    return params


def _jit(params: dict[str, Any], key: str) -> dict[str, Any]:
    out = dict(params)
    for name, extra in (("in_shardings", None), ("in_layouts", None), ("donated_invars", False)):
        if name in out:
            items = tuple(out[name])
            if name == "in_shardings":
                if not items:
                    raise YaxRewriteError("A jitted computation without inputs cannot take new variables.")
                extra = items[-1]  # jit's "unspecified" marker, as every traced input has it
            out[name] = (*items, extra)
    return out


def _scan(params: dict[str, Any], key: str) -> dict[str, Any]:
    if "linear" not in params:  # newer JAX keeps no per-input flags
        return params
    return {**params, "linear": (*params["linear"], False)}


def _without(params: dict[str, Any], name: str, idx: int) -> dict[str, Any]:
    """``params`` with input ``idx`` gone: per-input tuples shortened, counts of consts lowered."""
    out = dict(params)
    for k in ("in_shardings", "in_layouts", "donated_invars", "linear"):
        if k in out:
            out[k] = tuple(x for i, x in enumerate(out[k]) if i != idx)
    if name == "scan":
        if idx < out["num_consts"]:
            out["num_consts"] -= 1
        elif idx < out["num_consts"] + out["num_carry"]:
            raise YaxRewriteError("A variable carried through a scan cannot be dropped.")
    return out


#: primitive name -> (how its params change for one more input, whether the input is scanned)
RULES: dict[str, tuple[Callable[[dict[str, Any], str], dict[str, Any]], bool]] = {
    "checkpoint": (_passed, False),
    "remat": (_passed, False),
    "remat2": (_passed, False),
    "jit": (_jit, False),
    "pjit": (_jit, False),
    "closed_call": (_passed, False),
    "core_call": (_passed, False),
    "scan": (_scan, True),
}

Chain = tuple[tuple[Equation, str], ...]


def stack(chain: Chain, node: Any) -> tuple[int, ...]:
    """The leading axes a variable read at ``node`` has at the root: one per
    scan on the way (its length); refuses a chain with no rule."""
    out = []
    for eqn, _ in chain:
        rule = RULES.get(eqn.name)
        if rule is None:
            raise YaxRewriteError(
                f"{where(node, start=True)} is inside a `{eqn.name}` computation, where yax cannot pass new "
                f"variables yet (it can through {', '.join(sorted(RULES))}). Replace it with a function or a "
                "module without variables."
            )
        if rule[1]:
            out.append(int(eqn.params["length"]))
    return tuple(out)


class Threads:
    """The inputs to add along chains, and the var each root var is at the end of its chain."""

    def __init__(self) -> None:
        self.added: dict[int, list[tuple[str, Var, Var]]] = {}  # id(eqn) -> [(param, outer, inner)]
        self._memo: dict[tuple[int, int], Var] = {}
        #: root vars a rewrite removed: the equations on chains stop passing them down
        self.dropped: set[Var] = set()
        self.on_chains: set[int] = set()  # ids of the equations on the chains of rewritten nodes

    def follow(self, chain: Chain) -> None:
        """Note the equations on ``chain``: they may pass new variables down, or stop passing dropped ones."""
        self.on_chains.update(id(eqn) for eqn, _ in chain)

    def inner(self, v: Var, chain: Chain) -> Var:
        """The var ``v`` (a root var) is inside the last computation of ``chain``."""
        for eqn, key in chain:
            sub = _sub(eqn, key)
            hit = self._memo.get((id(eqn), id(v)))
            if hit is None:
                if v in eqn.inputs:
                    hit = sub.invars[eqn.inputs.index(v)]
                else:
                    scanned = RULES[eqn.name][1]
                    hit = Var(v.shape[1:] if scanned else v.shape, v.dtype, v.weak_type)
                    self.added.setdefault(id(eqn), []).append((key, v, hit))
                self._memo[(id(eqn), id(v))] = hit
            v = hit
        return v

    def before(self, node: Any) -> Any:
        """For `map_mox`'s ``before``: an equation of a chain with its new
        inputs, and without those a rewrite dropped."""
        if not isinstance(node, Equation) or id(node) not in self.on_chains:
            return node
        node = self._drop(node)
        adds = self.added.get(id(node))
        if not adds:
            return node
        params = dict(node.params)
        key = adds[0][0]
        sub = params[key]
        params[key] = dataclasses.replace(sub, invars=sub.invars + tuple(i for _, _, i in adds),
                                          inputs=sub.inputs + tuple(i for _, _, i in adds))
        for _ in adds:
            params = RULES[node.name][0](params, key)
        return dataclasses.replace(node, params=params, inputs=node.inputs + tuple(o for _, o, _ in adds),
                                   _jaxprs={k: j for k, j in node._jaxprs.items() if k != key})

    def _drop(self, node: Equation) -> Equation:
        gone = [i for i, a in enumerate(node.inputs) if a in self.dropped]
        subs = node.subs
        if not gone or len(subs) != 1:
            return node
        key, sub = subs[0]
        params = dict(node.params)
        for i in reversed(gone):
            self.dropped.add(sub.invars[i])  # and below, in computations nested in this one
            params = _without(params, node.name, i)
        keep = [i for i in range(len(node.inputs)) if i not in set(gone)]
        params[key] = dataclasses.replace(sub, invars=tuple(sub.invars[i] for i in keep),
                                          inputs=tuple(sub.invars[i] for i in keep))
        new = dataclasses.replace(node, params=params, inputs=tuple(node.inputs[i] for i in keep),
                                  _jaxprs={k: j for k, j in node._jaxprs.items() if k != key})
        if id(node) in self.added:  # keep the additions planned for this equation
            self.added[id(new)] = self.added.pop(id(node))
        return new


def _sub(eqn: Equation, key: str) -> Mox:
    sub = eqn.params[key]
    if not isinstance(sub, Mox):
        raise YaxRewriteError(f"The `{eqn.name}` at `{eqn.path}` holds several computations; yax cannot pass "
                              "new variables into one of them.")
    return sub
