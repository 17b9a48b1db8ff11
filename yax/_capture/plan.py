"""Which nodes a capture, patch or comparison reaches, where they sit, and the keys
its values come out under (`capture_keys`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from .. import _calls, errors
from .._ir import CALL_KINDS, Equation, Mox
from .._map import Node
from ..errors import YaxCaptureError


def capture_keys(mox: Mox) -> dict[int, str]:
    """``id(node)`` -> the key `capture` gives its values (`yax._calls.keys`:
    the one key scheme `compare`, `patch` and the explorer use too)."""
    return _calls.keys(mox)


# -- the plan: which nodes, where, and how to reach them -------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    key: str
    node: Node
    scans: tuple[int, ...]      # ids of the scan equations around it, outermost first
    stack: tuple[int, ...]      # their lengths: the leading axes of its stacked values

    def results(self, flat: list[Any]) -> Any:
        """The node's output as the model's code sees it (a call's result pytree)."""
        return results_of(self.node, flat)

    def expected(self) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct((*self.stack, *a.shape), a.dtype) for a in self.node.outputs]


@dataclasses.dataclass(frozen=True)
class Plan:
    targets: dict[int, Target]               # id(node) -> target, in evaluation order
    descend: dict[int, str]                   # id(equation) -> "inline" | "remat" | "scan"

    def inside(self, eqn: Equation) -> set[str]:
        return {t.key for t in self.targets.values() if id(eqn) in t.scans}


def _selected(pattern: Any, mox: Mox, what: str) -> list[Node]:
    from .._xpath import explain, selected

    found = selected(pattern, mox, what, YaxCaptureError)
    nodes = [n for n in found if isinstance(n, Equation) or (isinstance(n, Mox) and n.kind in CALL_KINDS)]
    if len(nodes) < len(found) and any(not isinstance(n, (Mox, Equation)) for n in found):
        bad = next(n for n in found if not isinstance(n, (Mox, Equation)))
        raise YaxCaptureError(f"`{what}` works on calls and equations of a MoX, but the pattern gave `{bad!r}`.")
    if not nodes:
        raise errors.NothingToCapture(pattern, explain(pattern, mox) if isinstance(pattern, str) else "", what)
    return nodes


def make_plan(pattern: Any, mox: Mox, what: str, forward_only: bool = False) -> Plan:
    return plan_of(_selected(pattern, mox, what), mox, what, pattern, forward_only)


def plan_of(nodes: Sequence[Node], mox: Mox, what: str, pattern: Any = None,
            forward_only: bool = False) -> Plan:
    """The plan reaching ``nodes`` of ``mox`` (refused, saying why, when one
    runs where its values cannot come out)."""
    wanted = {id(n) for n in nodes}
    key = capture_keys(mox)
    targets: dict[int, Target] = {}
    descend: dict[int, str] = {}
    for c, _, holders in _calls.visit(mox):
        if id(c) in wanted and id(c) not in targets and c is not mox:
            chain = [(eqn, how_reached(eqn, forward_only)) for eqn, _ in holders]
            for eqn, how in chain:
                if not _calls.opens(how):
                    raise _refused(pattern, c, eqn, how, what)
                descend[id(eqn)] = how
            scans = tuple(e for e, _ in holders if _calls.is_scan(e))
            targets[id(c)] = Target(key[id(c)], c, tuple(id(e) for e in scans),
                                     tuple(e.params["length"] for e in scans))
    missing = [n for n in nodes if id(n) not in targets]
    if missing:
        raise errors.NotInMox(missing[0], what, hint="Query the MoX you evaluate.")
    return Plan(targets, descend)


def results_of(node: Node, flat: list[Any]) -> Any:
    """What ``node`` returns as the model's code sees it (a call's result pytree), with
    ``flat`` as its outputs: what `capture` gives for it."""
    if isinstance(node, Mox) and node.sig.outs.tree is not None:
        return node.sig.results(flat)
    return flat[0] if len(flat) == 1 else tuple(flat)


def capturable_calls(mox: Mox) -> list[Mox]:
    """The call nodes of ``mox`` whose outputs `capture` can bring out, in
    the order they finish: every call except those inside ``while``, ``cond`` and
    custom-derivative bodies (which `capture` refuses, saying why)."""
    idx = _calls.index(mox)
    return [c for c in idx.calls.values() if idx.positions[id(c)].blocked is None]


def how_reached(eqn: Equation, forward_only: bool) -> str:
    rule = _calls.how(eqn)
    if rule == "custom":  # the forward pass alone may look inside a custom rule's primal
        return "inline" if forward_only and len(eqn.subs) == 1 else "custom"
    return rule


def _refused(pattern: Any, node: Node, eqn: Equation, how: str, what: str) -> errors.CannotComeOut:
    why = _calls.WHY.get(how) or (f"`{what}` brings values out of `scan`, `remat` and `jit` bodies only, and `{eqn.name}` "
                            "is none of these")
    return errors.CannotComeOut(what, pattern, node, eqn.name, eqn.path, why)
