"""Seeing inside a model: `capture` the values at matched nodes, `patch` them,
and find the `first_nonfinite` value.

All three evaluate the MoX with `_eval.run` and a `Hooks` subclass that looks
at (or replaces) values as calls and equations finish. Matched nodes may sit
inside nested computations; those on the way down are evaluated so that the
values come out:

* ``jit`` bodies are evaluated in place (XLA inlines them anyway);
* ``remat`` bodies run under ``jax.checkpoint`` with the same policy, the
  values leaving as extra outputs;
* ``scan`` bodies run under ``jax.lax.scan``, the values leaving as extra
  ``ys``, stacked along the scan axis (patches enter as extra ``xs``).

Everything else is bound as traced, so a program that captures nothing extra
is the original one. Loops of unknown length (``while``), branches
(``cond``) and custom derivative rules cannot give values out; a match inside
them is refused with the reason. The NaN search is forward only, so it also
looks inside custom derivative rules.

Programs are jitted once per MoX, pattern and mode, and kept while the MoX
lives (like `compare`'s): a sweep over patch values compiles once.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _calls, errors
from ._eval import Hooks, bind, flatten_inputs, run, unflatten_outputs
from ._ir import CALL_KINDS, Equation, Kind, Mox
from ._vocab import type_str
from .errors import YaxCaptureError, YaxInputError

Node = Equation | Mox



def capture_keys(mox: Mox) -> dict[int, str]:
    """``id(node)`` -> the key `capture` gives its values (`yax._calls.keys`:
    the one key scheme `compare`, `patch` and the explorer use too)."""
    return _calls.keys(mox)


# -- the plan: which nodes, where, and how to reach them -------------------------------

@dataclasses.dataclass(frozen=True)
class _Target:
    key: str
    node: Node
    scans: tuple[int, ...]      # ids of the scan equations around it, outermost first
    stack: tuple[int, ...]      # their lengths: the leading axes of its stacked values

    def results(self, flat: list[Any]) -> Any:
        """The node's output as the model's code sees it (a call's result pytree)."""
        n = self.node
        if isinstance(n, Mox) and n.sig.outs.tree is not None:
            return n.sig.results(flat)
        return flat[0] if len(flat) == 1 else tuple(flat)

    def expected(self) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct((*self.stack, *a.shape), a.dtype) for a in self.node.outputs]


@dataclasses.dataclass(frozen=True)
class _Plan:
    targets: dict[int, _Target]               # id(node) -> target, in evaluation order
    descend: dict[int, str]                   # id(equation) -> "inline" | "remat" | "scan"

    def inside(self, eqn: Equation) -> set[str]:
        return {t.key for t in self.targets.values() if id(eqn) in t.scans}


def _selected(pattern: Any, mox: Mox, what: str) -> list[Node]:
    from ._xpath import explain, selected

    found = selected(pattern, mox, what, YaxCaptureError)
    nodes = [n for n in found if isinstance(n, Equation) or (isinstance(n, Mox) and n.kind in CALL_KINDS)]
    if len(nodes) < len(found) and any(not isinstance(n, (Mox, Equation)) for n in found):
        bad = next(n for n in found if not isinstance(n, (Mox, Equation)))
        raise YaxCaptureError(f"`{what}` works on calls and equations of a MoX, but the pattern gave `{bad!r}`.")
    if not nodes:
        raise errors.NothingToCapture(pattern, explain(pattern, mox) if isinstance(pattern, str) else "", what)
    return nodes


def _plan(pattern: Any, mox: Mox, what: str, forward_only: bool = False) -> _Plan:
    return plan_of(_selected(pattern, mox, what), mox, what, pattern, forward_only)


def plan_of(nodes: Sequence[Node], mox: Mox, what: str, pattern: Any = None,
            forward_only: bool = False) -> _Plan:
    """The plan reaching ``nodes`` of ``mox`` (refused, saying why, when one
    runs where its values cannot come out)."""
    wanted = {id(n) for n in nodes}
    key = capture_keys(mox)
    targets: dict[int, _Target] = {}
    descend: dict[int, str] = {}
    # Walk without recursion: each frame is (children, chain of (equation, how) above them).
    stack: list[tuple[Any, tuple]] = [(iter(mox.children), ())]
    while stack:
        it, chain = stack[-1]
        c = next(it, None)
        if c is None:
            stack.pop()
            continue
        if id(c) in wanted and id(c) not in targets:
            for eqn, how in chain:
                if how not in ("inline", "remat", "scan"):
                    raise _refused(pattern, c, eqn, how, what)
                descend[id(eqn)] = how
            scans = tuple(e for e, how in chain if how == "scan")
            targets[id(c)] = _Target(key[id(c)], c, tuple(id(e) for e in scans),
                                     tuple(e.params["length"] for e in scans))
        if isinstance(c, Equation):
            how = _how(c, forward_only)
            for _, s in reversed(c.subs):
                stack.append((iter(s.children), (*chain, (c, how))))
        else:
            stack.append((iter(c.children), chain))
    missing = [n for n in nodes if id(n) not in targets]
    if missing:
        raise YaxCaptureError(
            f"{errors.where(missing[0]).capitalize()} is not part of this MoX, so `{what}` cannot find its values. "
            "Query the MoX you evaluate."
        )
    return _Plan(targets, descend)


def capturable_calls(mox: Mox) -> list[Mox]:
    """The call nodes of ``mox`` whose outputs `capture` can bring out, in
    the order they finish: every call except those inside ``while``, ``cond`` and
    custom-derivative bodies (which `capture` refuses, saying why)."""
    idx = _calls.index(mox)
    return [c for c in idx.calls.values() if idx.positions[id(c)].blocked is None]


def _how(eqn: Equation, forward_only: bool) -> str:
    rule = _calls.how(eqn)
    if rule == "custom":  # the forward pass alone may look inside a custom rule's primal
        return "inline" if forward_only and len(eqn.subs) == 1 else "custom"
    return rule


def _refused(pattern: Any, node: Node, eqn: Equation, how: str, what: str) -> YaxCaptureError:
    why = _calls.WHY.get(how) or (f"`{what}` brings values out of `scan`, `remat` and `jit` bodies only, and `{eqn.name}` "
                            "is none of these")
    shown = f"`{pattern}`" if isinstance(pattern, str) else "given"
    return YaxCaptureError(
        f"The pattern {shown} matched {errors.where(node)}, which runs inside the `{eqn.name}` in "
        f"`{eqn.path or 'the root'}`: {why}. Match a node outside it, or the `{eqn.name}` equation itself "
        f"(`//{eqn.name}`), whose outputs `{what}` can use."
    )


# -- evaluation with hooks -------------------------------------------------------------

class _Watch(Hooks):
    """Captures or patches the targets at one level of nesting (the root, or
    one step of a scan body); ``got[key]`` holds ``{"in": [...], "out": [...]}``."""

    def __init__(self, plan: _Plan, mode: str, inputs: bool, patches: dict[str, list], repl: Any, arg: Any,
                 step: tuple):
        self.plan, self.mode, self.inputs = plan, mode, inputs
        self.patches, self.repl, self.arg, self.step = patches, repl, arg, step
        self.got: dict[str, dict[str, list]] = {}

    def child(self, patches: dict[str, list], step: tuple) -> _Watch:
        return _Watch(self.plan, self.mode, self.inputs, patches, self.repl, self.arg, step)

    def enter(self, call: Mox, values: list[Any]) -> None:
        t = self.plan.targets.get(id(call))
        if t is not None and self.inputs:
            self.got.setdefault(t.key, {})["in"] = list(values)

    def leave(self, call: Mox, values: list[Any]) -> list[Any]:
        t = self.plan.targets.get(id(call))
        return values if t is None else self._done(t, values)

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        how = self.plan.descend.get(id(eqn))
        outs = bind(eqn, values) if how is None else _DESCEND[how](self, eqn, values)
        t = self.plan.targets.get(id(eqn))
        if t is None:
            return outs
        if self.inputs:
            self.got.setdefault(t.key, {})["in"] = list(values)
        return self._done(t, outs)

    def _done(self, t: _Target, values: list[Any]) -> list[Any]:
        if self.mode == "capture":
            self.got.setdefault(t.key, {})["out"] = list(values)
            return values
        if self.mode == "measure":  # `compare`: one flat float32 array per node
            self.got[t.key] = {"out": [jnp.concatenate([jnp.ravel(v).astype(jnp.float32) for v in values])]}
            return values
        if self.mode == "arrays":
            new = self.patches.get(t.key)
            return values if new is None else list(new)
        return _replaced(t, self.repl, values, self.arg, self.step)


def _inline(w: Hooks, eqn: Equation, values: list[Any]) -> list[Any]:
    (_, body), = eqn.subs
    return run(body, values, hooks=w)


def _remat(w: _Watch, eqn: Equation, values: list[Any]) -> list[Any]:
    (_, body), = eqn.subs
    inner = {k: v for k, v in w.patches.items() if k in _inside_remat(w.plan, eqn)}

    def f(vals: list, patches: dict) -> tuple:
        child = w.child(patches, w.step)
        return run(body, vals, hooks=child), child.got

    p = eqn.params
    outs: list[Any]
    outs, got = jax.checkpoint(f, prevent_cse=p.get("prevent_cse", True), policy=p.get("policy"))(list(values), inner)
    w.got.update(got)
    return outs


def _inside_remat(plan: _Plan, eqn: Equation) -> set[str]:
    ids = {id(n) for n in eqn.subs[0][1].walk()}
    return {t.key for i, t in plan.targets.items() if i in ids}


def _scan(w: _Watch, eqn: Equation, values: list[Any]) -> list[Any]:
    (_, body), = eqn.subs
    p = eqn.params
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    consts, init, xs = list(values[:nc]), list(values[nc:nc + nk]), list(values[nc + nk:])
    inside = w.plan.inside(eqn)
    inner = {k: v for k, v in w.patches.items() if k in inside}
    steps = jnp.arange(length, dtype=jnp.int32) if w.mode == "fn" and _wants_step(w.repl) else None

    def step(carry: list, x: tuple) -> tuple:
        xs_i, patches_i, i = x
        child = w.child(patches_i, w.step if i is None else (*w.step, i))
        outs = run(body, [*consts, *carry, *xs_i], hooks=child)
        return outs[:nk], (outs[nk:], child.got)

    ys: list[Any]
    got: dict[str, dict[str, list[Any]]]
    carry, (ys, got) = jax.lax.scan(step, init, (xs, inner, steps), length=length, reverse=p.get("reverse", False),
                                    unroll=p.get("unroll", 1))
    w.got.update(got)
    return [*carry, *ys]


_DESCEND: dict[str, Callable] = {"inline": _inline, "remat": _remat, "scan": _scan}


def _positional(fn: Callable) -> tuple[int, bool]:
    """How many positional arguments ``fn`` takes (a large number for ``*args``), and whether it takes ``step``."""
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2, False
    if any(p.kind == p.VAR_POSITIONAL for p in ps):
        return 99, any(p.name == "step" for p in ps)
    pos = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "step"]
    return len(pos), any(p.name == "step" for p in ps)


def _wants_step(fn: Callable) -> bool:
    return _positional(fn)[1]


def _replaced(t: _Target, repl: Callable, values: list[Any], arg: Any, step: tuple) -> list[Any]:
    """``repl(path, value[, arg][, step=])`` at one target, checked to fit."""
    n, wants_step = _positional(repl)
    call_args = (t.key, t.results(values), arg)[: 3 if n >= 3 else 2]
    new = repl(*call_args, **({"step": step} if wants_step else {}))
    flat = _fitted(t, new, what=f"`{getattr(repl, '__name__', 'repl')}` returned", stacked=False)
    return flat


def _fitted(t: _Target, value: Any, what: str, stacked: bool) -> list[Any]:
    """The traced leaves of ``value`` given for target ``t``'s output, checked:
    the same structure, shapes and dtypes (stacked along the scan axes when
    ``stacked``)."""
    node = t.node
    want = t.expected() if stacked else [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in node.outputs]
    sig = node.sig.outs if isinstance(node, Mox) else None
    leaves, tree = jax.tree_util.tree_flatten(value)
    if sig is not None and sig.tree is not None and tree == sig.tree:
        leaves = [leaves[i] for i in sig.dyn]
    elif len(want) == 1 and len(leaves) == 1:
        pass  # one array for a node with one traced output (`(x, None)` given as `x`)
    elif len(leaves) != len(want) or (sig is not None and sig.tree is not None):
        shown = t.results([_Shown(w) for w in want])
        raise YaxCaptureError(
            f"{what} `{_tree_str(value)}` for `{t.key}`, but the node's output is `{_tree_str(shown)}`. "
            "Give a value of the same structure, such as the one `yax.capture` returns for this key."
        )
    for i, (x, w) in enumerate(zip(leaves, want)):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is None or dtype is None or tuple(shape) != tuple(w.shape) or np.dtype(dtype) != np.dtype(w.dtype):
            found = type_str(x) if shape is not None and dtype is not None else f"a `{type(x).__name__}`"
            part = f" (output {i})" if len(want) > 1 else ""
            scan = (f" It runs inside a scan, so its values are stacked along {len(t.stack)} leading "
                    f"ax{'e' if len(t.stack) == 1 else 'i'}s of the scan length{'s' * (len(t.stack) > 1)}."
                    if stacked and t.stack else "")
            raise YaxCaptureError(
                f"{what} {found} for `{t.key}`{part}, but the node's output there is {type_str(w)}.{scan} "
                "Give an array of that shape and dtype (cast with `.astype`), such as the value `yax.capture` "
                "returns for this key."
            )
    return list(leaves)


class _Shown:
    def __init__(self, s: jax.ShapeDtypeStruct):
        self.s = s

    def __repr__(self) -> str:
        return type_str(self.s)


def _tree_str(x: Any) -> str:
    def show(v: Any) -> Any:
        if isinstance(v, _Shown):
            return v
        return _Shown(v) if hasattr(v, "shape") and hasattr(v, "dtype") else v

    return str(jax.tree_util.tree_map(show, x, is_leaf=lambda v: isinstance(v, _Shown)))[:200]


# -- programs, cached per MoX ------------------------------------------------------------

class _Program:
    """One jitted evaluation of a MoX with a plan: ``(flat inputs, patches,
    arg) -> (flat outputs, got)``; ``traces`` counts how often it was traced."""

    def __init__(self, mox: Mox, plan: _Plan, mode: str, inputs: bool, repl: Any):
        self.plan, self.traces = plan, 0
        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(flat: list, patches: dict, arg: Any) -> tuple:
            self.traces += 1
            w = _Watch(plan, mode, inputs, patches, repl, arg, ())
            root = ref()
            assert root is not None  # the program is cached with its MoX and dies with it
            return run(root, flat, hooks=w), w.got

        self.jitted = jax.jit(program)

    def __call__(self, flat: list, patches: dict, arg: Any) -> tuple:
        out: tuple = self.jitted(flat, patches, arg)
        return out


def watched(mox: Mox, plan: _Plan, mode: str, flat: list) -> tuple[list, dict]:
    """Evaluate ``mox`` on ``flat`` with ``plan``'s targets watched in ``mode``
    (``"capture"``, or ``"measure"``: one flat float32 array per target);
    ``(flat outputs, got)``."""
    w = _Watch(plan, mode, False, {}, None, None, ())
    return run(mox, flat, hooks=w), w.got


_plans: weakref.WeakKeyDictionary[Mox, dict[Any, _Plan]] = weakref.WeakKeyDictionary()
_programs: weakref.WeakKeyDictionary[Mox, dict[Any, _Program]] = weakref.WeakKeyDictionary()


def _pattern_key(pattern: Any) -> Any:
    if isinstance(pattern, str):
        return pattern
    if isinstance(pattern, (list, tuple)):
        return ("nodes", *(id(n) for n in pattern))
    return ("nodes", id(pattern))


def _cached_plan(pattern: Any, mox: Mox, what: str, forward_only: bool = False) -> _Plan:
    cache = _plans.setdefault(mox, {})
    k = (_pattern_key(pattern), forward_only)
    plan = cache.get(k)
    if plan is None:
        plan = cache[k] = _plan(pattern, mox, what, forward_only)
    return plan


def _program(mox: Mox, pattern: Any, plan: _Plan, mode: str, inputs: bool = False, repl: Any = None,
             forward_only: bool = False) -> _Program:
    cache = _programs.setdefault(mox, {})
    k = (_pattern_key(pattern), forward_only, mode, inputs, repl)
    prog = cache.get(k)
    if prog is None:
        prog = cache[k] = _Program(mox, plan, mode, inputs, repl)
    return prog


def capture_programs(mox: Mox) -> dict:
    """The jitted programs `capture` and `patch` keep for ``mox`` (each with
    ``traces``, how many times it was traced: once per argument shapes)."""
    return _programs.get(mox, {})


def _root(mox: Any, what: str) -> None:
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        got = f"a `{mox.kind}` node" if isinstance(mox, Mox) else f"a `{type(mox).__name__}`"
        raise YaxInputError(
            f"`{what}` expected the root MoX returned by `yax.make_mox(fn)(...)`, but got {got}. "
            "Pass the whole MoX and select nodes with the pattern."
        )


def _values(plan: _Plan, got: dict, inputs: bool) -> dict[str, Any]:
    out = {}
    for t in plan.targets.values():
        g = got[t.key]
        value = t.results(g["out"])
        out[t.key] = (tuple(g.get("in", ())), value) if inputs else value
    return out


# -- the public functions ----------------------------------------------------------------

def capture(pattern: Any, mox: Mox, *args: Any, with_inputs: bool = False, **kwargs: Any) -> tuple[Any, dict]:
    """Run ``mox`` and bring out the values at the nodes ``pattern`` selects.

    Nothing is changed: ``out`` is what `eval_mox` returns. The program is
    jitted once per MoX and pattern (and kept while the MoX lives); `capture`
    is pure, so it also works under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

    Args:
      pattern: an XPath (``'//module_call[@type="Block"]'``, ``'//activation'``,
        ``'//dot_general'``), a node, or a list of nodes of ``mox``.
      mox: the root MoX.
      *args, **kwargs: the arguments, as for ``eval_mox(mox, *args, **kwargs)``.
      with_inputs: also give each node's inputs.

    Returns:
      ``(out, values)``. ``values`` maps each matched node's key to its output,
      in evaluation order: the key is the call's path (``GPT/Block_3``;
      ``path.method`` for a method other than ``__call__``), an equation's
      ``path:primitive``; a module called several times gives ``path``,
      ``path#2``, ``path#3``… in call order. A call's value is what the call
      returned (its pytree), an equation's its output (a tuple when it has
      several). Nodes inside a ``scan`` body (``nn.scan``, ``nnx.scan``) give
      their values of every step, stacked along a leading axis (one per
      enclosing scan). With ``with_inputs``, each value is ``(inputs, output)``,
      ``inputs`` being the tuple of arrays the node received (a call's traced
      arguments in order, an equation's operands).

    Raises:
      YaxCaptureError: the pattern matches nothing (with `yax.explain`'s
        account), or a matched node runs inside a ``while`` loop, a ``cond``
        branch or a custom derivative rule, whose values cannot come out.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((3, 5))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> out, values = yax.capture('//module_call[@type="Dense"] | //activation', mox, p, x)
      >>> {k: v.shape for k, v in values.items()}
      {'Sequential/layers_0': (3, 4), 'Sequential/relu': (3, 4), 'Sequential/layers_2': (3, 2)}
      >>> float((values['Sequential/relu'] == 0).mean()) <= 1.0   # the fraction of dead units
      True
    """
    _root(mox, "capture")
    plan = _cached_plan(pattern, mox, "capture")
    prog = _program(mox, pattern, plan, "capture", bool(with_inputs))
    outs, got = prog(flatten_inputs(mox, args, kwargs), {}, None)
    return unflatten_outputs(mox, outs), _values(plan, got, bool(with_inputs))


def patch(pattern: Any, mox: Mox, repl: Callable | None = None) -> Callable[..., Any]:
    """A function running ``mox`` with the outputs of the nodes ``pattern``
    selects replaced: activation patching, ablation, steering.

    The replacement values are an argument of the returned function, so a
    sweep over them (layers, positions, scales) compiles once.

    Args:
      pattern: an XPath, a node, or a list of nodes of ``mox`` (as for `capture`).
      mox: the root MoX.
      repl: ``None`` to replace outputs by given values; or a function
        ``repl(path, value)`` or ``repl(path, value, arg)`` returning the new
        output of each matched node (same structure, shapes and dtypes) from
        its key, its value and the ``arg`` given to the returned function. A
        node inside a scan body sees one step's value; a ``repl`` with a
        parameter named ``step`` also gets the step indices (a tuple of int32
        scalars, outermost scan first, ``()`` outside scans).

    Returns:
      ``patched(values, *args, **kwargs) -> out``. Without ``repl``, ``values``
      maps keys (as `capture` gives them) to new outputs: every key or some of
      them (each set of keys compiles once), stacked along the scan axes for
      nodes inside scans (as `capture` gives them); they are checked against
      the nodes' shapes and dtypes before anything runs. With ``repl``,
      ``values`` is any pytree, passed on as ``arg``.

    Raises:
      YaxCaptureError: as `capture`; and when a value does not fit its node
        (which key, expected and found) or names a key the pattern did not match.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((3, 5))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> ablate = yax.patch('//activation[@name="relu"]', mox)   # replace by given values
      >>> out = ablate({"Sequential/relu": jnp.zeros((3, 4))}, p, x)
      >>> bool(jnp.allclose(out, p["params"]["layers_2"]["bias"]))
      True
      >>> steer = yax.patch('//*[@path="Sequential/layers_0"]', mox, lambda path, h, v: h + v)
      >>> steer(jnp.zeros(4), p, x).shape                       # the vector is an argument
      (3, 2)
    """
    _root(mox, "patch")
    if repl is not None and not callable(repl):
        raise YaxCaptureError(
            f"`repl` must be `None` (values given to the returned function) or a function `repl(path, value)`, "
            f"but got a `{type(repl).__name__}`. To patch with arrays, pass them to the returned function."
        )
    plan = _cached_plan(pattern, mox, "patch")
    prog = _program(mox, pattern, plan, "arrays" if repl is None else "fn", repl=repl)
    by_key = {t.key: t for t in plan.targets.values()}

    def patched(values: Any, *args: Any, **kwargs: Any) -> Any:
        flat = flatten_inputs(mox, args, kwargs)
        if repl is not None:
            outs, _ = prog(flat, {}, values)
            return unflatten_outputs(mox, outs)
        if not isinstance(values, Mapping):
            raise YaxCaptureError(
                f"The patched function takes a dict of new outputs by key (such as `yax.capture` returns) as its "
                f"first argument, but got a `{type(values).__name__}`. Pass `{{{next(iter(by_key))!r}: value}}`, "
                "or give `yax.patch` a function `repl(path, value)`."
            )
        unknown = [k for k in values if k not in by_key]
        if unknown:
            known = ", ".join(f"`{k}`" for k in list(by_key)[:8]) + (" …" if len(by_key) > 8 else "")
            raise YaxCaptureError(
                f"The patch names `{unknown[0]}`, which the pattern did not match (it matched {known}). Use the "
                "keys `yax.capture` gives for the same pattern."
            )
        patches = {k: _fitted(by_key[k], v, "The patch gives", stacked=True) for k, v in values.items()}
        outs, _ = prog(flat, patches, None)
        return unflatten_outputs(mox, outs)

    patched.__name__ = patched.__qualname__ = f"patched_{mox.name or 'mox'}"
    return patched


# -- the first non-finite value --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ValueStats:
    """Statistics of one array: its type, the range, mean and standard
    deviation of its finite values, and counts of NaN, ±Inf and zeros."""

    type: str
    min: float
    max: float
    mean: float
    std: float
    nan: int
    posinf: int
    neginf: int
    zeros: int
    size: int

    @classmethod
    def of(cls, x: Any) -> ValueStats:
        a = np.asarray(x)
        size = int(a.size)
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
            return cls(type_str(x), np.nan, np.nan, np.nan, np.nan, 0, 0, 0, 0, size)
        f = a.astype(np.float64) if not np.iscomplexobj(a) else np.abs(a).astype(np.float64)
        fin = f[np.isfinite(f)]

        def stat(g: Callable[[Any], Any]) -> float:
            return float(g(fin)) if fin.size else float("nan")

        return cls(type_str(x), stat(np.min), stat(np.max), stat(np.mean), stat(np.std), int(np.isnan(f).sum()),
                   int(np.isposinf(f).sum()), int(np.isneginf(f).sum()), int((f == 0).sum()), size)

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def __str__(self) -> str:
        bad = [f"{n} {w}" for n, w in ((self.nan, "NaN"), (self.posinf, "+Inf"), (self.neginf, "-Inf")) if n]
        if self.nonfinite == self.size and self.size:
            return f"{self.type}  no finite values ({', '.join(bad)})"
        return (f"{self.type}  min {self.min:.4g}  max {self.max:.4g}  mean {self.mean:.4g}  std {self.std:.4g}"
                + (f"  ({', '.join(bad)} of {self.size})" if bad else ""))


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """Where a model's first NaN or Inf comes from (`first_nonfinite`).

    Attributes:
      equation: the first equation, in evaluation order, whose output holds a
        NaN or an Inf (``None`` when an argument holds one already).
      call: the innermost call it ran in (a module call or activation;
        ``None`` at the root).
      path: that call's path, or the argument's name (``args[1]``).
      step: the scan steps it ran in, outermost scan first (``()`` outside scans).
      output: statistics of the non-finite output at that step.
      inputs: statistics of the equation's inputs at that step.
      call_inputs: statistics of the call's inputs at that step.
      window: the printed MoX around the equation, marked with ``>>>``.
      reader: when an argument holds the NaN or Inf: the first equation that reads it
        (``call`` is the call it runs in, ``step`` the layers of a stacked argument that
        hold non-finite values, when a scan slices it per step).
    """

    equation: Equation | None
    call: Mox | None
    path: str
    step: tuple[int, ...]
    output: ValueStats
    inputs: tuple[ValueStats, ...] = ()
    call_inputs: tuple[ValueStats, ...] = ()
    window: str = dataclasses.field(default="", repr=False)
    reader: Equation | None = dataclasses.field(default=None, repr=False)

    def __str__(self) -> str:
        at = f" at scan step {', '.join(map(str, self.step))}" if self.step else ""
        if self.equation is None:
            head = f"The argument `{self.path}` already holds non-finite values: {self.output}"
            if self.step:
                head += (f"\n  They are in layer {self.step[0]} of the stack (the scan slices the argument per step; "
                         f"step {self.step[0]} is the first to read them).")
            if self.reader is not None:
                who = f"`{self.call.path}` ({self.call.type})" if self.call is not None else "the root"
                head += f"\n  The first to read it is `{self.reader.name}` in {who}."
            return head + (f"\n\n{self.window}" if self.window else "")
        lines = [f"The first non-finite value comes from `{self.equation.name}` in `{self.path or 'the root'}`{at}.",
                 f"  output   {self.output}"]
        lines += [f"  input {i}  {s}" for i, s in enumerate(self.inputs)]
        if self.call is not None:
            lines.append(f"  inputs of `{self.call.path}` ({self.call.type}):")
            lines += [f"    {i}  {s}" for i, s in enumerate(self.call_inputs)]
        if self.window:
            lines += ["", self.window]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def _bad(x: Any) -> Any:
    return jnp.any(~jnp.isfinite(x))


def _inexact(a: Any) -> bool:
    return jnp.issubdtype(a.dtype, jnp.inexact)


class _Flags(Hooks):
    """Flags every inexact equation output that holds a NaN or an Inf, in
    evaluation order. ``entries`` (static) says what each flag stands for; a
    scan's body gives a level of its own, its flags stacked per step."""

    def __init__(self) -> None:
        self.flags: list[Any] = []
        self.subs: list[Any] = []
        self.entries: list[tuple] = []

    def level(self) -> tuple:
        flags = jnp.stack(self.flags) if self.flags else jnp.zeros((0,), bool)
        return flags, tuple(self.subs)

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        how = _how(eqn, forward_only=True)
        if how in ("inline", "remat"):
            (_, body), = eqn.subs
            return run(body, values, hooks=self)
        if how == "scan":
            return self._scan(eqn, values)
        outs = bind(eqn, values)
        for i, (o, v) in enumerate(zip(outs, eqn.outputs)):
            if _inexact(v):
                self.entries.append(("eq", eqn, len(self.flags), i))
                self.flags.append(_bad(o))
        return outs

    def _scan(self, eqn: Equation, values: list[Any]) -> list[Any]:
        (_, body), = eqn.subs
        p = eqn.params
        nc, nk = p["num_consts"], p["num_carry"]
        consts, init, xs = list(values[:nc]), list(values[nc:nc + nk]), list(values[nc + nk:])
        inner: list[list] = []

        def step(carry: list, x: list) -> tuple:
            child = _Flags()
            outs = run(body, [*consts, *carry, *x], hooks=child)
            inner[:] = [child.entries]
            return outs[:nk], (outs[nk:], child.level())

        ys: list[Any]
        level: tuple[Any, ...]
        carry, (ys, level) = jax.lax.scan(step, init, xs, length=p["length"], reverse=p.get("reverse", False),
                                          unroll=p.get("unroll", 1))
        self.entries.append(("scan", eqn, len(self.subs), inner[0], bool(p.get("reverse", False))))
        self.subs.append(level)
        return [*carry, *ys]


class _Search:
    """The jitted flagging program of one MoX; ``entries`` is set when it is traced."""

    def __init__(self, mox: Mox):
        self.entries: list[tuple] = []
        self.args: list[int] = []
        self.traces = 0
        ref = weakref.ref(mox)

        def program(flat: list) -> tuple:
            self.traces += 1
            top = _Flags()
            root = ref()
            assert root is not None  # the program is cached with its MoX and dies with it
            self.args = [i for i, v in enumerate(root.invars) if _inexact(v)]
            arg_flags = [_bad(flat[i]) for i in self.args]
            run(root, flat, hooks=top)
            self.entries = top.entries
            return jnp.stack(arg_flags) if arg_flags else jnp.zeros((0,), bool), top.level()

        self.jitted = jax.jit(program)


_searches: weakref.WeakKeyDictionary[Mox, _Search] = weakref.WeakKeyDictionary()


def _first(entries: list[tuple], level: tuple) -> tuple[tuple, tuple[int, ...]] | None:
    """The first flagged entry, in evaluation order, and its scan steps."""
    flags, subs = level
    for e in entries:
        if e[0] == "eq":
            if flags[e[2]]:
                return e, ()
            continue
        _, eqn, j, body, reverse = e
        sub = subs[j]
        leaves = jax.tree_util.tree_leaves(sub)
        length = eqn.params["length"]
        bad = np.zeros(length, bool)
        for leaf in leaves:
            bad |= np.asarray(leaf).reshape(length, -1).any(axis=1)
        order = range(length - 1, -1, -1) if reverse else range(length)
        s = next((s for s in order if bad[s]), None)
        if s is not None:
            found = _first(body, jax.tree_util.tree_map(lambda a, s=s: a[s], sub))
            if found is not None:
                return found[0], (s, *found[1])
    return None


def _innermost_call(mox: Mox, eqn: Equation) -> Mox | None:
    """The innermost call node around ``eqn`` (through nested computations)."""
    stack: list[tuple[Any, Mox | None]] = [(iter(mox.children), None)]
    while stack:
        it, call = stack[-1]
        c = next(it, None)
        if c is None:
            stack.pop()
            continue
        if c is eqn:
            return call
        if isinstance(c, Equation):
            stack.extend((iter(s.children), call) for _, s in c.subs)
        else:
            stack.append((iter(c.children), c if c.kind in CALL_KINDS else call))
    return None


def _first_reader(mox: Mox, var: Any) -> tuple[Equation | None, Equation | None]:
    """The first equation, in program order, that reads ``var`` (an input of ``mox``) for
    what it computes, following it into nested computations and calls; and the scan that
    slices it per step on the way, if one does."""
    alias: dict[Any, Equation | None] = {var: None}  # var -> the scan slicing it on the way
    for n in mox.walk():
        if isinstance(n, Mox):
            for formal, actual in zip(n.invars, n.inputs):
                if actual in alias:
                    alias[formal] = alias[actual]
            continue
        read = [(j, a) for j, a in enumerate(n.inputs) if a in alias]
        if not read:
            continue
        subs = n.subs
        if not subs or n.name == "while":
            return n, next((alias[a] for _, a in read if alias[a] is not None), None)
        offset = 1 if n.name == "cond" else 0  # a cond's first input picks the branch
        for _, sub in subs:
            for j, a in read:
                k = j - offset
                if 0 <= k < len(sub.invars):
                    sliced = n if n.name == "scan" and k >= n.params["num_consts"] + n.params["num_carry"] else None
                    alias[sub.invars[k]] = alias[a] or sliced
    return None, None


def _bad_argument(mox: Mox, i: int, value: Any, name: str) -> NonFinite:
    """A `NonFinite` for argument ``i`` holding NaN or Inf: the first equation reading it and
    its call, and for an argument a scan slices per step (a stacked layer's weight), the
    first layer holding them."""
    from ._print import window

    reader, scan = _first_reader(mox, mox.invars[i])
    step: tuple[int, ...] = ()
    if scan is not None:
        a = np.asarray(value)
        bad = ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)
        order = range(a.shape[0] - 1, -1, -1) if scan.params.get("reverse", False) else range(a.shape[0])
        step = (next(s for s in order if bad[s]),)
    call = _innermost_call(mox, reader) if reader is not None else None
    return NonFinite(None, call, name, step, ValueStats.of(value), window=window(mox, reader) if reader else "",
                     reader=reader)


def first_nonfinite(mox: Mox, *args: Any, **kwargs: Any) -> NonFinite | None:
    """Find where a NaN or an Inf first appears when ``mox`` runs on these arguments.

    Runs ``mox`` once (jitted, compiled once per MoX), flagging every floating
    output of every equation, inside ``jit``, ``remat``, custom-derivative and
    ``scan`` bodies too (per step); then a second program brings out the
    inputs of the first flagged equation. Unlike ``jax_debug_nans`` it sees
    inside scans, reports Inf as well, says which scan step, and names the
    module; ``jax_debug_nans``/``jax_debug_infs`` are switched off while it runs.
    ``while`` loops and ``cond`` branches are looked at from outside only.

    Args:
      mox: the root MoX.
      *args, **kwargs: the arguments, as for `eval_mox`.

    Returns:
      A `NonFinite` (printed, it shows the equation, the module, the scan step,
      statistics of the inputs and the MoX around it), or ``None`` when every
      value is finite.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> class Net(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x):
      ...         return nn.Dense(2)(jnp.log(nn.Dense(3)(x)))
      >>> x = jnp.ones((1, 4)); p = Net().init(jax.random.key(0), x)
      >>> mox = yax.make_mox(Net().apply)(p, x)
      >>> found = yax.first_nonfinite(mox, p, x)
      >>> found.equation.name, found.path, found.inputs[0].min < 0
      ('log', 'Net', True)
    """
    _root(mox, "first_nonfinite")
    flat = flatten_inputs(mox, args, kwargs)
    search = _searches.get(mox)
    if search is None:
        search = _searches[mox] = _Search(mox)
    with jax.debug_nans(False), jax.debug_infs(False):
        arg_flags, level = jax.device_get(search.jitted(flat))
        if arg_flags.any():
            i = search.args[int(np.argmax(arg_flags))]
            keypath = jax.tree_util.tree_flatten_with_path((args, kwargs))[0][mox.dyn_in[i]][0]
            return _bad_argument(mox, i, flat[i], errors.arg_name(keypath))
        found = _first(search.entries, level)
        if found is None:
            return None
        (_, eqn, _, out_i), step = found
        call = _innermost_call(mox, eqn)
        nodes = [eqn] if call is None else [eqn, call]
        plan = _cached_plan(nodes, mox, "first_nonfinite", forward_only=True)
        prog = _program(mox, nodes, plan, "capture", inputs=True, forward_only=True)
        _, got = jax.device_get(prog(flat, {}, None))

    def at(x: Any) -> Any:
        return np.asarray(x)[step] if step else np.asarray(x)

    k = plan.targets[id(eqn)].key
    ins = tuple(ValueStats.of(at(v)) for v in got[k]["in"])
    out = ValueStats.of(at(got[k]["out"][out_i]))
    call_ins = tuple(ValueStats.of(at(v)) for v in got[plan.targets[id(call)].key]["in"]) if call else ()
    from ._print import window

    return NonFinite(eqn, call, eqn.path, tuple(step), out, ins, call_ins, window(mox, eqn))
