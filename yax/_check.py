"""`check_mox`: the invariants of a MoX, verified as ``jax.core.check_jaxpr``
verifies a jaxpr's; and the switch that runs it after every rewrite.

What is checked, in one walk without recursion (a MoX of any depth checks):

* **Scopes.** A root and each nested computation (a ``"jaxpr"`` node: a scan
  body, a ``cond`` branch, a ``jit`` callee) is one scope, as `eval_mox` runs
  it: its constants and parameters are bound first, then its children in
  order. A call node is evaluated in place in its caller's scope: it reads
  the caller's values like a closure (a module reads its parameters this
  way), binds its own constants and parameters, and what it binds stays
  bound after it (a BatchNorm's updated statistics leave its call as root
  outputs, not as call outputs). A nested computation sees nothing of the
  scope around it. Every value read must be bound before, in its scope;
  no value is bound twice in one scope (the rewrite engine's `unbound`
  follows the same rules).
* **Types.** Each equation's output shapes and dtypes are what its
  primitive computes from its inputs: JAX's own abstract evaluation re-derives
  them, the equations bound on abstract inputs (`eval_mox`'s `bind`) in one
  ``jax.make_jaxpr`` trace. An equation holding nested computations (``jit``,
  ``remat``, ``scan``, ``cond``, ``while``, custom derivatives) is typed by its
  primitive's typing rule instead (`NESTED`, as JAX's ``_scan_typecheck``
  &c.): what it passes each computation against the computation's
  parameters, what it needs of its results against them, its outputs from
  them; binding it would trace each changed computation again, and those
  nested in it inside that trace, as deep as they nest. An equation checked
  once is not checked again (nodes are immutable and rewrites share the nodes
  they keep), and equal equations (primitive, params, input types) share one
  result. Weak types are not compared, as JAX's ``typematch`` does not.
* **Boundaries.** A call's ``inputs`` and ``invars``, ``outvars`` and
  ``outputs``, ``constvars`` and ``consts`` agree in number, shape and dtype,
  and its signature (when it has one) in number: the traced leaves of its
  ``sig`` are its inputs and outputs. A root's parameters and results agree
  with its signature (``sig.ins``/``sig.outs``: traced and static leaves
  partition the treedef's leaves), and its ``shardings`` name its parameters.
  The JAX jaxpr an equation keeps to evaluate a nested computation by (one
  with no call in it) has that computation's parameter and result types.
* **Kinds and paths.** A root holds calls and equations; equations hold
  ``"jaxpr"`` nodes; each equation runs at its enclosing node's path, each
  nested computation at its equation's, and a ``method_call`` (a helper on
  the same module) at its caller's.

Paths are not unique per call, by design: a module called twice gives two
calls at one path (`yax.diff` tells them apart by their order), a helper
method shares its module's, and a linen module passed to a child is called
under the child at its owner's path. So no uniqueness or prefix rule is
checked.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import jax
import numpy as np

from ._calls import visit
from ._ir import CALL_KINDS, Equation, Kind, Literal, Mox, Packing, Symbol, Var
from ._vocab import type_str
from .errors import WrongType, YaxCheckError, YaxEvalError, where

Node = Equation | Mox
T = TypeVar("T")

#: The environment variable that makes `make_mox` and every rewrite check what it returns
#: (like ``JAX_ENABLE_CHECKS``); the tests set it.
ENV = "YAX_ENABLE_CHECKS"


def enabled() -> bool:
    """Whether ``YAX_ENABLE_CHECKS`` asks for checks (read on every call, so a test can set it)."""
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def check_if_enabled(result: T) -> T:
    """``result`` as it is, after `check_mox` of the root MoX in it (itself, or the first of a
    ``(mox, params)`` pair) when ``YAX_ENABLE_CHECKS`` is set: the one hook `make_mox` and the
    public rewrites return through."""
    if enabled():
        root = result[0] if isinstance(result, tuple) and result else result
        if isinstance(root, Mox) and root.kind == Kind.ROOT:
            check_mox(root)
    return result


def check_mox(mox: Mox) -> None:
    """Verify that ``mox`` is well formed, as ``jax.core.check_jaxpr`` does a jaxpr.

    Checks that every value is bound before it is read and once only in its
    scope (a root or nested computation; calls read their caller's values
    like closures), that each equation's output shapes and dtypes are what
    JAX's abstract evaluation of its primitive gives for its inputs, that each
    call's inputs, outputs and constants agree with its parameters, results
    and signature, that the root agrees with its signature, and that
    equations and nested computations run at their enclosing node's path. A
    MoX from `make_mox` or a yax rewrite always passes: run it on trees you
    build or change by hand (with `map_mox` or ``dataclasses.replace``). With
    the environment variable ``YAX_ENABLE_CHECKS=1``, `make_mox` and every
    rewrite (`sub`, `mixed_precision`, `merge_lora`, `map_mox`) check what
    they return, as JAX's ``JAX_ENABLE_CHECKS`` does.

    Args:
      mox: a root MoX, or a nested computation (a ``"jaxpr"`` node). Given a
        call node, the values it reads from its caller cannot be checked: any
        value it does not bind itself is taken as read from its caller.

    Raises:
      YaxCheckError: the first fault found, naming the node and showing the
        printed IR around it.

    Example:
      >>> import dataclasses, jax.numpy as jnp, yax
      >>> mox = yax.make_mox(lambda x: jnp.sin(x) * 2)(jnp.ones(3))
      >>> yax.check_mox(mox)
      >>> sin, mul = mox.children
      >>> bad = dataclasses.replace(mox, children=(mul, sin))  # reads `sin`'s result before it is computed
      >>> yax.check_mox(bad)
      Traceback (most recent call last):
      ...
      yax.errors.YaxCheckError: The MoX is not well formed: the equation `mul` at `the root` reads `b` (f32[3]), ...
    """
    if not isinstance(mox, Mox):
        raise WrongType("mox", "a `Mox` (what `yax.make_mox(fn)(...)` returns)", mox)
    if mox in _passed:
        return
    checker = _Checker(mox)
    checker.walk()
    checker.types()
    with _lock:
        _passed.add(mox)


# What passed already: nodes are immutable and rewrites share the ones they keep, so a
# rewrite's result checks only what it made (weak: nothing is kept alive).
_passed: weakref.WeakSet[Mox] = weakref.WeakSet()
_typed: weakref.WeakSet[Equation] = weakref.WeakSet()
_lock = threading.Lock()

#: Output types JAX derived, by (primitive, params, input types), the oldest dropped first;
#: equations holding nested computations are not kept here (their key would keep the MoX alive).
_derived: collections.OrderedDict[Any, list[tuple[tuple[int, ...], Any]]] = collections.OrderedDict()
_DERIVED_MAX = 4096


def _same_dtype(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:  # an extended dtype (a PRNG key's) against a NumPy one
        return False


def _agree(a: Any, b: Any) -> bool:
    """Whether two typed things have one shape and dtype (weak types aside, as JAX's ``typematch``)."""
    shape = a.shape if hasattr(a, "shape") else np.shape(a)
    return tuple(shape) == tuple(b.shape) and _same_dtype(getattr(a, "dtype", None), b.dtype)


def _count(n: int, one: str) -> str:
    return f"{n} {one if n == 1 else 'leaves' if one == 'leaf' else one + 's'}"


class _Checker:
    def __init__(self, root: Mox):
        self.root = root
        self.untyped: list[Equation] = []  # equations no check has typed yet (`_typed`)

    # -- reporting ---------------------------------------------------------------------
    def fail(self, node: Node, problem: str, atoms: Sequence[Symbol] = (), line: str = "node") -> NoReturn:
        """Raise a `YaxCheckError`: ``problem`` may name ``atoms`` as ``{0}``, ``{1}`` … (printed
        as the window names them)."""
        from ._print import marked

        window, names = marked(self.root, node, tuple(atoms), line=line)
        if not window and node is not self.root and isinstance(node, Mox):
            window, _ = marked(self.root, node, line="head")
        raise YaxCheckError(problem.format(*[f"`{n}`" for n in names]) if atoms else problem, window)

    def what(self, node: Node) -> str:
        if node is self.root:
            return "the root" if node.kind == Kind.ROOT else f"the {node.kind} at `{node.path or 'the root'}`"
        return where(node)

    # -- structure and scopes ----------------------------------------------------------
    def walk(self) -> None:
        root = self.root
        if root.kind == Kind.ROOT:
            self.signature(root)
        elif root.kind in CALL_KINDS:
            self.call(root, root)
        elif root.kind != Kind.JAXPR:
            self.fail(root, f"the node's kind is {root.kind!r}, which is no kind of MoX node "
                            f"(one of {', '.join(repr(str(k)) for k in Kind)}).", line="head")
        blocks = [root]
        done: set[int] = set()  # nested computations checked (one jaxpr held by several equations)
        while blocks:
            block = blocks.pop()
            if id(block) not in done:
                done.add(id(block))
                self.scope(block, blocks)

    def scope(self, block: Mox, blocks: list[Mox]) -> None:
        """One scope: ``block``'s constants and parameters, then its children in order, calls
        evaluated in place; nested computations are queued on ``blocks`` as scopes of their own."""
        env: dict[Var, Node] = {}  # each value bound in this scope -> the node binding it
        free = block.kind in CALL_KINDS  # a call checked alone: what it reads from its caller is unknown
        self.consts(block)

        def bind(v: Any, node: Node) -> None:
            if not isinstance(v, Var):
                self.fail(node, f"{self.what(node)} binds {v!r}, which is not a `Var`: only vars are bound.")
            first = env.get(v)
            if first is not None:
                self.fail(node, f"{self.what(node)} binds {{0}} ({type_str(v)}), which "
                                f"{'it' if first is node else self.what(first)} already bound in this scope: "
                                "a value is bound once.", [v])
            env[v] = node

        def read(a: Any, node: Node, line: str = "node") -> None:
            if isinstance(a, Literal) or (isinstance(a, Var) and a in env):
                return
            if not isinstance(a, Var):
                self.fail(node, f"{self.what(node)} reads {a!r}, which is neither a `Var` nor a `Literal`.",
                          line=line)
            if not free:
                self.fail(node, f"{self.what(node)} reads {{0}} ({type_str(a)}), {self.unbound(block, a)}", [a],
                          line)

        for v in (*block.constvars, *block.invars):
            bind(v, block)
        frames: list[tuple[Any, Mox]] = [(iter(block.children), block)]
        while frames:
            it, parent = frames[-1]
            c = next(it, None)
            if c is None:
                frames.pop()
                for a in parent.outvars:
                    read(a, parent, "end")
                if frames:  # a call is done: its results are bound in its caller
                    for v in parent.outputs:
                        bind(v, parent)
                continue
            if isinstance(c, Equation):
                if c.path != parent.path:
                    self.fail(c, f"{self.what(c)} runs at `{c.path or 'the root'}`, but the node it is in is at "
                                 f"`{parent.path or 'the root'}`: an equation's path is its enclosing call's.")
                for a in c.inputs:
                    read(a, c)
                for name, sub in c.subs:
                    if sub.kind != Kind.JAXPR:
                        self.fail(c, f"{self.what(c)} holds a `{sub.kind}` node as its parameter `{name}`, where "
                                     "a nested computation (a `jaxpr` node) belongs.")
                    if sub.path != c.path:
                        self.fail(c, f"the computation in parameter `{name}` of {self.what(c)} runs at "
                                     f"`{sub.path or 'the root'}`, not at its equation's path: a nested "
                                     "computation runs where the equation holding it does.")
                    blocks.append(sub)
                if c._jaxprs:
                    self.kept(c)
                if c not in _typed:
                    self.untyped.append(c)
                for v in c.outputs:
                    bind(v, c)
            elif isinstance(c, Mox):
                if c.kind not in CALL_KINDS:
                    self.fail(c, f"{self.what(parent)} has a `{c.kind}` node among its children, where calls "
                                 f"({', '.join(f'`{k}`' for k in CALL_KINDS)}) and equations belong.")
                self.call(c, parent)
                for a in c.inputs:
                    read(a, c)
                self.consts(c)
                for v in (*c.constvars, *c.invars):
                    bind(v, c)
                frames.append((iter(c.children), c))
            else:
                self.fail(parent, f"{self.what(parent)} has a child of type `{type(c).__name__}`; children are "
                                  "equations and call nodes.", line="head")

    def kept(self, e: Equation) -> None:
        """The JAX jaxprs ``e`` keeps to evaluate its nested computations by (those that had no
        call in them) against those computations: the same parameters and results."""
        for name, orig in e._jaxprs.items():
            held = e.params.get(name)
            subs = held if isinstance(held, tuple) else (held,)
            origs = orig if isinstance(orig, tuple) else (orig,)
            if len(subs) != len(origs):
                self.fail(e, f"{self.what(e)} holds {_count(len(subs), 'computation')} in parameter `{name}`, but "
                             f"keeps {_count(len(origs), 'jaxpr')} to evaluate them by.")
            for sub, o in zip(subs, origs):
                j = getattr(o, "jaxpr", o)  # a closed jaxpr's constants are the computation's constvars
                for side, mine, theirs in (("parameters", sub.invars, j.invars), ("results", sub.outvars, j.outvars)):
                    if len(mine) != len(theirs) or not all(_agree(a, b.aval) for a, b in zip(mine, theirs)):
                        self.fail(e, f"the computation in parameter `{name}` of {self.what(e)} has the {side} "
                                     f"({', '.join(type_str(a) for a in mine)}), but the jaxpr it keeps to be "
                                     f"evaluated by has ({', '.join(type_str(b.aval) for b in theirs)}): a nested "
                                     "computation changed by hand must drop it (`_jaxprs`), as `map_mox` does.")

    def unbound(self, block: Mox, v: Var) -> str:
        """Why ``v`` is not bound where it is read (a failure is being reported: time is no matter)."""
        def binds(n: Node) -> bool:
            if isinstance(n, Equation):
                return v in n.outputs
            return v in n.invars or v in n.constvars or (n.kind in CALL_KINDS and v in n.outputs)

        for n in (block, *_scope_nodes(block)):
            if binds(n):
                return f"which is bound only after it, by {self.what(n)}."
        for n in (self.root, *self.root.walk()):
            if binds(n):
                return (f"which is bound in another scope, by {self.what(n)}: a nested computation sees only its "
                        "own constants and parameters, and its caller nothing of it.")
        return "which nothing in the MoX binds (a value a rewrite removed, or one never bound)."

    def consts(self, node: Mox) -> None:
        if len(node.constvars) != len(node.consts):
            self.fail(node, f"{self.what(node)} has {_count(len(node.constvars), 'constant var')} but "
                            f"{_count(len(node.consts), 'constant value')}: each constant var takes one value.",
                      line="head")
        for i, (v, c) in enumerate(zip(node.constvars, node.consts)):
            if hasattr(c, "dtype") and not _agree(c, v):
                self.fail(node, f"constant {i} of {self.what(node)}, {{0}}, is {type_str(v)}, but its value is "
                                f"{type_str(c)}.", [v], line="head")

    def call(self, c: Mox, parent: Mox) -> None:
        """A call's boundary: inputs against parameters, results against outputs, its signature."""
        for side, outer, inner, outer_name, inner_name in (
                ("in", c.inputs, c.invars, "inputs", "parameters (`invars`)"),
                ("out", c.outputs, c.outvars, "outputs", "results (`outvars`)")):
            if len(outer) != len(inner):
                self.fail(c, f"{self.what(c)} has {_count(len(outer), outer_name[:-1])} but "
                             f"{_count(len(inner), inner_name.split(' ')[0][:-1])} {inner_name.split(' ', 1)[1]}: "
                             f"each of its {outer_name} {'binds' if side == 'in' else 'is bound to'} one.")
            for i, (a, b) in enumerate(zip(outer, inner)):
                if not _agree(a, b):
                    self.fail(c, f"{'input' if side == 'in' else 'output'} {i} of {self.what(c)}, {{0}}, is "
                                 f"{type_str(a)}, but the {'parameter' if side == 'in' else 'result'} "
                                 f"{'it binds' if side == 'in' else 'bound to it'}, {{1}}, is {type_str(b)}.",
                              [a, b])
        for side, packing, n, what in (("arguments", c.sig.ins, len(c.inputs), "inputs"),
                                       ("result", c.sig.outs, len(c.outputs), "outputs")):
            if packing.tree is not None and len(packing.dyn) != n:
                self.fail(c, f"{self.what(c)} has {_count(n, what[:-1])}, but its signature traces "
                             f"{_count(len(packing.dyn), 'leaf')} of its {side}: one {what[:-1]} per traced leaf.")
            self.packing(c, packing, side)
        if c.kind == Kind.METHOD_CALL and c.path != parent.path:
            self.fail(c, f"{self.what(c)} calls a helper method of the module its caller runs, but its path is not "
                         f"its caller's (`{parent.path or 'the root'}`).")
        # a function a rewrite put in takes the path of what it replaced: an equation of the root's has none
        if c.kind in CALL_KINDS and not c.path and not (c.kind == Kind.FUNCTION and not parent.path):
            self.fail(c, f"{self.what(c)} has no path: every call is at a path (`Model/Dense_0`).")

    def packing(self, node: Mox, p: Packing, side: str) -> None:
        if p.tree is None:
            return
        leaves = p.tree.num_leaves
        where_ = sorted([*p.dyn, *(i for i, _ in p.static)])
        if where_ != list(range(leaves)):
            self.fail(node, f"the signature of {self.what(node)} does not account for each leaf of its {side} once: "
                            f"the treedef has {_count(leaves, 'leaf')}, the traced ones are at {list(p.dyn)} and "
                            f"the static ones at {[i for i, _ in p.static]}.", line="head")
        if p.paths and len(p.paths) != len(p.dyn):
            self.fail(node, f"the signature of {self.what(node)} names {_count(len(p.paths), 'key path')} for "
                            f"{len(p.dyn)} traced {'leaf' if len(p.dyn) == 1 else 'leaves'} of its {side}.", line="head")

    def signature(self, root: Mox) -> None:
        """The root against its signature: one parameter per traced argument leaf, one result per
        traced result leaf; its ``inputs``/``outputs`` are its parameters/var results."""
        for side, packing, vals, what, line in (("arguments", root.sig.ins, root.invars, "parameter", "head"),
                                                ("result", root.sig.outs, root.outvars, "result", "end")):
            self.packing(root, packing, side)
            if packing.tree is not None and len(packing.dyn) != len(vals):
                self.fail(root, f"the root has {_count(len(vals), what)}, but its signature traces "
                                f"{_count(len(packing.dyn), 'leaf')} of its {side}: one {what} per traced leaf.",
                          line=line)
        if tuple(root.inputs) != tuple(root.invars):
            self.fail(root, "the root's `inputs` are not its parameters (`invars`): a root is called with them.",
                      line="head")
        params = set(root.invars)
        for v, spec in root.shardings:
            if v not in params:
                self.fail(root, f"the root records the layout {spec} for {{0}}, which is none of its parameters.",
                          [v], line="head")

    # -- types ---------------------------------------------------------------------------
    def types(self) -> None:
        """Each new equation's output types: re-derived by JAX's abstract evaluation of its
        primitive, or, for one holding nested computations, by its rule (`NESTED`)."""
        ruled: dict[Equation, Types] = {}
        keys: dict[Equation, Any] = {}
        known: dict[Any, Types] = {}  # by key (an equation itself when it has none)
        todo: dict[Any, Equation] = {}  # one equation per key for JAX to derive
        for e in self.untyped:
            rule = NESTED.get(e.name) if e.subs else None
            if rule is not None:
                ruled[e] = self.nested(e, rule)
                continue
            key = keys[e] = _key(e)
            k = key if key is not None else e
            if k not in known and k not in todo:
                hit = _derived.get(key) if key is not None else None
                if hit is not None:
                    known[k] = hit
                else:
                    todo[k] = e
        known.update(zip(todo, _derive(list(todo.values()), self)))
        for e in self.untyped:
            key = keys.get(e)
            self.compare(e, ruled[e] if e in ruled else known[key if key is not None else e])
        with _lock:
            for k in todo:
                if not isinstance(k, Equation):
                    _derived[k] = known[k]
            while len(_derived) > _DERIVED_MAX:
                _derived.popitem(last=False)
            _typed.update(self.untyped)

    def nested(self, e: Equation, rule: Rule) -> Types:
        """``e``'s output types by its rule, after its nested computations' parameters and
        results against what the rule says ``e`` passes them and needs of them."""
        try:
            takes, outs = rule(e)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            self.fail(e, f"{self.what(e)} is no well-formed `{e.name}`: {type(err).__name__}: {err}.")
        for name, sub, ins, res in takes:
            for side, have, want in (("parameters", sub.invars, ins), ("results", sub.outvars, res)):
                if want is not None and not _same(_types(have), want):
                    needs = "is passed" if side == "parameters" else "needs"
                    self.fail(e, f"the computation in parameter `{name}` of {self.what(e)} has the {side} "
                                 f"({_listed(_types(have))}), but `{e.name}` {needs} ({_listed(want)}).")
        return outs

    def compare(self, e: Equation, got: Types) -> None:
        if len(got) != len(e.outputs):
            self.fail(e, f"{self.what(e)} has {_count(len(e.outputs), 'output')}, but `{e.name}` on its inputs "
                         f"gives {_count(len(got), 'result')}.")
        for i, (v, (shape, dtype)) in enumerate(zip(e.outputs, got)):
            if tuple(v.shape) != tuple(shape) or not _same_dtype(v.dtype, dtype):
                found = type_str(jax.ShapeDtypeStruct(shape, dtype))
                self.fail(e, f"output {i} of {self.what(e)}, {{0}}, is {type_str(v)}, but `{e.name}` on its inputs "
                             f"({', '.join(type_str(a) for a in e.inputs) or 'none'}) gives {found}.", [v])


# -- equations holding nested computations: a rule per primitive -------------------------------
#
# Binding such an equation would make JAX derive its types from its computations, but a computation
# changed by a rewrite must first be traced again into a jaxpr, inside which the computations nested
# in it are traced again, and so on: as deep as the nesting (a thousand `jit`s inside each other is a
# MoX too), and a whole model's worth of tracing for a `remat` over every layer. Instead each such
# primitive's typing rule (JAX's own: ``_scan_typecheck``, ``_cond_typecheck``, ...) is restated here
# over the computations' parameters and results, which the walk checks on their own; a primitive
# with no rule here is bound, as any other equation.

Types = list[tuple[tuple[int, ...], Any]]
#: what an equation passes each computation and needs of it: ``(param, computation, parameter types,
#: result types or None)``; and the equation's output types
Takes = list[tuple[str, Mox, Types, Types | None]]
Rule = Callable[[Equation], tuple[Takes, Types]]


def _types(atoms: Sequence[Any]) -> Types:
    return [(tuple(a.shape), a.dtype) for a in atoms]


def _same(a: Types, b: Types) -> bool:
    return len(a) == len(b) and all(sa == sb and _same_dtype(da, db) for (sa, da), (sb, db) in zip(a, b))


def _listed(types: Types) -> str:
    return ", ".join(type_str(jax.ShapeDtypeStruct(sh, d)) for sh, d in types) or "none"


def _whole(param: str) -> Rule:
    """A call of its computation: takes the equation's inputs, gives its outputs (``jit``, ``remat``,
    custom derivatives)."""
    def rule(e: Equation) -> tuple[Takes, Types]:
        sub = e.params[param]
        return [(param, sub, _types(e.inputs), None)], _types(sub.outvars)
    return rule


def _cond(e: Equation) -> tuple[Takes, Types]:
    branches = e.params["branches"]
    outs = _types(branches[0].outvars)
    ins = _types(e.inputs[1:])  # the first input picks the branch
    return [(f"branches[{i}]", b, ins, outs) for i, b in enumerate(branches)], outs


def _while(e: Equation) -> tuple[Takes, Types]:
    nc, nb = e.params["cond_nconsts"], e.params["body_nconsts"]
    carry = _types(e.inputs[nc + nb:])
    return [("cond_jaxpr", e.params["cond_jaxpr"], _types(e.inputs[:nc]) + carry, [((), np.dtype(bool))]),
            ("body_jaxpr", e.params["body_jaxpr"], _types(e.inputs[nc:nc + nb]) + carry, carry)], carry


def _scan(e: Equation) -> tuple[Takes, Types]:
    n, nc, nk = e.params["length"], e.params["num_consts"], e.params["num_carry"]
    body = e.params["jaxpr"]
    ins = _types(e.inputs)
    xs = ins[nc + nk:]
    if any(not sh or sh[0] != n for sh, _ in xs):
        raise ValueError(f"a scan over {n} steps scans inputs of types ({_listed(xs)})")
    res = _types(body.outvars)
    ys = [((n, *sh), d) for sh, d in res[nk:]]
    return [("jaxpr", body, ins[:nc + nk] + [(sh[1:], d) for sh, d in xs], ins[nc:nc + nk] + res[nk:])], \
        ins[nc:nc + nk] + ys


#: primitive name -> its rule (names on the oldest and newest supported JAX)
NESTED: dict[str, Rule] = {
    "jit": _whole("jaxpr"), "pjit": _whole("jaxpr"), "closed_call": _whole("call_jaxpr"),
    "core_call": _whole("call_jaxpr"), "checkpoint": _whole("jaxpr"), "remat": _whole("jaxpr"),
    "remat2": _whole("jaxpr"), "custom_jvp_call": _whole("call_jaxpr"), "custom_vjp_call": _whole("call_jaxpr"),
    "custom_vjp_call_jaxpr": _whole("fun_jaxpr"), "cond": _cond, "while": _while, "scan": _scan,
}


def _scope_nodes(block: Mox) -> list[Node]:
    """The nodes of ``block``'s own scope (calls entered, nested computations not), in order."""
    return [n for n, _, _ in visit(block, nested=False)][1:]


def _key(e: Equation) -> Any:
    """What JAX's abstract evaluation of ``e`` depends on, hashable; ``None`` for an equation
    holding nested computations, or with a parameter that cannot be hashed."""
    if e.subs:
        return None
    try:
        key = (e.primitive, tuple(sorted(e.params.items())),
               tuple((tuple(a.shape), a.dtype, a.weak_type) for a in e.inputs))
        hash(key)
    except TypeError:
        return None
    return key


def _abstract(a: Symbol) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)


def _derive(eqns: list[Equation], checker: _Checker) -> list[Types]:
    """The output types of each of ``eqns``, as JAX derives them from its inputs' types: all
    bound on abstract values in one trace (`eval_mox`'s `bind`); where that fails, one by one,
    and an equation JAX rejects is reported. An equation holding nested computations with no
    rule in `NESTED` is bound too: its computations are made jaxprs innermost first, so that
    none is traced inside another's trace."""
    from ._eval import _bind_params, bind

    def trace(es: list[Equation]) -> list[Types]:
        counts: list[int] = []

        def bound(*flat: Any) -> list[Any]:
            out: list[Any] = []
            i = 0
            for e in es:
                got = bind(e, list(flat[i:i + len(e.inputs)]))
                i += len(e.inputs)
                counts.append(len(got))
                out.extend(got)
            return out

        closed = jax.make_jaxpr(bound)(*[_abstract(a) for e in es for a in e.inputs])
        avals = iter(closed.out_avals)
        return [[(tuple(a.shape), a.dtype) for a in (next(avals) for _ in range(n))] for n in counts]

    if not eqns:
        return []
    for e in reversed([e for e in eqns if e.subs]):  # listed outermost first: innermost made first
        try:
            _bind_params(e)  # kept for `eval_mox`
        except Exception:  # noqa: BLE001  # reported by the trace
            pass
    try:
        return trace(eqns)
    except Exception:  # noqa: BLE001  # some equation is rejected: find which
        pass
    out = []
    for e in eqns:
        try:
            out.extend(trace([e]))
        except Exception as err:  # noqa: BLE001
            cause = err.__cause__ if isinstance(err, YaxEvalError) and err.__cause__ is not None else err
            said = str(cause).strip().split("\n\n")[0]
            checker.fail(e, f"JAX's abstract evaluation of {checker.what(e)} on its inputs "
                            f"({', '.join(type_str(a) for a in e.inputs) or 'none'}) fails: "
                            f"{type(cause).__name__}: {said}")
    return out
