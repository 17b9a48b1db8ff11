"""One identity and one evaluation order for the nodes of a MoX, and one table
of the higher-order primitives that hold nested computations.

Every concern that names a node's values uses these: `capture`, `patch`,
`compare`, `first_nonfinite` and the explorer. A call or equation is named by
its *key*: the call's path (``path.method`` for a method other than
``__call__``), an equation's ``path:primitive``, and ``#2``, ``#3``… for later
calls of the same in program order. A node inside a ``scan`` body has one key
and a value per step; the step is the second half of its identity
(`Position`).

How each concern treats a nested computation is decided by one table,
`HIGHER_ORDER` (as JAX keeps one rule table per concern): the bodies of
``jit``-like calls run in place, ``remat`` bodies under ``jax.checkpoint``,
``scan`` bodies once per step, and ``while``/``cond``/custom-derivative
bodies cannot give their values out (`WHY`).
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ._ir import CALL_KINDS, FN_KINDS, Equation, Mox

Node = Equation | Mox
T = TypeVar("T")

#: How a higher-order primitive runs the computation it holds:
#: ``inline`` (called once, in place), ``remat`` (called once, rematerialised),
#: ``scan`` (once per step), ``custom`` (a custom derivative rule's primal),
#: ``while`` (a number of times known only when it runs), ``cond`` (one branch of several).
HIGHER_ORDER: dict[str, str] = {
    "jit": "inline", "pjit": "inline", "closed_call": "inline", "core_call": "inline",
    "remat2": "remat", "checkpoint": "remat", "remat": "remat",
    "scan": "scan",
    "custom_jvp_call": "custom", "custom_vjp_call": "custom", "custom_vjp_call_jaxpr": "custom",
    "while": "while",
    "cond": "cond",
}

#: Why the values inside a computation run this way cannot be brought out step by step.
WHY: dict[str, str] = {
    "while": "a `while` loop runs its body a number of times known only when it runs, so the values of its "
             "steps cannot be stacked",
    "cond": "only one branch of a `cond` runs, so the values of the others do not exist",
    "custom": "bringing values out of a custom derivative rule's computation would bypass the rule",
}

#: The ways of running a nested computation whose values can come out.
OPEN = frozenset({"inline", "remat", "scan"})


def how(eqn: Equation) -> str:
    """How ``eqn`` runs what it holds (a `HIGHER_ORDER` value), or its own
    name for a primitive outside the table (a computation that cannot be
    opened, such as ``shard_map``)."""
    subs = eqn.subs
    rule = HIGHER_ORDER.get(eqn.name)
    if rule in ("inline", "remat") and len(subs) != 1:
        return eqn.name
    return rule or eqn.name


def is_scan(eqn: Equation) -> bool:
    """Whether ``eqn`` runs what it holds once per step (its values stack along a leading axis)."""
    return how(eqn) == "scan"


def is_loop(eqn: Equation) -> bool:
    """Whether ``eqn`` runs its body a number of times known only when it runs (a ``while``)."""
    return how(eqn) == "while"


def is_branch(eqn: Equation) -> bool:
    """Whether ``eqn`` runs one of the computations it holds (a ``cond``)."""
    return how(eqn) == "cond"


def is_remat(name: str) -> bool:
    """Whether the primitive ``name`` rematerialises what it holds (``jax.checkpoint``)."""
    return HIGHER_ORDER.get(name) == "remat"


def opens(rule: str) -> bool:
    """Whether values can come out of a computation run the way ``rule`` (a `how`) says."""
    return rule in OPEN


def in_place(rule: str) -> bool:
    """Whether a computation run the way ``rule`` says runs once, where it is called
    (a ``jit``-like call or a ``remat`` body: what it computes is what the caller would)."""
    return rule in ("inline", "remat")


def base(node: Node) -> str:
    """A node's key without its ``#k`` suffix."""
    if isinstance(node, Equation):
        return f"{node.path}:{node.name}" if node.path else node.name
    if node.method in (None, "__call__") or node.kind in FN_KINDS:
        return node.path
    return f"{node.path}.{node.method}"


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a call is in the evaluation of its MoX.

    ``order`` is its place in the order calls finish, inside its innermost
    scan body (or at the root); ``scans`` the scans around it, outermost
    first, as ``(their place, length, reverse)``; ``blocked`` the equation
    whose body holds it and cannot give its values out (``while``, ``cond``,
    a custom rule), if any. Positions with steps sort in evaluation order
    (`sort_key`)."""

    order: int
    scans: tuple[tuple[int, int, bool], ...] = ()
    blocked: Equation | None = None
    scan_eqns: tuple[Equation, ...] = dataclasses.field(default=(), repr=False, compare=False)

    @property
    def stack(self) -> tuple[int, ...]:
        """The scan lengths: the leading axes of this call's stacked values."""
        return tuple(n for _, n, _ in self.scans)

    def sort_key(self, step: tuple[int, ...] = ()) -> tuple[int, ...]:
        """A key sorting (call, step) pairs in the order they are evaluated
        (a reversed scan runs its last step first)."""
        out: list[int] = []
        for (at, n, reverse), s in zip(self.scans, step or (0,) * len(self.scans)):
            out += [at, n - 1 - s if reverse else s]
        return (*out, self.order)


@dataclasses.dataclass(frozen=True)
class Index:
    """A MoX's nodes, numbered and placed once (`index`): every concern that names a node uses it.

    A node's *number* is its place in pre-order (the MoX itself 0, then a call's children and an
    equation's nested computations in order): the ``id`` of its element in the XML view
    (`yax.internal.node_ids`) and what the explorer sends back. Its *key* names its values
    across MoXes (module docstring); its `Position` says where it is evaluated."""

    ids: dict[int, int]                  # id(node) -> number (the MoX itself included)
    nodes: list[Node]                    # number -> node
    parents: list[int]                   # number -> the number of the node holding it (-1: the MoX)
    callers: list[int]                   # number -> the number of the call it runs in (-1: none below the MoX)
    keys: dict[int, str]                 # id(call or equation) -> key
    calls: dict[str, Mox]                # key -> call node, in the order calls finish (nested ones too)
    positions: dict[int, Position]       # id(call) -> where it is evaluated


#: Everything derived from a MoX, by the MoX: a MoX is immutable, so what is computed from it
#: once holds while it lives, and goes with it. The one home of per-MoX caches (`memo`).
_derived: weakref.WeakKeyDictionary[Mox, dict[str, Any]] = weakref.WeakKeyDictionary()
_MISSING = object()


def memo(mox: Mox, name: str, build: Callable[[], T]) -> T:
    """What ``build()`` gives, computed once per ``mox`` under ``name`` and kept while ``mox``
    lives (its index, XML view, compiled programs...). A cache that is a table (keyed
    by pattern, say) is built as an empty dict and filled by its user."""
    store = _derived.get(mox)
    if store is None:
        store = _derived.setdefault(mox, {})
    got = store.get(name, _MISSING)
    if got is _MISSING:  # threads building at once keep the first stored
        got = store.setdefault(name, build())
    return got  # type: ignore[no-any-return]


def kept(mox: Mox, name: str) -> Any:
    """What `memo` keeps for ``mox`` under ``name``, or ``None``: looking builds nothing."""
    return _derived.get(mox, {}).get(name)


def index(mox: Mox) -> Index:
    """The `Index` of ``mox`` (kept while ``mox`` lives). One walk, without recursion."""
    return memo(mox, "index", lambda: _build(mox))


#: A node met by `visit`, with its context: the node, the number of the node holding it (-1: none)
#: and the ``(equation, parameter)`` pairs whose nested computations hold it, outermost first.
Visit = tuple[Node, int, tuple[tuple[Equation, str], ...]]


def visit(mox: Node, *, nested: bool = True) -> Iterator[Visit]:
    """``mox`` and every node below it in pre-order, each with its context (`Visit`): the n-th
    node met is number n, as `Index` numbers them (``mox`` is 0). The scans around a node are
    the holders `is_scan` says run theirs per step. ``nested=False`` stays in ``mox``'s own
    scope: calls are entered, the computations equations hold are not. Without recursion:
    a tree of any depth is visited."""
    todo: list[Visit] = [(mox, -1, ())]
    count = 0
    while todo:
        item = todo.pop()
        yield item
        n, _, holders = item
        if isinstance(n, Mox):
            todo.extend((c, count, holders) for c in reversed(n.children))
        elif nested:
            todo.extend((s, count, (*holders, (n, k))) for k, s in reversed(n.subs))
        count += 1


def keys(mox: Mox) -> dict[int, str]:
    """``id(node)`` -> key, for every call and equation of ``mox``."""
    return index(mox).keys


def calls(mox: Mox) -> dict[str, Mox]:
    """key -> call node for every call of ``mox`` (inside nested computations
    too), in the order calls finish when it is evaluated."""
    return index(mox).calls


def _build(mox: Mox) -> Index:
    """One pre-order walk with its context (the scans around a node, the equation whose body
    cannot give values out): numbers and keys as nodes are entered, positions as calls finish."""
    seen: collections.Counter[str] = collections.Counter()
    ids: dict[int, int] = {}
    nodes: list[Node] = []
    parents: list[int] = []
    callers: list[int] = []
    keyed: dict[int, str] = {}
    finished: dict[str, Mox] = {}
    positions: dict[int, Position] = {}
    counter = 0
    # (node, parent number, enclosing call's number, scans around, their equations, blocking
    # equation), or (a call, its position's context) where the call's children are done: it finishes there
    todo: list[Any] = [(mox, -1, -1, (), (), None)]
    while todo:
        item = todo.pop()
        if len(item) == 2:
            call, context = item
            finished[keyed[id(call)]] = call
            positions[id(call)] = Position(counter, *context)
            counter += 1
            continue
        n, parent, caller, scans, eqns, blocked = item
        num = ids[id(n)] = len(nodes)
        nodes.append(n)
        parents.append(parent)
        callers.append(caller)
        is_call = isinstance(n, Mox) and n.kind in CALL_KINDS and n is not mox
        if is_call or isinstance(n, Equation):  # keyed in program order: a call before what it calls
            b = base(n)
            seen[b] += 1
            keyed[id(n)] = b if seen[b] == 1 else f"{b}#{seen[b]}"
        if isinstance(n, Mox):
            if is_call:
                todo.append((n, (scans, blocked, eqns)))
                caller = num
            todo.extend((c, num, caller, scans, eqns, blocked) for c in reversed(n.children))
            continue
        rule = how(n)
        if rule == "scan":
            scans = (*scans, (counter, int(n.params["length"]), bool(n.params.get("reverse", False))))
            eqns = (*eqns, n)
            counter += 1
        elif rule not in OPEN and n.subs:
            blocked = blocked or n
        todo.extend((s, num, caller, scans, eqns, blocked) for _, s in reversed(n.subs))
    return Index(ids, nodes, parents, callers, keyed, finished, positions)


def param_copies(mox: Mox, call: Mox) -> int:
    """How many sets of variables ``call`` has in the model: the product of the lengths of
    the scans around it that slice its variables per step (``nn.scan`` with
    ``variable_axes``, ``nnx.scan`` over stacked layers); 1 where they are broadcast
    (``variable_broadcast``) or outside scans. Told from the scans' inputs: a scan slices
    the variables when, for every variable, an array of its shape with the scan length in
    front is among the scan's ``xs``."""
    pos = index(mox).positions.get(id(call))
    leaves = [tuple(a.shape) for a in _leaves(call.var_tree)]
    if pos is None or not pos.scan_eqns or not leaves:
        return 1
    n = 1
    for eqn in reversed(pos.scan_eqns):  # innermost first
        p = eqn.params
        xs = {tuple(a.shape) for a in eqn.inputs[p["num_consts"] + p["num_carry"]:]}
        length = int(p["length"])
        stacked = [(length, *s) for s in leaves]
        if all(s in xs for s in stacked):
            n *= length
            leaves = stacked
    return n


def _leaves(tree: Any) -> list[Any]:
    import jax

    return [a for a in jax.tree_util.tree_leaves(tree) if hasattr(a, "shape")]


def formals(eqn: Equation) -> list[tuple[str, Mox, list[tuple[Any, Any, str]]]]:
    """For each computation ``eqn`` holds (``(param name, body)``), its formal
    parameters paired with the inputs of ``eqn`` they take, and how: ``whole``
    (passed as it is), ``step`` (one step of what a scan scans over: a stacked
    layer's weight) or ``carry`` (a loop's carry: its first value only)."""
    p, rule = eqn.params, how(eqn)
    out = []
    for name, sub in eqn.subs:
        ins: list[tuple[Any, str]] = []
        if rule == "scan":
            nc, xs = p["num_consts"], p["num_consts"] + p["num_carry"]
            ins = [(a, "whole" if k < nc else "carry" if k < xs else "step") for k, a in enumerate(eqn.inputs)]
        elif rule == "cond":  # the first input picks the branch
            ins = [(a, "whole") for a in eqn.inputs[1:]]
        elif rule == "while":
            c, b = p["cond_nconsts"], p["body_nconsts"]
            consts = eqn.inputs[:c] if name.startswith("cond") else eqn.inputs[c:c + b]
            ins = [(a, "whole") for a in consts] + [(a, "carry") for a in eqn.inputs[c + b:]]
        else:
            ins = [(a, "whole") for a in eqn.inputs]
        out.append((name, sub, [(f, a, k) for f, (a, k) in zip(sub.invars, ins)]))
    return out


def bound(mox: Mox) -> dict[Any, tuple[int, int]]:
    """Every variable of ``mox`` that only renames one of its inputs: bound
    to it by a call or by the body of a higher-order primitive, never
    computed (a loop's carry is). Each maps to ``(the input's position, how
    many scans slice it on the way)``: a scan's body sees one step of what it
    scans over (a stacked layer's weight)."""
    out: dict[Any, tuple[int, int]] = {v: (i, 0) for i, v in enumerate(mox.invars)}
    for n in mox.walk():
        if isinstance(n, Mox):
            for formal, actual in zip(n.invars, n.inputs):
                if actual in out and formal is not actual:
                    out[formal] = out[actual]
        elif n.subs and any(a in out for a in n.inputs):
            for _, _, pairs in formals(n):
                for formal, actual, kind in pairs:
                    if actual in out and kind != "carry":
                        i, s = out[actual]
                        out[formal] = (i, s + (kind == "step"))
    return out
