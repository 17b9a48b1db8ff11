"""Tracing a replacement on the node it replaces, and the checks it must pass.

A replacement (a function, a module of any frontend) is traced with
`make_mox` on the avals of the node's inputs; one that is already a
computation (a root MoX, a call node cut from another MoX, an Equation) is
used as it is (`yax.rewrite.own`), never re-traced. Either is checked: it
takes as many arrays as the node has inputs (a computation: of the node's
shapes and dtypes) and returns arrays of the node's output shapes and dtypes
(with ``cast``, other dtypes are cast back). Each site gets its own copy with
fresh vars (`fresh`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, cast

import jax

from .. import errors, frontends
from .._ir import Equation, Kind, Mox, Packing, Var
from .._vocab import type_str
from ..errors import CannotRebuild, YaxRewriteError
from ..frontends import MappedCall, Template
from . import own, thread
from .splice import repath, subst

Node = Equation | Mox


@dataclasses.dataclass
class Traced:
    """A replacement traced for one site."""

    root: Mox                     # the traced replacement; its first ``n_vars`` invars are variables
    n_vars: int = 0
    module: Any = None            # the (filled) module, if the replacement is one
    var_avals: Any = None         # its variables, abstract, in its frontend's layout
    n_state: int = 0              # stateful frontends: the last outvars are the variables' final values
    frontend: str | None = None   # the module's frontend
    call: Any = None              # xs -> (args, kwargs): how the replacement is called on the node's inputs
    key: Any = None               # equal for replacements that compute and initialise the same (`fingerprint`)
    mapped: MappedCall | None = None  # how the replacement was mapped like the node's module (`nn.vmap`)
    fixed: bool = False           # a computation used as it is (a MoX, an Equation): traced on its own inputs
    reads: tuple[Any, ...] | None = None    # a MoX reading the replaced module's variables where they are: their paths

    @property
    def outvars(self) -> tuple[Any, ...]:
        """The replacement's results (without final variable values)."""
        return self.root.outvars[: len(self.root.outvars) - self.n_state]

    @property
    def state_out(self) -> tuple[Any, ...]:
        """The variables' final values, in the order of ``var_avals``."""
        return self.root.outvars[len(self.root.outvars) - self.n_state:]


@dataclasses.dataclass
class Site:
    """One node to replace, its replacement, and what checking it produced."""

    node: Node
    repl: Any
    traced: Traced
    casts: tuple[Any, ...] = ((), {})
    chain: tuple[Any, ...] = ()            # (equation, parameter) pairs from the root down to the node
    stack: tuple[int, ...] = ()  # the leading axes its variables have at the root (one per scan, then nn.vmap's)
    reads: dict[Var, Var] = dataclasses.field(default_factory=dict)  # a MoX's variable vars -> the root vars it reads


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def fingerprint(v: Any, depth: int = 0) -> Any:
    """A hashable value equal for replacements that compute and initialise the
    same: like ``repr``, but functions are told by their code and the values
    they close over, not their address (Hugging Face builds a new
    ``normal(0.02)`` initialiser for every layer, and 96 equal layers must
    trace and compile once)."""
    if depth > 8:
        return _ADDRESS.sub("", repr(v))
    if isinstance(v, functools.partial):
        return ("partial", fingerprint(v.func, depth + 1), fingerprint(v.args, depth + 1),
                fingerprint(sorted(v.keywords.items()), depth + 1))
    if inspect.isfunction(v):
        cells = tuple(fingerprint(c.cell_contents, depth + 1) for c in (v.__closure__ or ()) if _filled_cell(c))
        return ("function", v.__module__, v.__qualname__, id(v.__code__), cells)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, *(fingerprint(x, depth + 1) for x in v))
    if isinstance(v, dict):
        return ("dict", *((k, fingerprint(x, depth + 1)) for k, x in sorted(v.items(), key=lambda kv: repr(kv[0]))))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v), *((f.name, fingerprint(getattr(v, f.name, None), depth + 1))
                           for f in dataclasses.fields(v) if f.name not in ("parent", "name")))
    return _ADDRESS.sub("", repr(v))


def _filled_cell(c: Any) -> bool:
    try:
        c.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


class Decider:
    """A per-match decider ``f(path, node)`` marked as one (`yax.decider`), whatever its
    parameters are called (the prototype's ``f(path, expr)``)."""

    def __init__(self, fn: Callable[[str, Any], Any]):
        if not callable(fn):
            raise errors.WrongType("fn", "a function `f(path, node)` for `yax.decider` to mark", fn)
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, path: str, node: Any) -> Any:
        return self.fn(path, node)

    def __repr__(self) -> str:
        return f"decider({self.__name__})"


def decider(fn: Callable[[str, Any], Any]) -> Decider:
    """Mark ``fn(path, node)`` as a per-match decider for `sub`: called for each
    matched node with its path and the node, it returns the replacement for that
    node, or the node itself to keep it. A function whose first two parameters
    are named ``path, node`` is a decider without this; the prototype's
    ``f(path, expr)`` needs it.

    Example:
      >>> import jax, jax.numpy as jnp, yax
      >>> mox = yax.make_mox(lambda x: jax.nn.relu(jnp.sin(x)))(jnp.ones(3))
      >>> pick = yax.decider(lambda p, expr: jax.nn.gelu if expr.name == "relu" else expr)
      >>> [n.name for n in yax.sub("//activation", pick, mox).modules()]
      ['gelu']
    """
    return Decider(fn)


def module_of(node: Mox, **changes: Any) -> Any:
    """A new module of the same type and configuration as the one the call
    ``node`` called, with ``changes``: the replacement for "the same layer,
    but …" rewrites (``dtype=jnp.bfloat16``). A linen module is built from the
    node's fields; an nnx module from its constructor, each argument read from
    the attribute of the same name (checked: a module that stores its
    arguments otherwise is refused, naming them).

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3); x = jnp.ones((1, 2))
      >>> mox = yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
      >>> yax.module_of(mox.calls[0], use_bias=False)
      Dense(
          # attributes
          features = 3
          use_bias = False
      ...
      >>> from flax import nnx
      >>> lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
      >>> node = yax.make_mox(lin)(x).calls[0]
      >>> new = yax.module_of(node, dtype=jnp.bfloat16)
      >>> type(new).__name__, new.out_features, new.dtype.__name__
      ('Linear', 3, 'bfloat16')
    """
    if not isinstance(node, Mox) or node.module_type is None:
        raise YaxRewriteError(f"`module_of` needs a module call node, but got {node!r}.")
    module = frontends.of_node(node).rebuild(node, changes)
    if module is None:
        raise CannotRebuild(
            str(node.type), node.path, f"its module system ({node.info.frontend or 'plain JAX'}) builds no module "
            "from a call's fields", "Pass the replacement module or function itself to `yax.sub`.")
    return module


def is_decider(fn: Any) -> bool:
    """Whether ``fn`` is a per-match decider: marked by `decider`, or ``f(path, node)``
    by the naming rule."""
    if isinstance(fn, Decider):
        return True
    try:
        names = list(inspect.signature(fn).parameters)[:2]
    except (TypeError, ValueError):
        return False
    return names == ["path", "node"]


def _decider_hint(fn: Any, e: BaseException) -> str:
    """For a two-parameter function that failed as a replacement (the prototype's
    decider ``f(path, expr)``): which rule it missed. Else ``""``."""
    causes = (e, e.__cause__, e.__context__)  # `make_mox` chains the call's TypeError to its YaxTraceError
    if isinstance(fn, Mox) or not callable(fn) or not any(isinstance(c, TypeError) for c in causes):
        return ""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        return ""
    if len(params) != 2:
        return ""
    names = ", ".join(p.name for p in params)
    return (f"\n`{_name(fn)}({names})` takes two arguments, so it may be meant as a decider, called with each "
            f"match's path and node; a decider's parameters must be named `path, node` (these are `{names}`), or "
            f"it is marked with `yax.decider({_name(fn)})`. As it is, it was called as a replacement.")


def is_module(x: Any) -> bool:
    """Whether ``x`` is a module of some frontend, or a template completed as
    one from each node it replaces (`yax.LoRA`): a replacement with variables."""
    return isinstance(x, Template) or frontends.of_replacement(x) is not None


def _avals(atoms: Any) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in atoms]


def _name(repl: Any) -> str:
    if isinstance(repl, Mox):
        call = own.call_of(repl)
        return f"MoX of {call.type}" if call is not None else f"MoX of {repl.name or repl.kind}"
    return getattr(repl, "__name__", None) or type(repl).__name__


def fresh(root: Mox) -> Mox:
    """A copy of a traced replacement with new vars, so that each site it is
    put in keeps the tree's single-assignment form. Nested computations are
    closed, so they are shared, not copied."""
    m: dict[Var, Var] = {}

    def new(v: Any) -> Any:
        if not isinstance(v, Var):
            return v
        nv = m.get(v)
        if nv is None:
            nv = m[v] = Var(v.shape, v.dtype, v.weak_type)
        return nv

    def ref(atoms: Any) -> tuple[Any, ...]:
        return tuple(m.get(a, a) if isinstance(a, Var) else a for a in atoms)

    def block(node: Mox) -> Mox:
        constvars = tuple(new(v) for v in node.constvars)
        invars = tuple(new(v) for v in node.invars)
        children: list[Node] = []
        for c in node.children:
            ins = ref(c.inputs)
            inner = c if isinstance(c, Equation) else block(c)
            children.append(dataclasses.replace(inner, inputs=ins, outputs=tuple(new(v) for v in c.outputs)))
        return dataclasses.replace(node, constvars=constvars, invars=invars, children=tuple(children),
                                   outvars=ref(node.outvars))

    out = block(root)
    return dataclasses.replace(out, inputs=out.invars, outputs=tuple(a for a in out.outvars if isinstance(a, Var)))


def _cut(repl: Any) -> Any:
    """A cut activation or function node stands for the computation it holds
    (a module call, cut or the one call of a root, is `yax.rewrite.own`'s)."""
    if not isinstance(repl, Mox):
        return repl
    node = repl
    if node.kind in (Kind.ACTIVATION, Kind.FUNCTION):  # its children moved to the root's path, as if traced
        return Mox(kind=Kind.ROOT, children=tuple(repath(c, node.path, "") for c in node.children),
                   inputs=node.invars, invars=node.invars,
                   outvars=node.outvars, outputs=tuple(a for a in node.outvars if isinstance(a, Var)),
                   constvars=node.constvars, consts=node.consts, name=node.name)
    return repl


def _validate(repl: Any) -> None:
    if isinstance(repl, Mox) and repl.kind != Kind.ROOT:
        raise YaxRewriteError(f"A MoX replacement must be a root from `yax.make_mox`, not a `{repl.kind}` node.")
    if isinstance(repl, Equation) and not all(isinstance(a, Var) for a in repl.inputs):
        raise YaxRewriteError("An equation replacement must take only vars as inputs (no literals).")
    if not callable(repl) and not isinstance(repl, (Mox, Equation)) and not is_module(repl):
        raise YaxRewriteError(
            f"A replacement must be a MoX, an Equation, a Flax module or a function, but got a `{type(repl).__name__}`."
        )


@dataclasses.dataclass(frozen=True)
class Called:
    """How a replacement is called on the node's inputs: positionally, or like
    the original call (``packing``: its arguments with the arrays in place).
    A value, so initialisers compiled for one call structure are shared."""

    packing: Packing | None = None

    def __call__(self, xs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (tuple(xs), {}) if self.packing is None else self.packing.unflatten(xs)

    def __repr__(self) -> str:
        return "positional" if self.packing is None else f"like {self.packing.tree} {self.packing.static!r}"


def _conventions(node: Node, module: Any) -> list[Called]:
    """How to call a replacement on the node's inputs, in the order tried: a
    module like the original call (same positional and keyword structure,
    static values in place), then with the arrays only; a function the other
    way round."""
    if not isinstance(node, Mox) or node.sig.ins.tree is None:
        return [Called()]
    structured = Called(node.sig.ins)
    return [structured, Called()] if module is not None else [Called(), structured]


def _trace_one(repl: Any, module: Any, fe: Any, avals: list[Any], call: Any, how: MappedCall | None = None) -> Traced:
    from .._trace import make_mox

    if module is not None:
        root, var_avals, n_state = fe.trace_replacement(module, avals, call, mapped=how)
        return Traced(root, len(jax.tree_util.tree_leaves(var_avals)), module, var_avals, n_state, fe.name, call,
                      mapped=how)

    def fn(*xs: Any) -> Any:
        a, k = call(xs)
        return repl(*a, **k)

    fn.__name__ = fn.__qualname__ = _name(repl)
    return Traced(make_mox(fn if call.packing is not None else repl)(*avals), call=call)


def _trace(repl: Any, module: Any, fe: Any, node: Node, avals: list[Any], how: MappedCall | None) -> Traced:
    if isinstance(repl, Mox):
        return Traced(repl, fixed=True)
    if isinstance(repl, Equation):
        # an equation's literal inputs stay among the formal parameters (eval reads them as literals)
        invars = cast(tuple[Var, ...], repl.inputs)
        return Traced(Mox(kind=Kind.ROOT, children=(repl,), inputs=repl.inputs, invars=invars,
                          outvars=repl.outputs, outputs=repl.outputs, name=repl.name), fixed=True)
    first: Exception | None = None
    for call in _conventions(node, module):
        try:
            return _trace_one(repl, module, fe, avals, call, how)
        except YaxRewriteError:
            raise
        except Exception as e:
            first = first or e
    assert first is not None  # there is always a convention to try
    raise first


def _own(repl: Mox, node: Node, cache: dict[Any, Any], mox: Mox | None) -> Traced:
    """A root MoX of ``module.apply`` or a cut call node, as its own
    computation (`yax.rewrite.own`), for this site: its variables placed by
    the layout like a module's (new ones initialised by the module type's
    ``init``, checked), or read where the replaced module has them."""
    hit = cache.get(("own", id(repl)))
    if hit is None or hit[0] is not repl:
        hit = cache[("own", id(repl))] = (repl, own.own(repl, mox if mox is not None else repl))
    o = hit[1]
    call = o.call
    if own.rebuilds(call):
        how = Called(call.sig.ins) if call.sig.ins.tree is not None else Called()
        init = own.initialiser(o, node, _name(repl))
        # initialisers are compiled once per key (`_inits` in the linen frontend): what makes the values
        made = fingerprint(init.module) if init.module is not None else ("none", init)  # refuses: never shared
        key = ("mox", made, tuple((r, type_str(a)) for r, a in own.leaves(o.var_tree)), call.method, repr(how))
        t = Traced(o.root, len(o.names), init, o.var_tree, 0, call.info.frontend, how, key=key, fixed=True)
    else:
        t = Traced(o.root, len(o.names), fixed=True, reads=o.names)
    return dataclasses.replace(t, root=fresh(t.root))


def trace(repl: Any, node: Node, cache: dict[tuple[Any, ...], tuple[Any, Traced]], chain: tuple[Any, ...] = (),
          held: Callable[..., Any] | None = None, mox: Mox | None = None) -> Traced:
    """The replacement traced on the node's input avals, with fresh vars for
    this site; ``cache`` (one per `sub` call) keeps traces by replacement,
    avals and call structure, so 96 equal replacements trace once per shape.
    A module replacing a call its module system maps (``nn.vmap``) is mapped
    the same way (`Frontend.mapping`; ``chain`` and ``held`` tell where its
    variables are stacked); a function sees the whole mapped call. A template
    (`yax.LoRA`) is completed from the node first. A MoX standing for a module call
    is used as it is (``mox``, the MoX rewritten, is where a node cut from it
    finds its variables)."""
    if own.call_of(repl) is not None:
        return _own(repl, node, cache, mox)
    given, repl = repl, _cut(repl)
    _validate(repl)
    avals = _avals(node.inputs)
    if isinstance(repl, Template):  # completed as the node's own system's module (`yax.LoRA`)
        module = repl.__yax_fill__(node)
        fe = frontends.of_replacement(module)
        if fe is None:
            raise YaxRewriteError(
                f"`{type(repl).__name__}.__yax_fill__` gave a `{type(module).__name__}` for {errors.where(node)}, "
                "which is no module of a module system yax knows. A template must give a module.")
    else:
        fe = frontends.of_replacement(repl)
        module = fe.fill(repl, node) if fe is not None else None
    mapping = None
    if module is not None and isinstance(node, Mox):
        try:
            scans = thread.stack(chain, node) if chain else ()
        except YaxRewriteError:  # a chain no variable passes (`while`): only new variables are refused, in `checked`
            scans = ()
        mapping = frontends.of_node(node).mapping(node, scans, held)
    # A module completed from the node (a clone) is shared by equal ones; others by identity.
    by_id = module is None or module is given
    sig = getattr(node, "sig", None)
    how = (str(sig.ins.tree), repr(sig.ins.static)) if sig is not None else ()
    fp = fingerprint(module) if module is not None else id(given)
    key = (id(given) if by_id else fp, tuple((a.shape, str(a.dtype)) for a in avals), how, mapping)
    hit = cache.get(key)
    if hit is not None and (not by_id or hit[0] is given):
        return dataclasses.replace(hit[1], root=fresh(hit[1].root))
    what = type(module).__name__ if module is not None else _name(repl)
    try:
        t = _trace(repl, module, fe, node, avals, mapping)
    except YaxRewriteError:
        raise
    except Exception as e:
        raise errors.NotTraceable(
            what, node, " ".join(map(type_str, node.inputs)), e,
            "A module replacement is called like the original call (same arguments, arrays in place); "
            "a function with the node's array inputs, positionally, or else like the original call."
            + _decider_hint(given, e)
        ) from None
    t = dataclasses.replace(t, key=(fp, how, mapping))
    cache[key] = (given, t)
    return dataclasses.replace(t, root=fresh(t.root))


def check(t: Traced, node: Node, repl: Any) -> None:
    """The replacement takes and returns as many arrays as the node."""
    what = _name(repl)
    if len(t.root.invars) - t.n_vars != len(node.inputs):
        raise errors.WrongCount(what, node, "inputs", len(t.root.invars) - t.n_vars, len(node.inputs),
                                 " ".join(map(type_str, node.inputs)))
    if t.fixed:  # not traced on the node's inputs: it computes what it was traced on
        for i, (a, b) in enumerate(zip(t.root.invars[t.n_vars:], node.inputs)):
            if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
                raise errors.TracedOnOtherInputs(what, node, i, type_str(a), type_str(b))
    if len(t.outvars) != len(node.outputs):
        raise errors.WrongCount(what, node, "outputs", len(t.outvars), len(node.outputs),
                                 " ".join(map(type_str, node.outputs)))


def fit(t: Traced, node: Node, repl: Any, cast: bool) -> tuple[tuple[Equation, ...], dict[int, Var]]:
    """Check output avals. With ``cast``, also the equations that cast
    outputs back to the node's dtypes, and which output each one replaces."""
    from .._trace import make_mox

    casts: list[tuple[int, Any]] = []
    for i, (a, b) in enumerate(zip(t.outvars, node.outputs)):
        if a.shape == b.shape and a.dtype == b.dtype:
            continue
        if a.shape == b.shape and cast:
            casts.append((i, b.dtype))
            continue
        hint = "Pass `cast=True` to cast outputs back to the node's dtypes." if a.shape == b.shape else ""
        if not hint and isinstance(node, Mox):  # what the node's module system does that explains it
            hint = frontends.of_node(node).fit_hint(node, tuple(a.shape), tuple(b.shape))
        raise errors.DoesNotFit(_name(repl), node, i, type_str(a), type_str(b), hint)
    if not casts:
        return (), {}
    src = [t.outvars[i] for i, _ in casts]
    c = make_mox(lambda *ys: [y.astype(d) for y, (_, d) in zip(ys, casts)])(*_avals(src))
    body = subst(c, dict(zip(c.invars, src)))
    return tuple(body.children), {i: v for (i, _), v in zip(casts, c.outvars)}


def _broadcast(node: Node, held: Callable[..., Any] | None) -> bool:
    """Whether the model holds the module's variables in the shapes the
    module saw although scans run it: they are broadcast to every step, not
    stacked per layer."""
    if held is None or not isinstance(node, Mox) or not node.var_tree:
        return False
    have = held(node)
    if not have:
        return False
    there = dict(own.leaves(have))
    mine = own.leaves(node.var_tree)
    return bool(mine) and all(r in there and tuple(there[r].shape) == tuple(a.shape) for r, a in mine)


def checked(node: Node, r: Any, cast: bool, chain: tuple[Any, ...], cache: dict[Any, Any], held: Callable[..., Any] | None = None,
            mox: Mox | None = None) -> Site:
    """``r`` traced on ``node``'s inputs after every check `sub` makes
    before it changes anything; raises `YaxRewriteError`. ``chain`` leads to
    a node inside nested computations, where new variables are passed down
    (`yax.rewrite.thread`); ``held(node)``, the shapes of a module's
    variables in the model (``{collection: tree}``), tells how a mapping
    transform (``nn.vmap``) maps them; ``mox`` is the MoX rewritten (a MoX replacement reading the
    replaced module's variables finds them there)."""
    t = trace(r, node, cache, chain, held, mox)
    check(t, node, r)
    casts = fit(t, node, r, cast)
    stack = thread.stack(chain, node) if t.n_vars and chain else ()
    if stack and t.mapped is None and t.var_avals is not None and held is not None and _broadcast(node, held):
        # the scans around it pass its variables as they are (`nn.scan(..., variable_broadcast=...)`,
        # a recurrent cell): kept ones are followed down, new ones would need a place per scan
        there = dict(own.leaves(held(node)))
        new = ["/".join(r) for r, a in own.leaves(t.var_avals)
               if r not in there or tuple(there[r].shape) != tuple(a.shape) or there[r].dtype != a.dtype]
        if new:
            raise errors.BroadcastNewVariables(_name(r), node, new)
        stack = ()
    if t.n_vars and t.mapped is not None:
        stack = (*stack, *t.mapped.stack)  # one slice per instance, inside the layers of enclosing scans
    site = Site(node, r, t, casts, chain, stack)
    if t.reads is not None and mox is not None:
        site.reads = own.resolve(mox, node, t.reads, t.root.invars[: t.n_vars], stack, _name(r))
    return site
