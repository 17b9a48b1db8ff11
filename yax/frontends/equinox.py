"""The Equinox frontend: ``eqx.Module`` models, pytrees called directly.

Tracing: ``make_mox(model)(x)`` traces ``lambda model, *args: model(*args)``
on ``(model, *args)``: the model is the MoX's first argument (its arrays
traced, its other leaves, such as activation functions, static), so
``yax.eval_mox(mox, model, x)`` runs it and ``eqx.filter_grad`` of that
differentiates with respect to the model, as Equinox users do. While a trace
runs, ``__call__`` of every ``eqx.Module`` subclass (Equinox's own layers and
the user's, not Equinox's internal wrappers) runs through
`yax._record.marked_call`. Paths come from attribute names
(``MLP/layers[0]``): the model rebuilt inside the trace is indexed by
object. A module made inside the trace (a layer sliced out of a stack by
``jax.lax.scan``, ``eqx.combine`` in a scanned body) takes the path of the
module of its type and structure below its caller whose leaves have one
leading axis more: the stack it was cut from (``Model/layers``), as linen
names ``nn.scan``'s modules.

Variables: the model itself. A `sub` with ``params=model`` returns the
rewritten model as an Equinox model (the replacement put in with
``eqx.tree_at``): leaves of the same path, shape and dtype keep their
values (also those inside a submodule of the replaced module's type, so
`yax.LoRA` keeps the ``eqx.nn.Linear`` it wraps), new ones take the
replacement's own values (Equinox modules are initialised when built), but
for the ``lora_a`` of `yax.LoRA`'s adapters, drawn from ``key`` per layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _activations, _calls, errors
from .._ir import Kind, ModuleInfo, Mox, Packing, Var
from .._lora import Adapters, first_a, register_adapters
from .._patching import Patches
from .._record import CallInfo, Recorder, marked_call, recorder
from .._scripts import Script, register_script
from ..errors import YaxRewriteError, where
from . import _mapped
from ._protocol import Frontend, MappedCall, Variables, engine

NAME = "equinox"


def _eqx() -> Any:
    import equinox

    return equinox


def _loaded() -> bool:
    return "equinox" in sys.modules


def _is_model_type(t: type) -> bool:
    """An ``eqx.Module`` class of a model or layer: Equinox's own wrappers
    (``filter_jit``'s, bound methods, ``Partial``) are not modules to show."""
    mod = getattr(t, "__module__", "") or ""
    return not mod.startswith("equinox") or mod.startswith("equinox.nn")


def is_module(x: Any) -> bool:
    return _loaded() and isinstance(x, _eqx().Module) and _is_model_type(type(x))


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)) or isinstance(x, Var)


# -- paths ------------------------------------------------------------------------------

def _key(k: Any) -> tuple[str, str]:
    """``(path text, scope key)`` of one key: ``.layers`` -> ``("/layers", "layers")``, ``[0]`` -> ``("[0]", "0")``."""
    if isinstance(k, jax.tree_util.GetAttrKey):
        return f"/{k.name}", k.name
    if isinstance(k, jax.tree_util.SequenceKey):
        return f"[{k.idx}]", str(k.idx)
    if isinstance(k, jax.tree_util.DictKey):
        return f"[{k.key!r}]", str(k.key)
    return f"/{k}", str(k)


def _children(x: Any) -> list[tuple[Any, Any]]:
    """``(key, child)`` one level below ``x`` (a module, list, tuple or dict)."""
    if isinstance(x, _eqx().Module):
        return [(jax.tree_util.GetAttrKey(f.name), getattr(x, f.name, None)) for f in dataclasses.fields(x)]
    if isinstance(x, (list, tuple)):
        return [(jax.tree_util.SequenceKey(i), v) for i, v in enumerate(x)]
    if isinstance(x, dict):
        return [(jax.tree_util.DictKey(k), v) for k, v in x.items()]
    return []


@dataclasses.dataclass
class _Trace:
    """What the Equinox frontend keeps for one trace (in ``Recorder.scratch``)."""

    paths: dict[int, tuple[Any, str, tuple[str, ...] | None]] = dataclasses.field(default_factory=dict)
    #: each known module's key path below the model, as `jax.tree_util.keystr` writes it (``.layers[1]``), by path
    keys: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the modules made inside the trace, by id: the known modules (object, path, scope) each could have come from
    options: dict[int, list[tuple[Any, str, tuple[str, ...] | None]]] = dataclasses.field(default_factory=dict)
    #: the calls of those modules, with the modules they could have come from (`settle` picks one)
    guessed: list[tuple[CallInfo, list[tuple[Any, str, tuple[str, ...] | None]]]] = dataclasses.field(
        default_factory=list)

    def index(self, root: Any, path: str, scope: tuple[str, ...] | None) -> None:
        """Give every module below ``root`` not yet known its path and scope (its keys below the model)."""
        todo = [(root, path, scope, self.keys.get(path, ""))]
        while todo:
            x, p, s, ks = todo.pop()
            if isinstance(x, _eqx().Module):
                if id(x) in self.paths:
                    continue
                self.paths[id(x)] = (x, p, s)  # the object itself keeps its id unique while the trace runs
            if s is not None:
                self.keys.setdefault(p, ks)
            for k, v in _children(x):
                if isinstance(v, (_eqx().Module, list, tuple, dict)):
                    text, key = _key(k)
                    assert s is not None, "a module made inside a call has no scope to give its submodules"
                    todo.append((v, p + text, (*s, key), ks + jax.tree_util.keystr((k,))))

    def of(self, module: Any, rec: Recorder) -> tuple[str, tuple[str, ...] | None]:
        hit = self.paths.get(id(module))
        if hit is not None and hit[0] is module:
            return hit[1], hit[2]
        name = type(module).__name__
        parent = rec.stack[-1][1] if rec.stack else None
        found, options = self._stack_of(module, parent)
        if options:
            self.options[id(module)] = options
        if found is not None:
            self.index(module, *found)
            return found
        if not rec.stack:  # the outermost module (a replacement traced on its own): scopes below it are its own
            if rec.root_name is None:
                rec.root_name = name
            self.index(module, name, ())
            return name, ()
        path = f"{rec.parent_path()}/{name}"
        self.index(module, path, ())
        self.paths[id(module)] = (module, path, None)  # made inside the call: no place in the model
        return path, None

    def _stack_of(self, module: Any, parent: Any) -> tuple[tuple[str, tuple[str, ...] | None] | None,
                                                          list[tuple[Any, str, tuple[str, ...] | None]]]:
        """The known module below ``parent`` that ``module`` was sliced from:
        of its type and structure, with every leaf one leading axis longer
        (or, failing that, the one module of its type and structure); and every
        module it could have come from. Shapes alone can mislead (a layer
        under ``jax.checkpoint`` beside a stack of such layers): `settle`
        checks the guess against what the call reads."""
        if parent is None or id(parent) not in self.paths:
            return None, []
        t, tree = type(module), jax.tree_util.tree_structure(module)
        shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(module) if _is_array(x)]
        stacked, options = [], []
        for x, p, s in self.paths.values():
            if type(x) is not t or x is module or not p.startswith(self.paths[id(parent)][1]):
                continue
            if jax.tree_util.tree_structure(x) != tree:  # type: ignore[operator]  # no PyTreeDef stubs
                continue
            options.append((x, p, s))
            theirs = [np.shape(y) for y in jax.tree_util.tree_leaves(x) if _is_array(y)]
            if len(theirs) == len(shapes) and all(len(a) == len(b) + 1 and a[1:] == b
                                                  for a, b in zip(theirs, shapes)):
                stacked.append((p, s))
        pick = stacked if stacked else [(p, s) for _, p, s in options]
        return (pick[0] if len(pick) == 1 else None), options

    def _arrays(self, module: Any, path: str) -> tuple[str, ...]:
        """The key paths of the arrays of the known ``module`` at ``path``, below the model."""
        return tuple(self.keys[path] + jax.tree_util.keystr(kp)
                     for kp, x in jax.tree_util.tree_flatten_with_path(module)[0] if _is_array(x))

    def settle(self, mox: Mox, rec: Recorder) -> bool:
        """Correct the guessed path of each call of a module made inside the
        trace from the data flow: the one known module it could have come from
        whose arrays the call reads (the root's inputs it reads through calls,
        ``jit``, ``jax.checkpoint`` and scans slicing a stack, named by their
        key paths), renaming the calls below it alike."""
        names = mox.sig.ins.paths  # each input of the root's key path, as `keystr` writes it
        if not self.guessed or not names:
            return False
        bound = _calls.bound(mox)
        nodes = {id(n.info): n for n in mox.walk() if isinstance(n, Mox) and n.kind == Kind.MODULE_CALL}
        calls = {id(c.info): c for c in rec.calls.values()}
        changed = False
        for call, options in self.guessed:
            node = nodes.get(id(call.info))
            if node is None:
                continue
            read = {names[bound[v][0]] for v in _free(node) if v in bound}
            if not read:
                continue
            fits = []
            for x, p, s in options:
                if s is not None and p in self.keys:
                    arrays = self._arrays(x, p)  # once an option, not once a read
                    if all(r.endswith(arrays) for r in read):
                        fits.append((p, s))
            if len(fits) != 1 or fits[0] == (call.path, call.info.scope):
                continue
            (path, scope), old, old_scope = fits[0], call.path, call.info.scope or ()
            for n in [node, *node.walk()]:
                c = calls.get(id(n.info)) if isinstance(n, Mox) else None
                if c is None or not (c.path == old or c.path.startswith(old + "/")):
                    continue
                c.path = path + c.path[len(old):]
                s = c.info.scope
                if c is call:
                    s = scope
                elif s is not None and s[:len(old_scope)] == old_scope:
                    s = scope + s[len(old_scope):]
                c.info = dataclasses.replace(c.info, scope=s)
            call.name = path.rsplit("/", 1)[-1]
            changed = True
        return changed


def _free(node: Mox) -> set[Any]:
    """The variables the calls and equations below ``node`` read but none of
    them binds, nor ``node`` takes as an input: what its code closes over."""
    read: set[Any] = set()
    bound: set[Any] = set(node.invars)
    for n in node.walk():
        read.update(n.inputs)
        if isinstance(n, Mox):
            bound.update(n.invars)
            bound.update(n.constvars)
        bound.update(n.outputs)
    return read - bound


# -- what a call node records -----------------------------------------------------------

_PRINTABLE = (bool, int, float, str, type(None), np.dtype, type)


def _printable(v: Any) -> bool:
    if isinstance(v, _PRINTABLE):
        return True
    if isinstance(v, tuple):
        return all(_printable(x) for x in v)
    return callable(v) and not isinstance(v, (jax.Array, _eqx().Module))


def module_attrs(module: Any) -> dict[str, Any]:
    """The configuration of an Equinox module: its fields that are not arrays
    or modules (``in_features``, ``use_bias``, ``activation``)."""
    out = {}
    for f in dataclasses.fields(module):
        v = getattr(module, f.name, None)
        if v is None and not f.metadata.get("static"):  # an array field left empty (`bias` without a bias)
            continue
        if not f.name.startswith("_") and _printable(v):
            out[f.name] = v
    return out


def _variables(module: Any) -> tuple[dict[str, Any], int]:
    """The module's arrays as nested dicts of abstract leaves by field, and the
    number of elements of its floating-point ones (its parameters)."""
    tree: dict[str, Any] = {}
    n = 0
    for kp, x in jax.tree_util.tree_flatten_with_path(module)[0]:
        if not _is_array(x):
            continue
        at = tree
        keys = [_key(k)[1] for k in kp]
        for k in keys[:-1]:
            at = at.setdefault(k, {})
        at[keys[-1]] = jax.ShapeDtypeStruct(np.shape(x), x.dtype)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            n += math.prod(np.shape(x))
    return tree, n


@functools.cache
def init_defaults(cls: type[Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = recorder()
        tr = rec.scratch.get(NAME) if rec is not None else None
        if rec is None or tr is None:
            return fn(self, *args, **kwargs)
        if rec.stack and rec.stack[-1][1] is self:
            return fn(self, *args, **kwargs)  # `super().__call__(x)`: part of the same call
        path, scope = tr.of(self, rec)
        call = CallInfo(kind=Kind.MODULE_CALL, path=path, name=path.rsplit("/", 1)[-1], module=self,
                        info=ModuleInfo(type=type(self), method="__call__"))
        if id(self) in tr.options:
            tr.guessed.append((call, tr.options[id(self)]))
        names = [f.name for f in dataclasses.fields(self)]
        undo = _activations.swapped([(self, k) for k in names], getattr, object.__setattr__)
        try:
            out = marked_call(call, lambda *a, **k: fn(self, *a, **k), args, kwargs)
        finally:
            _activations.restore(undo, object.__setattr__)
        tree, n = _variables(self)
        call.info = ModuleInfo(type=type(self), method="__call__", attrs=module_attrs(self),
                               defaults=init_defaults(type(self)),  # type: ignore[arg-type]  # mypy#11470
                               num_params=n, var_tree={"params": tree} if tree else {}, scope=scope,
                               frontend=NAME, seen=call.seen)
        return out

    method.__yax_method__ = fn  # type: ignore[attr-defined]
    return method


def _classes() -> list[type]:
    out, todo, seen = [], [_eqx().Module], set()
    while todo:
        for c in todo.pop().__subclasses__():
            if c not in seen:
                seen.add(c)
                todo.append(c)
                if _is_model_type(c) and inspect.isfunction(vars(c).get("__call__")):
                    out.append(c)
    return out


_patches = Patches(put=type.__setattr__)  # Equinox's modules refuse `setattr` on their classes


@contextlib.contextmanager
def _patched(rec: Recorder) -> Iterator[None]:
    """Wrap ``__call__`` of every Equinox model class for one trace (while any
    trace in any thread runs: the first wraps, the last unwraps)."""
    if not _loaded():
        yield
        return
    rec.scratch[NAME] = _Trace()

    def unwrapped() -> Iterator[tuple[type, str, Callable[..., Any]]]:
        for cls in _classes():
            fn = vars(cls)["__call__"]
            if not hasattr(fn, "__yax_method__"):
                yield cls, "__call__", fn

    with _patches.wrapped(unwrapped, lambda _, fn: _wrap(fn)):
        yield


# -- LoRA -------------------------------------------------------------------------------

@functools.cache
def _lora_type() -> type:
    import equinox as eqx

    class LoRALinear(eqx.Module):
        """An ``eqx.nn.Linear`` plus a low-rank update of its weight:
        ``base.weight + (lora_a @ lora_b).T * alpha / rank``; ``lora_b``
        starts at zero, so it starts exactly equal to ``base``."""

        base: Any
        lora_a: jax.Array
        lora_b: jax.Array
        alpha: float = eqx.field(static=True, default=4.0)

        def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
            rank = self.lora_a.shape[-1]
            weight = self.base.weight + (self.lora_a @ self.lora_b).T.astype(self.base.weight.dtype) * (
                self.alpha / rank)
            y: jax.Array = eqx.tree_at(lambda m: m.weight, self.base, weight)(x)
            return y

    LoRALinear.__module__ = __name__
    LoRALinear.__qualname__ = "LoRALinear"
    return LoRALinear


def _linear(a: Any) -> Any:
    eqx = _eqx()
    return eqx.nn.Linear(a["in_features"], a["out_features"], use_bias=a.get("use_bias", True),
                         key=jax.random.key(0))


def _lora(node: Mox, rank: int, alpha: float) -> Any:
    eqx = _eqx()
    a = node.attrs
    if node.module_type is not eqx.nn.Linear or not all(isinstance(a.get(k), int)
                                                         for k in ("in_features", "out_features")):
        return None
    dtype = node.var_tree["params"]["weight"].dtype
    base = _cast(_linear(a), dtype)
    lora_a = jax.random.normal(jax.random.key(0), (a["in_features"], rank), dtype) / rank
    return _lora_type()(base, lora_a, jnp.zeros((rank, a["out_features"]), dtype), alpha)


def _lora_drawn(module: Any, key: Any, index: int, stack: tuple[int, ...]) -> dict[str, jax.Array]:
    """``{"lora_a": …}`` of a `LoRALinear`, drawn from ``key`` as the ``index``-th layer a `sub`
    adapts (`yax._lora.first_a`); ``{}`` for any other module (it comes built, with its own values)."""
    adapter: Any = _lora_type()
    if type(module) is not adapter:
        return {}
    a = module.lora_a
    return {"lora_a": first_a(key, index, stack, a.shape, a.dtype, a.shape[-1])}


def _merge(mox: Mox, model: Any) -> tuple[Mox, Any] | None:
    sub = engine.sub

    t = _lora_type()
    nodes = [n for n in mox.modules() if n.module_type is t and n.scope is not None]
    if not nodes:
        return None
    if model is None:
        raise errors.NeedsParams("`merge_lora` folds the adapters' trained values into the layers: pass the "
                                 "model (`yax.merge_lora(mox, model)`).", "merge_lora")
    eqx = _eqx()
    merged = model
    for n in {n.scope: n for n in nodes}.values():
        at = _get(merged, n.scope)

        def fold(w: Any, a: Any, b: Any, alpha: float = n.attrs["alpha"]) -> Any:
            return (w + (a @ b).T.astype(w.dtype) * (alpha / a.shape[-1])).astype(w.dtype)

        for _ in range(at.lora_a.ndim - 2):  # layers stacked for `jax.lax.scan` lead each leaf
            fold = jax.vmap(fold)
        w = fold(at.base.weight, at.lora_a, at.lora_b)
        merged = eqx.tree_at(lambda m, s=n.scope: _get(m, s).base.weight, merged, w)

    def linear_of(path: str, node: Mox) -> Any:
        base = _get(model, node.scope).base
        return _cast(_linear(_fields(base)), base.weight.dtype)

    out: tuple[Mox, Any] = sub(nodes, linear_of, mox, params=merged,
                               keep={"weight": "base/weight", "bias": "base/bias"})
    return out


register_adapters(NAME, Adapters(kinds=("eqx.nn.Linear",), make=lambda node, spec: _lora(node, spec.rank, spec.alpha),
                        merge=lambda mox, model: _merge(mox, model) if mox.frontend == NAME else None))


def _cast(module: Any, dtype: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: x.astype(dtype) if _is_array(x) else x, module)


def _fields(m: Any) -> dict[str, Any]:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}


# -- variables ----------------------------------------------------------------------------

def _get(x: Any, scope: Sequence[str]) -> Any:
    for k in scope:
        if isinstance(x, (list, tuple)):
            x = x[int(k)]
        elif isinstance(x, dict):
            x = x[k] if k in x else next(v for kk, v in x.items() if str(kk) == k)
        else:
            x = getattr(x, k)
    return x


def _rel(kp: Sequence[Any]) -> str:
    return "/".join(_key(k)[1] for k in kp)


def _array_leaves(tree: Any) -> list[tuple[str, Any]]:
    """``(relative path, leaf)`` of the array leaves of ``tree``, in flattening order."""
    return [(_rel(kp), x) for kp, x in jax.tree_util.tree_flatten_with_path(tree)[0] if _is_array(x)]


@dataclasses.dataclass
class _Scope:
    node: Mox
    module: Any
    canon: dict[str, Var] = dataclasses.field(default_factory=dict)
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    paths: list[str] = dataclasses.field(default_factory=list)


class ModelVariables(Variables):
    """The model of an Equinox root during a `sub`: where a replaced module's
    arrays go, and the new model (`eqx.tree_at`) and root signature."""

    def __init__(self, root: Mox, model: Any):
        self.root, self.model = root, model
        self.scopes: dict[tuple[str, ...], _Scope] = {}
        self._old: dict[tuple[str, ...], dict[str, Var]] = {}

    def _old_vars(self, scope: tuple[str, ...]) -> dict[str, Var]:
        (model_vars, *_), _ = self.root.sig.args(self.root.invars)
        return {p: v for p, v in _array_leaves(_get(model_vars, scope)) if isinstance(v, Var)}

    def place(self, sites: list[Any], key: Any, keep: dict[str, str] | None = None) -> dict[int, dict[Var, Var]]:
        ours = [s for s in sites if s.traced.module is not None]
        for s in ours:
            if s.traced.frontend != NAME:
                raise errors.ForeignModule(
                    type(s.traced.module).__name__, s.node, s.traced.frontend, "equinox", "an Equinox model",
                    "Replace with an Equinox module or a function.")
        if not ours:
            return {id(s.node): {} for s in sites}
        self._check(sites)
        return {id(s.node): self._assign(s, keep, key) for s in sites}

    def _check(self, sites: list[Any]) -> None:
        if self.model is None:
            raise errors.NeedsParams(
                "The replacement has variables; pass `params=model` (the Equinox model the MoX was traced with) "
                "so yax can return the new model.", "sub")
        for s in sites:
            if s.traced.module is None:
                raise errors.MixedReplacements("Equinox", s.node)
            if not isinstance(s.node, Mox) or s.node.kind != Kind.MODULE_CALL or s.node.scope is None:
                raise errors.WrongNodeKind(
                    "An Equinox module", "can replace module calls of the model's own modules", where(s.node),
                    "Replace activations, equations and modules made inside the model's call with functions.",
                    s.node)
        errors.PartlyMatchedModule.check(self.root, sites, "Equinox", "one value of the model")

    def _sources(self, sc: _Scope, keep: dict[str, str] | None) -> dict[str, str]:
        """New leaf path -> old leaf path, for leaves not kept at their own path:
        ``keep=``, or a submodule of the replaced module's type inside the replacement."""
        if keep is not None:
            return dict(keep)
        out = {}
        for kp, x in jax.tree_util.tree_flatten_with_path(sc.module, is_leaf=lambda y: y is not sc.module and
                                                           type(y) is sc.node.module_type)[0]:
            if type(x) is sc.node.module_type:
                for p, _ in _array_leaves(x):
                    out[f"{_rel(kp)}/{p}"] = p
        return out

    def _assign(self, s: Any, keep: dict[str, str] | None, key: Any) -> dict[Var, Var]:
        scope, t = s.node.scope, s.traced
        flat = _array_leaves(t.var_avals)
        sc = self.scopes.get(scope)
        lead = tuple(s.stack)
        if sc is None:
            # `yax.LoRA`'s adapters draw `lora_a` from `key`, folded with the scope's index (as linen's)
            own = _lora_drawn(t.module, key, len(self.scopes), lead if s.chain else ())
            sc = self.scopes[scope] = _Scope(s.node, t.module, paths=[p for p, _ in flat])
            old = self._old[scope] = self._old_vars(scope)
            old_vals = dict(_array_leaves(_get(self.model, scope)))
            sources = self._sources(sc, keep)
            for (rel, x), tv in zip(flat, t.root.invars):
                x = own.get(rel, x)
                src = sources.get(rel) if keep is not None else sources.get(rel, rel)
                ov = old.get(src) if src is not None else None
                shape = (*lead, *tv.shape)
                if src is not None and ov is not None and ov.shape == shape and ov.dtype == tv.dtype:
                    sc.canon[rel], sc.values[rel] = ov, old_vals[src]
                    continue
                if keep is not None and rel in keep:
                    raise YaxRewriteError(
                        f"`keep` maps `{rel}` of the replacement for {where(s.node)} to `{src}`, but the module "
                        f"holds {'no such leaf' if ov is None else f'it as {ov.dtype}{list(ov.shape)}'} where the "
                        f"replacement's is {tv.dtype}{list(shape)}. Map it to a leaf of that shape and dtype.")
                if s.chain:  # a root input of its own, passed down (and stacked per scanned layer)
                    sc.canon[rel] = Var(shape, tv.dtype, tv.weak_type)
                    sc.values[rel] = jnp.broadcast_to(x, shape) if lead and rel not in own else x
                else:
                    sc.canon[rel], sc.values[rel] = tv, x
            if not any(v in old.values() for v in sc.canon.values()) and keep is None and old and any(
                    (tuple(a.shape), a.dtype) in {(tuple(v.shape[len(lead):]), v.dtype) for v in old.values()}
                    for _, a in flat):
                raise errors.KeepsNothing(
                    type(t.module).__name__, s.node, [], "replaced by the replacement's own", "Give them the old "
                    "field names, or say which old leaf each takes with `keep={\"new/path\": \"old/path\"}` "
                    "(`keep={}` to take the replacement's own values).")
        elif sc.paths != [p for p, _ in flat]:
            raise errors.SharedVariables(s.node.path)
        return {tv: sc.canon[rel] for (rel, _), tv in zip(flat, t.root.invars) if sc.canon[rel] is not tv}

    def held(self, node: Any) -> dict[str, Any] | None:
        """The shapes of the module's arrays as the model holds them (stacked ones with their layer axis)."""
        scope = getattr(node, "scope", None)
        if scope is None or not getattr(node, "var_tree", None):
            return None
        (model_vars, *_), _ = self.root.sig.args(self.root.invars)
        try:
            tree, _ = _variables(_get(model_vars, scope))
        except (AttributeError, IndexError, KeyError, StopIteration):
            return None
        return {"params": tree}

    def dropped(self) -> set[Var]:
        kept = {v for sc in self.scopes.values() for v in sc.canon.values()}
        return {v for old in self._old.values() for v in old.values() if v not in kept}

    def finish(self, new: Mox, sites: list[Any]) -> Any:
        if not self.scopes:
            return new if self.model is None else (new, self.model)
        eqx = _eqx()
        (model_vars, *rest), kwargs = self.root.sig.args(self.root.invars)
        model = self.model
        for scope, sc in sorted(self.scopes.items(), key=lambda kv: len(kv[0])):
            params, static = eqx.partition(sc.module, eqx.is_array)
            td = jax.tree_util.tree_structure(params)
            with_vars = eqx.combine(jax.tree_util.tree_unflatten(td, [sc.canon[p] for p in sc.paths]), static)
            with_vals = eqx.combine(jax.tree_util.tree_unflatten(td, [sc.values[p] for p in sc.paths]), static)
            model_vars = _put(model_vars, scope, with_vars)
            model = _put(model, scope, with_vals)
        ins, invars = Packing.of(((model_vars, *rest), kwargs), lambda x: isinstance(x, Var), with_paths=True)
        root = dataclasses.replace(new, invars=tuple(invars), inputs=tuple(invars),
                                   sig=dataclasses.replace(new.sig, ins=ins))
        return root, model


def _put(tree: Any, scope: tuple[str, ...], value: Any) -> Any:
    if not scope:
        return value
    return _eqx().tree_at(lambda m: _get(m, scope), tree, value)


# -- the frontend ----------------------------------------------------------------------------

class EquinoxFrontend(Frontend):
    name = NAME
    order = 30
    libraries = ("equinox",)

    def call_signature(self, target: Any) -> tuple[Callable[..., Any], int] | None:
        return (target.__call__, 0) if is_module(target) else None  # the model itself is no parameter of it

    def hooks(self, rec: Any) -> Any:
        return _patched(rec)

    def settle(self, mox: Mox, rec: Any) -> bool:
        tr = rec.scratch.get(NAME)
        return tr is not None and tr.settle(mox, rec)

    def accepts(self, fn: Any) -> bool:
        return is_module(fn)

    def prepare(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]:
        name = type(fn).__name__

        def call(model: Any, *args: Any, **kwargs: Any) -> Any:
            rec = recorder()
            tr = rec.scratch.get(NAME) if rec is not None else None
            if rec is not None and tr is not None:
                rec.root_name = name
                tr.index(model, name, ())
            return model(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call, (fn, *args), kwargs, None

    def arguments(self, fn: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fn, *args)

    def defaults(self, cls: type) -> dict[str, Any]:
        return init_defaults(cls)

    def owns(self, x: Any) -> bool:
        return is_module(x)

    def trace_replacement(self, module: Any, avals: list[Any], call: Callable[..., Any],
                          mapped: MappedCall | None = None) -> tuple[Mox, Any, int]:
        if mapped is not None and not isinstance(mapped, _mapped.Mapped):
            raise NotImplementedError("An Equinox module is mapped only like a call inside `jax.vmap`.")
        eqx = _eqx()
        params, static = eqx.partition(module, eqx.is_array)

        def called(p: Any, *xs: Any) -> Any:
            a, k = call(xs)
            return eqx.combine(p, static)(*a, **k)

        called.__name__ = called.__qualname__ = type(module).__name__
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), params)
        if mapped is None:
            return engine.make_mox(called)(abstract, *avals), params, 0
        # under `jax.vmap` like the layer it replaces: on one instance's inputs, its arrays shared
        return _mapped.trace_mapped(module, called, abstract, avals, mapped), params, 0

    def mapping(self, node: Mox, scans: tuple[int, ...], held: Callable[[Any], Any] | None) -> MappedCall | None:
        return _mapped.mapped(node, scans, held, "jax.vmap")

    def fit_hint(self, node: Mox, found: tuple[int, ...], expected: tuple[int, ...]) -> str:
        return _mapped.fit_hint(node, found, expected, "jax.vmap")

    def variables(self, mox: Mox, params: Any) -> Variables | None:
        return ModelVariables(mox, params) if mox.frontend == NAME else None

    def variables_argument(self, mox: Mox, args: tuple[Any, ...]) -> Any:
        return args[0] if mox.frontend == NAME and args else None

    prepended = 1  # the model itself


frontend = EquinoxFrontend()


def _lines(model: str, inputs: Sequence[str], kwargs: str, has_params: bool) -> list[str]:
    call = (", ".join(inputs) + kwargs).removeprefix(", ")  # keyword inputs only: no comma first
    return [f"mox = yax.make_mox({model})({call})", f"params = {model}"]


register_script(NAME, Script(names=lambda n, has_params: ["model", "x", *(f"input{i}" for i in range(2, n + 1))][: n + 1],
                             lines=_lines, homes=(("equinox", "eqx"), ("equinox.nn", "eqx.nn"))))
