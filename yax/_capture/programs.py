"""Programs that capture or patch, jitted once per MoX, pattern and mode, and kept
while the MoX lives."""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import errors
from .._calls import kept, memo
from .._eval import run
from .._ir import Kind, Mox
from .._jit import model_jit
from .._vocab import type_str
from ..errors import NotARootMox
from .hooks import Watch
from .plan import Plan, make_plan


class _Program:
    """One jitted evaluation of a MoX with a plan: ``(flat inputs, patches,
    arg) -> (flat outputs, got)``; ``traces`` counts how often it was traced."""

    def __init__(self, mox: Mox, plan: Plan, mode: str, inputs: bool, repl: Any):
        self.plan, self.traces = plan, 0
        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(flat: list[Any], patches: dict[str, Any], arg: Any) -> tuple[Any, ...]:
            self.traces += 1
            root = ref()
            assert root is not None  # the program is cached with its MoX and dies with it
            if mode == "grad":
                return _with_grads(root, plan, inputs, repl, flat)
            w = Watch(plan, mode, inputs, patches, repl, arg, ())
            return run(root, flat, hooks=w), w.got

        self.jitted = model_jit(program)

    def __call__(self, flat: list[Any], patches: dict[str, Any], arg: Any) -> tuple[Any, ...]:
        out: tuple[Any, ...] = self.jitted(flat, patches, arg)
        return out


def _with_grads(root: Mox, plan: Plan, inputs: bool, grad_of: Any, flat: list[Any]) -> tuple[Any, ...]:
    """``(flat outputs, got, cotangents)``: one evaluation under `jax.grad`, a
    zero delta added at each target's floating outputs (stacked per scan step,
    entering scans as the patches do), so that the gradient of ``grad_of(out)``
    with respect to a delta is the cotangent at that node."""
    deltas = {t.key: [jnp.zeros(s.shape, s.dtype) if jnp.issubdtype(s.dtype, jnp.inexact) else None
                      for s in t.expected()] for t in plan.targets.values()}

    def loss(deltas: dict[str, Any]) -> tuple[Any, Any]:
        w = Watch(plan, "grad", inputs, deltas, None, None, ())
        outs = run(root, flat, hooks=w)
        return scalar_loss(grad_of, root.sig.results(outs), "capture"), (outs, w.got)

    (_, (outs, got)), cts = jax.value_and_grad(loss, has_aux=True)(deltas)
    return outs, got, cts


def scalar_loss(grad_of: Any, out: Any, what: str) -> Any:
    """``grad_of(out)``, refused unless a real floating scalar."""
    loss = grad_of(out)
    shape, dtype = getattr(loss, "shape", None), getattr(loss, "dtype", None)
    if shape != () or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise errors.LossNotScalar(what, type_str(loss) if shape is not None and dtype is not None
                                   else f"a `{type(loss).__name__}`")
    return loss


def watched(mox: Mox, plan: Plan, mode: str, flat: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Evaluate ``mox`` on ``flat`` with ``plan``'s targets watched in ``mode``
    (``"capture"``: the values as they are); ``(flat outputs, got)``."""
    w = Watch(plan, mode, False, {}, None, None, ())
    return run(mox, flat, hooks=w), w.got




def _pattern_key(pattern: Any) -> Any:
    if isinstance(pattern, str):
        return pattern
    if isinstance(pattern, (list, tuple)):
        return ("nodes", *(id(n) for n in pattern))
    return ("nodes", id(pattern))


def cached_plan(pattern: Any, mox: Mox, what: str, forward_only: bool = False) -> Plan:
    cache: dict[Any, Plan] = memo(mox, "capture.plans", dict)
    k = (_pattern_key(pattern), forward_only)
    plan = cache.get(k)
    if plan is None:
        plan = cache[k] = make_plan(pattern, mox, what, forward_only)
    return plan


def program_for(mox: Mox, pattern: Any, plan: Plan, mode: str, inputs: bool = False, repl: Any = None,
             forward_only: bool = False) -> _Program:
    cache: dict[Any, _Program] = memo(mox, "capture.programs", dict)
    k = (_pattern_key(pattern), forward_only, mode, inputs, repl)
    prog = cache.get(k)
    if prog is None:
        prog = cache[k] = _Program(mox, plan, mode, inputs, repl)
    return prog


def capture_programs(mox: Mox) -> dict[str, Any]:
    """The jitted programs `capture` and `patch` keep for ``mox`` (each with
    ``traces``, how many times it was traced: once per argument shapes)."""
    return kept(mox, "capture.programs") or {}


def check_root(mox: Any, what: str) -> None:
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        got = f"a `{mox.kind}` node" if isinstance(mox, Mox) else f"a `{type(mox).__name__}`"
        raise NotARootMox(what, got, "Pass the whole MoX and select nodes with the pattern.")


def grads_of(plan: Plan, cts: dict[str, list[Any]]) -> dict[str, Any]:
    """Each target's cotangents shaped as its value; an integer output's is
    float0 zeros, as ``jax.grad(..., allow_int=True)`` gives."""
    out = {}
    for t in plan.targets.values():
        flat = [np.zeros(s.shape, jax.dtypes.float0) if c is None else c for c, s in zip(cts[t.key], t.expected())]
        out[t.key] = t.results(flat)
    return out


def values_of(plan: Plan, got: dict[str, Any], inputs: bool) -> dict[str, Any]:
    out = {}
    for t in plan.targets.values():
        g = got[t.key]
        value = t.results(g["out"])
        out[t.key] = (tuple(g.get("in", ())), value) if inputs else value
    return out
