"""The flax.linen frontend.

Tracing: a Flax interceptor (``nn.intercept_methods``) runs every module
method call through `yax._record.marked_call`; paths come from Flax's scope
paths (``Model/Block_3/Dense_0``); module fields that hold an activation are
pointed at its marking wrapper for the call.

Variables: a linen model's variables are the nested dict ``apply`` takes,
``{collection: {scope...: leaf}}``, somewhere among the root's arguments.
`DictVariables` finds it, places a replacement module's variables at the
replaced module's scope (leaves of the same name, shape and dtype keep their
values, new ones are initialised with the caller's key, the rest dropped)
and rebuilds the root's signature around the new dict.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.core
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ... import _activations, errors
from ..._ir import Kind, ModuleInfo, Mox, Var
from ..._record import CallInfo, Recorder, marked_call, recorder
from ..._scripts import Script, register_script
from ...errors import ParamDtypeDiffers, YaxRewriteError, where
from .. import _mapped as _vmap
from .._protocol import Frontend, MappedCall, Variables, engine
from ._lora import LoRA as LoRA

_SKIP_FIELDS = ("parent", "name")


# -- tracing ------------------------------------------------------------------------

def _path(module: nn.Module, rec: Recorder) -> str:
    """``Model/Block_3/Dense_0`` for a bound linen module."""
    names = list(module.path or ())
    if not names and module.name is not None and isinstance(module.parent, nn.Module):
        # Lifted-transform wrappers (nn.scan(Block)) have no scope path of their own.
        return f"{_path(module.parent, rec)}/{module.name}"
    if module.parent is None or not names:
        root_name = module.name or type(module).__name__
        if rec.root_name is None:
            rec.root_name = root_name
        if not names:
            # A root: the outermost one, or a module applied inside another
            # (tied embeddings through `other.apply`): nest it under its caller.
            outer = [c for c, m in rec.stack if m is not None and m is not module]
            if outer and rec.calls[outer[-1]].path:
                return f"{rec.calls[outer[-1]].path}/{root_name}"
            return root_name
    # below the root of its tree: under that root's own path (a tree applied inside another
    # module's call, as a ToNNX bridge applies one, nests under its caller)
    root = module
    while isinstance(root.parent, nn.Module):
        root = root.parent
    if not root.path:  # (the top of a lifted transform's clones has its full scope path: no prefix)
        for c, m in reversed(rec.stack):
            if m is root and rec.calls[c].path:
                return "/".join([rec.calls[c].path, *names])
    return "/".join([rec.root_name or "Model", *names])


def _fields(module: nn.Module) -> dict[str, Any]:
    names = _field_names(type(module))  # type: ignore[arg-type]  # mypy#11470
    return {name: getattr(module, name, None) for name in names}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _SKIP_FIELDS)


def _leaf(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)


class _Abstracts:
    """Abstract copies of variable trees, with their sizes, for one trace.

    A layer's variables are part of its parent's (the same dict objects), so
    each subtree is copied and counted once, however deep the model is: the
    calls of a 12-layer BERT would otherwise copy 3,400 leaves, not 700.
    Copies are shared and never changed. What is seen is kept, so ids stay
    unique while the trace runs.
    """

    def __init__(self) -> None:
        self.seen: dict[int, tuple[Any, Any, int]] = {}

    def __call__(self, tree: Any) -> tuple[Any, int]:
        """``tree`` as ``jax.ShapeDtypeStruct`` leaves, and its number of elements."""
        hit = self.seen.get(id(tree))
        if hit is not None and hit[0] is tree:
            return hit[1], hit[2]
        out: tuple[Any, int]
        if type(tree) is dict:
            parts = {k: self(v) for k, v in tree.items()}
            out = {k: a for k, (a, _) in parts.items()}, sum(n for _, n in parts.values())
        elif isinstance(tree, (jax.core.Tracer, jax.Array, np.ndarray)):
            out = jax.ShapeDtypeStruct(tree.shape, tree.dtype), math.prod(tree.shape)
        else:  # a node of another kind (boxed `nn.Partitioned`, a FrozenDict), or a scalar
            out = (jax.tree_util.tree_map(_leaf, tree),
                   sum(math.prod(np.shape(x)) for x in jax.tree_util.tree_leaves(tree)))
        self.seen[id(tree)] = (tree, *out)
        return out


def _interceptor(next_fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], context: Any) -> Any:
    rec = recorder()
    if rec is None or context.method_name == "setup" or (rec.stack and getattr(type(rec.stack[-1][1]), "__yax_inline__", False)):
        # modules declaring `__yax_inline__` (yax.LoRA) compute with other modules as part of their own call
        return next_fun(*args, **kwargs)
    module = context.module
    method = context.method_name
    if not method.isidentifier():  # lifted transforms wrap __call__ in a lambda
        method = "__call__"
    same = bool(rec.stack) and rec.stack[-1][1] is module
    if same and rec.calls[rec.stack[-1][0]].info.method == method:
        return next_fun(*args, **kwargs)  # `super().__call__(x)`: part of the same call
    if same and method.startswith("_") and type(module).__module__.startswith("flax."):
        return next_fun(*args, **kwargs)  # Flax's own helper inside its module's call (`ToLinen._update_variables`)
    path = _path(module, rec)
    call = CallInfo(kind=Kind.METHOD_CALL if same else Kind.MODULE_CALL, path=path,
                    name=module.path[-1] if module.path else path.rsplit("/", 1)[-1], module=module,
                    info=ModuleInfo(type=type(module), method=method))  # read by nested calls
    # fields and attributes set in `setup` (`self.act = ACT2FN["gelu"]`) alike
    undo = _activations.swapped([(module, k) for k in vars(module)], getattr, object.__setattr__)
    try:
        out = marked_call(call, next_fun, args, kwargs)
    finally:
        _activations.restore(undo, object.__setattr__)
    try:
        variables = module.variables
    except Exception:  # an unbound helper module: nothing to count
        variables = {}
    abstract = rec.scratch.get("linen") or rec.scratch.setdefault("linen", _Abstracts())
    call.info = ModuleInfo(
        type=type(module), method=method, attrs=_fields(module), defaults=frontend.defaults(type(module)),
        num_params=abstract(variables.get("params", {}))[1],
        var_tree={col: abstract(tree)[0] for col, tree in variables.items()},
        scope=tuple(module.path) if module.scope is not None else None, frontend=frontend.name,
        seen=call.seen,
    )
    return out


# -- parameters ------------------------------------------------------------------------

def _keystr(path: Sequence[Any]) -> str:
    return jax.tree_util.keystr(tuple(path))


def _get(tree: Any, keys: Sequence[str]) -> Any:
    for k in keys:
        if not isinstance(tree, Mapping) or k not in tree:
            return None
        tree = tree[k]
    return tree


def _put(tree: Any, keys: Sequence[str], value: Any) -> Any:
    """A copy of nested dict ``tree`` with ``value`` at ``keys`` (removed if None)."""
    out = dict(tree)
    k = keys[0]
    if len(keys) == 1:
        if value is None:
            out.pop(k, None)
        else:
            out[k] = value
        return out
    out[k] = _put(out.get(k, {}), keys[1:], value)
    return out


def _set_in(tree: Any, path: Sequence[Any], value: Any) -> Any:
    """A copy of an argument pytree with ``value`` at key path ``path``."""
    if not path:
        return value
    k = path[0]
    if isinstance(k, jax.tree_util.SequenceKey) and isinstance(tree, (tuple, list)):
        items = list(tree)
        items[k.idx] = _set_in(items[k.idx], path[1:], value)
        return type(tree)(items)
    if isinstance(k, jax.tree_util.DictKey) and isinstance(tree, dict):
        return {**tree, k.key: _set_in(tree[k.key], path[1:], value)}
    raise YaxRewriteError(
        "The parameters sit inside an argument yax cannot rebuild (only tuples, lists and dicts "
        f"lead to them; found `{type(tree).__name__}`). Pass the parameter dict as a plain argument."
    )


def _find(args: Any, values: Any) -> tuple[tuple[Any, ...], Any]:
    """Where the dict ``values`` sits among the traced arguments ``args``
    (a key path) and the same dict holding the root's vars."""
    by_path = {_keystr(kp): (kp, leaf) for kp, leaf in jax.tree_util.tree_flatten_with_path(args)[0]}
    flat = jax.tree_util.tree_flatten_with_path(values)[0]
    if not flat:
        return _empty_dict(args)
    first = _keystr(flat[0][0])
    prefix = next((h[: len(h) - len(first)] for h in by_path if h.endswith(first)
                   and all(h[: len(h) - len(first)] + _keystr(kp) in by_path for kp, _ in flat)), None)
    if prefix is None:
        raise errors.ParamsDoNotFit(
            "`params` is not among the arguments the MoX was traced with: no argument holds its "
            f"leaf `{first}` together with all its other leaves.", "Pass the variables as the MoX takes "
            "them: the dict given to `model.apply` (`{'params': ...}`), or the bare `params` collection "
            "where the traced function takes that (`model(ids, params=params)`).", leaf=first)
    for kp, x in flat:
        v = by_path[prefix + _keystr(kp)][1]
        if not isinstance(v, Var) or tuple(np.shape(x)) != v.shape:
            expected, found = getattr(v, "shape", "a static value"), tuple(np.shape(x))
            raise errors.ParamsDoNotFit(
                f"`params` leaf `{_keystr(kp)}` has shape {found}, but the MoX was traced with {expected}.",
                "Pass the parameters it was traced with.", _keystr(kp), expected, found)
    where = by_path[prefix + first][0][: -len(flat[0][0])]
    given = {prefix + _keystr(kp) for kp, _ in flat}
    missing = [h[len(prefix):] for h, (kp, leaf) in by_path.items()
               if kp[: len(where)] == where and isinstance(leaf, Var) and h not in given]
    if missing:
        raise errors.ParamsDoNotFit(
            f"`params` lacks {len(missing)} of the variables the MoX was traced with (first `{missing[0]}`).",
            "Pass all the variables it was traced with; `sub` returns them with the replaced modules' changed.",
            missing[0])
    return where, jax.tree_util.tree_map_with_path(lambda kp, _: by_path[prefix + _keystr(kp)][1], values)


def _dicts(args: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every dict among the arguments, outermost first, with its key path."""
    out: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def walk(x: Any, path: tuple[Any, ...]) -> None:
        if isinstance(x, dict):
            out.append((path, x))
            for k, v in x.items():
                walk(v, (*path, jax.tree_util.DictKey(k)))
        elif isinstance(x, (tuple, list)):
            for i, v in enumerate(x):
                walk(v, (*path, jax.tree_util.SequenceKey(i)))

    walk(args, ())
    return out


def _empty_dict(args: Any) -> tuple[tuple[Any, ...], Any]:
    """A model without variables, traced with ``apply({}, x)``: the empty dict it took
    (an argument, not the keyword arguments themselves)."""
    for path, d in _dicts(args):
        if not d and len(path) > 1:
            return path, {}
    raise errors.ParamsDoNotFit(
        "`params` is empty and the MoX takes no empty variables dict to put new variables in.", "Pass the "
        "variables the model was traced with, or trace a function that takes them (`model.apply({}, x)`).")


def _holds_leaf(v: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``v`` is the var of a leaf of ``shape``, maybe stacked along
    leading axes (layers of ``nn.scan``, instances of ``nn.vmap``)."""
    return isinstance(v, Var) and v.shape[len(v.shape) - len(shape):] == tuple(shape)


def _layout(d: Any, nodes: list[Mox]) -> bool | None:
    """Whether the dict ``d`` (of vars) is the bare ``params`` collection
    (``True``), the variables dict of ``apply`` (``False``), or neither
    (``None``): told by where the modules' variables sit in it."""
    for n in nodes:
        for coll, tree in (n.var_tree or {}).items():
            leaf = next(iter(jax.tree_util.tree_flatten_with_path(tree)[0]), None)
            if leaf is None:
                continue
            rest = [k.key for k in leaf[0]]
            v = _get(d, (coll, *n.scope, *rest))
            if _holds_leaf(v, leaf[1].shape):
                return False
            v = _get(d, (*n.scope, *rest)) if coll == "params" else None
            if _holds_leaf(v, leaf[1].shape):
                return True
    return None


@dataclasses.dataclass
class _Scope:
    """The variables of one replaced module (shared by all its calls)."""

    node: Mox                          # the first replaced call
    traced: Any = None                 # its replacement, if that has variables
    canon: dict[str, Var] = dataclasses.field(default_factory=dict)   # leaf path -> var
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)    # leaf path -> old value
    stack: tuple[int, ...] = ()        # leading axes of its variables (layers of enclosing scans)


_inits: dict[tuple[Any, ...], Any] = {}  # compiled initialisers (`_init`)
#: compiler options of `_init`'s programs: no backend optimisation, no fusion emitters (MLIR). A LoRA
#: layer's initialiser compiled in 0.25 s with neither, 0.12 s without optimisation, 0.06 s with both
_QUICK: dict[str, str | bool] = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": False}


def _initialised(module: Any, call: Callable[..., Any], key: Any, xs: Any) -> dict[str, Any]:
    a, k = call(xs)
    return dict(module.init(key, *a, **k))


def _widens(old: Any, new: Any) -> bool:
    """Whether every value of floating type ``old`` is exactly a value of ``new``."""
    old, new = np.dtype(old), np.dtype(new)
    return (jnp.issubdtype(old, jnp.floating) and jnp.issubdtype(new, jnp.floating) and old != new
            and jnp.promote_types(old, new) == new and new.itemsize > old.itemsize)


def _converted(value: Any, dtype: Any) -> Any:
    """``value`` as ``dtype`` (an abstract value stays abstract, a laid-out one keeps its layout)."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(value.shape, dtype, sharding=value.sharding)
    return jnp.asarray(value).astype(dtype)


def _init(module: Any, needed: tuple[int, ...], call: Callable[..., Any], fingerprint: Any,
          stack: tuple[int, ...], args: tuple[Any, Any, list[Any]]) -> list[Any]:
    """``init(key, i, xs)`` of ``args``: the leaves at ``needed`` of
    ``module.init(fold_in(key, i), *xs)`` (XLA then skips initialising kept
    ones), or for variables stacked per layer (``nn.scan``) one
    initialisation per layer with split keys, stacked along the leading
    axes. Compiled once per equal module (the replacement's ``fingerprint``):
    96 LoRA layers of two shapes compile twice, and nothing else compiles (the
    key is folded inside, the inputs are NumPy zeros). Compiled without XLA's
    optimisations (`_QUICK`): a program that runs once per layer on a few
    thousand numbers compiled in 0.25 s optimised, 0.06 s not, on a 2-core CPU."""
    k = (fingerprint, needed, stack, tuple((np.shape(a), str(a.dtype)) for a in jax.tree_util.tree_leaves(args)))
    f = _inits.get(k)
    if f is None:
        if len(_inits) > 64:
            _inits.clear()

        def one(key: Any, xs: Any) -> list[Any]:
            leaves = jax.tree_util.tree_leaves(_initialised(module, call, key, xs))
            return [leaves[j] for j in needed]

        def init(key: Any, i: Any, xs: list[Any]) -> list[Any]:
            key = jax.random.fold_in(key, i)
            if not stack:
                return one(key, xs)
            keys = jax.random.split(key, math.prod(stack)).reshape(stack)
            def g(k: Any) -> list[Any]:
                return one(k, xs)

            for _ in stack:
                g = jax.vmap(g)
            return g(keys)

        f = _inits[k] = jax.jit(init).lower(*args).compile(_QUICK)
    return list(f(*args))


class DictVariables(Variables):
    """The variables of a `sub` on a linen model and where they sit among the
    root's arguments: the dict of ``apply`` (``{collection: {scope...: leaf}}``)
    or the bare ``params`` collection (``{scope...: leaf}``, as Hugging Face
    wrappers take ``params=``). The layout is read from where the modules'
    variables sit; the new parameters come back in the same layout. Without
    ``params``, the variables are found among the arguments by structure, and
    only replacements that keep every variable they have are possible."""

    def __init__(self, root: Mox, params: Any):
        self.root = root
        self.given = params is not None
        self.scopes: dict[tuple[str, ...], _Scope] = {}
        self.args = root.sig.args(root.invars)
        self.values = None
        self.where: tuple[Any, ...] = ()
        self.vars: Any = {}  # a nested dict, or what `_put` rebuilt
        self.bare = False
        if self.given:
            self.values = jax.tree_util.tree_map(lambda x: x, dict(params))
            self.where, self.vars = _find(self.args, self.values)
            self._old = set(jax.tree_util.tree_leaves(self.vars))
            bare = _layout(self.vars, self._nodes())
            self.bare = bool(bare) or (bare is None and bool(self.values) and "params" not in self.values)
        #: abstract parameters (`jax.ShapeDtypeStruct`s, as from `jax.eval_shape`): new leaves stay abstract too
        leaves = jax.tree_util.tree_leaves(self.values)
        self.abstract = bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
        self._searched = self.given

    def _nodes(self) -> Any:
        """The module calls with variables (a fresh iterator: `_layout` stops at the first it can tell by)."""
        return (n for n in self.root.modules() if n.var_tree and n.scope is not None)

    def _search(self) -> None:
        """Without ``params``: the variables among the arguments, found by structure (only when needed)."""
        if not self._searched:
            self._searched = True
            found = next(((p, d, b) for p, d in _dicts(self.args) if (b := _layout(d, self._nodes())) is not None),
                         None)
            if found is not None:
                self.where, self.vars, self.bare = found

    def _keys(self, coll: str, scope: tuple[str, ...], rest: Sequence[str] = ()) -> tuple[str, ...] | None:
        """Where collection ``coll`` of the module at ``scope`` sits (``None``: nowhere)."""
        if self.bare:
            return (*scope, *rest) if coll == "params" else None
        return (coll, *scope, *rest)

    def held(self, node: Any) -> dict[str, Any] | None:
        """The shapes of the module call ``node``'s variables as the model
        holds them (``{collection: tree}``, stacked by ``nn.scan``/``nn.vmap``),
        or ``None`` where yax cannot find them."""
        self._search()
        if not isinstance(node, Mox) or node.scope is None or not node.var_tree:
            return None
        out = {}
        for coll, tree in node.var_tree.items():
            keys = self._keys(coll, node.scope)
            at = _get(self.vars, keys) if keys is not None else None
            if not isinstance(at, Mapping):
                return None
            try:
                out[coll] = jax.tree_util.tree_map(lambda _, v: jax.ShapeDtypeStruct(v.shape, v.dtype), tree, dict(at))
            except (ValueError, TypeError):  # the model holds other leaves there
                return None
        return out

    def place(self, sites: list[Any], key: Any, keep: Any = None) -> dict[int, dict[Var, Var]]:
        """Decide, per replaced module scope, which var each variable of the
        replacements is (kept leaves reuse the old var), initialise new leaves
        with ``key`` and place the result; returns per node how its traced
        variable vars map to the canonical ones."""
        self.keep = keep
        var_maps = {id(s.node): self._assign(s) for s in sites}
        if self.given:
            zeros = functools.lru_cache(lambda shape, dtype: np.zeros(shape, dtype))  # inputs for initialisers
            for i, (scope, sc) in enumerate(self.scopes.items()):
                self._fill(i, scope, sc, key, zeros)
        return var_maps

    def _assign(self, site: Any) -> dict[Var, Var]:
        node, t = site.node, site.traced
        is_module = isinstance(node, Mox) and node.module_type is not None
        if t.module is None:
            if self.given and is_module and node.var_tree and node.scope is not None:
                self.scopes.setdefault(node.scope, _Scope(node))  # its variables are dropped
            return {}
        if t.frontend != frontend.name:
            raise errors.ForeignModule(
                type(t.module).__name__, node, t.frontend, frontend.name, "a linen variables dict", "Trace the "
                "model with its own module system (`yax.make_mox(model)`), or replace it with a linen module or a "
                "function.")
        if is_module and node.scope is None:
            raise YaxRewriteError(f"Cannot tell where the variables of {where(node)} live: it has no scope.")
        self._search()
        scope = node.scope if is_module else tuple(node.path.split("/")[1:])
        flat = jax.tree_util.tree_flatten_with_path(t.var_avals)[0]
        sc = self.scopes.get(scope)
        if sc is not None and sc.traced is not None:
            if [(a.shape, a.dtype) for _, a in flat] != [
                    (a.shape, a.dtype) for a in jax.tree_util.tree_leaves(sc.traced.var_avals)]:
                raise errors.SharedVariables('/'.join(scope))
        else:
            sc = self.scopes[scope] = _Scope(node, t, stack=site.stack)
            self._keep(sc, scope, flat, is_module)
            self._check_placeable(sc, flat)
        tvars = t.root.invars[: t.n_vars]
        for tv, (kp, a) in zip(tvars, flat):
            # inside nested computations a new variable is a root input of its own, stacked per scan
            # (`a` is one instance's: ``nn.vmap``'s axis is in ``tv`` and in ``sc.stack``)
            new = Var((*sc.stack, *a.shape), tv.dtype, tv.weak_type) if site.chain else tv
            sc.canon.setdefault(_keystr(kp), new)
        return {tv: sc.canon[_keystr(kp)] for tv, (kp, _) in zip(tvars, flat)
                if sc.canon[_keystr(kp)] is not tv or site.chain}

    def _keep(self, sc: _Scope, scope: tuple[str, ...], flat: list[Any], is_module: bool) -> None:
        """Which leaves of the replacement keep an old variable (its var and
        value): the one at the same path, or at the path ``keep=`` maps it to,
        or, for a replacement that wraps a module of the replaced type, the one
        at the same path inside that submodule; same shape and dtype always."""
        sources = self._sources(sc) if is_module else {}
        for kp, a in flat:
            keys = [k.key for k in kp]
            old = sources.get("/".join(keys), keys)
            where_ = self._keys(old[0], scope, old[1:]) if is_module else None
            ov = _get(self.vars, where_) if where_ is not None else None
            if where_ is None or not isinstance(ov, Var) or ov.shape != (*sc.stack, *a.shape):
                continue
            if ov.dtype == a.dtype:
                sc.canon[_keystr(kp)] = ov
                sc.kept[_keystr(kp)] = _get(self.values, where_) if self.given else None
            elif self.keep is not None and "/".join(keys) not in self.keep:
                continue  # `keep=` names the leaves kept: this one is initialised afresh
            elif self.given and _widens(ov.dtype, a.dtype):
                # the model holds it narrower than the replacement declares it (bfloat16 weights, a LoRA
                # whose Dense has float32 parameters): kept, converted exactly, as a new variable
                sc.kept[_keystr(kp)] = _converted(_get(self.values, where_), a.dtype)
            else:
                raise ParamDtypeDiffers("keep", type(sc.traced.module).__name__, "/".join(where_), ov.dtype,
                                        a.dtype, sc.node, self.given)
        if is_module and not sc.kept and self.keep is None:
            self._refuse_reinitialising(sc, flat)

    def _sources(self, sc: _Scope) -> dict[str, list[str]]:
        """New leaf path (``"params/Dense_0/kernel"``) -> old leaf keys, for
        leaves not kept at their own path: from ``keep=``, or from a submodule
        of the replaced module's type inside the replacement."""
        if self.keep is not None:
            return {new: old.split("/") for new, old in dict(self.keep).items()}
        inner = [n for n in sc.traced.root.modules()
                 if n.module_type is sc.node.module_type and n.scope and n.var_tree]
        if not inner:
            return {}
        prefix = list(inner[0].scope[len(self._replacement_scope(sc)):])
        return {"/".join([coll, *prefix, *(k.key for k in kp)]): [coll, *(k.key for k in kp)]
                for coll, tree in sc.node.var_tree.items()
                for kp, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}

    @staticmethod
    def _replacement_scope(sc: _Scope) -> tuple[str, ...]:
        top = next((n for n in sc.traced.root.modules() if n.module_type is type(sc.traced.module)), None)
        return tuple(top.scope or ()) if top is not None else ()

    def _holds(self, coll: str, scope: tuple[str, ...], tree: Any) -> bool:
        """Whether the model's variables hold collection ``coll`` of the module at ``scope`` (its names)."""
        keys = self._keys(coll, scope)
        at = _get(self.vars, keys) if keys is not None else None
        return isinstance(at, Mapping) and isinstance(tree, Mapping) and set(tree) <= set(at)

    def _refuse_reinitialising(self, sc: _Scope, flat: list[Any]) -> None:
        """Every old variable would be initialised afresh although the replacement has leaves of their shapes."""
        old = {(tuple(a.shape), a.dtype) for a in jax.tree_util.tree_leaves(sc.node.var_tree or {})}
        alike = ["/".join(k.key for k in kp) for kp, a in flat if (tuple(a.shape), a.dtype) in old]
        scope = sc.node.scope or ()
        if alike and self._searched and not any(self._holds(coll, scope, tree)
                                                for coll, tree in (sc.node.var_tree or {}).items()):
            raise YaxRewriteError(
                f"The variables of {where(sc.node)} are not among the model's: the model hands them to the "
                "layer when it calls it (`layer.apply({'params': ...})`, as a kernel tied to an embedding), "
                f"so a replacement with variables (`{type(sc.traced.module).__name__}`) has nowhere to keep "
                "them. Replace it with a function of its inputs, or adapt the module that owns the weights."
            )
        if alike:
            raise errors.KeepsNothing(
                type(sc.traced.module).__name__, sc.node, alike, "initialised afresh", "Give them the old names, "
                "or say which old leaf each takes with `keep={\"params/new/kernel\": \"params/kernel\"}` "
                "(`keep={}` to initialise all afresh).")

    def _check_placeable(self, sc: _Scope, flat: list[Any]) -> None:
        """Without ``params`` only kept variables are possible; in a bare
        ``params`` collection only ``params`` can go."""
        t, node = sc.traced, sc.node
        if not self.given and len(sc.kept) < len(flat):
            raise errors.NeedsParams(
                f"The replacement `{type(t.module).__name__}` for {where(node)} has variables the model does "
                "not have; pass `params=` (the variables the MoX was traced with) and `key=` so yax can "
                "place and initialise them.", "sub")
        other = sorted(c for c in (t.var_avals or {}) if self._keys(c, ()) is None)
        if other:
            raise YaxRewriteError(
                f"The replacement `{type(t.module).__name__}` for {where(node)} has variables in "
                f"{', '.join(f'`{c}`' for c in other)}, but the MoX takes only the `params` collection. Trace "
                "a function that takes the whole variables dict (`model.apply`) to add other collections."
            )

    def _fill(self, i: int, scope: tuple[str, ...], sc: _Scope, key: Any, zeros: Callable[..., Any]) -> None:
        old = sc.node.var_tree or {}
        if sc.traced is None:  # replaced by something without variables: drop the old ones
            self._put(scope, old, {}, {})
            return
        avals = sc.traced.var_avals
        flat = jax.tree_util.tree_flatten_with_path(avals)[0]
        fresh: list[Any] = [None] * len(flat)
        if self.abstract:  # nothing to initialise: the caller allocates nothing
            fresh = [jax.ShapeDtypeStruct((*sc.stack, *a.shape), a.dtype) for _, a in flat]
        elif len(sc.kept) < len(flat):
            if key is None:
                raise YaxRewriteError(
                    f"The replacement at `{sc.node.path}` adds new variables; pass `key=` "
                    "(a `jax.random.key`) to initialise them."
                )
            needed = tuple(j for j, (kp, _) in enumerate(flat) if _keystr(kp) not in sc.kept)
            t = sc.traced
            how = t.mapped if isinstance(t.mapped, _vmap.Mapped) else None  # inside `nn.vmap`: one instance's inputs
            xs = [zeros(a.shape, a.dtype) if isinstance(a.dtype, np.dtype) else jnp.zeros(a.shape, a.dtype)
                  for a in (how.instance(sc.node.inputs) if how else sc.node.inputs)]
            for j, x in zip(needed, _init(t.module, needed, t.call, t.key, sc.stack, (key, np.uint32(i), xs))):
                fresh[j] = x
        tree = jax.tree_util.tree_structure(avals)
        vals = jax.tree_util.tree_unflatten(tree, [sc.kept.get(_keystr(kp), x) for (kp, _), x in zip(flat, fresh)])
        vars_ = jax.tree_util.tree_unflatten(tree, [sc.canon[_keystr(kp)] for kp, _ in flat])
        self._put(scope, old, dict(vals), dict(vars_))

    def _put(self, scope: tuple[str, ...], old: Any, new_vals: Any, new_vars: Any) -> None:
        """Replace the variables of the module at ``scope``."""
        for coll in sorted(set(old or {}) | set(new_vals)):
            keys = self._keys(coll, scope)
            if keys is None:
                continue
            self.values = _put(self.values, keys, new_vals.get(coll) or None)
            self.vars = _put(self.vars, keys, new_vars.get(coll) or None)

    def dropped(self) -> set[Var]:
        """The root vars of variables this rewrite removes."""
        if not self.given:
            return set()
        now = set(jax.tree_util.tree_leaves(self.vars))
        return {v for v in self.root.invars if v not in now and v in self._old}

    def finish(self, new: Mox, sites: list[Any]) -> Any:
        """The rewritten root (its arguments rebuilt around the new dict) and
        the new variables; just the root when no ``params`` were given."""
        if not self.given:
            return new
        args = _set_in(self.args, self.where, self.vars)
        ins, invars = type(new.sig.ins).of(args, lambda x: isinstance(x, Var), with_paths=True)
        root = dataclasses.replace(new, invars=tuple(invars), inputs=tuple(invars),
                                   sig=dataclasses.replace(new.sig, ins=ins))
        return root, self.values


# -- the frontend ----------------------------------------------------------------------

class LinenFrontend(Frontend):
    name = "linen"
    order = 20
    #: kauldron wraps Flax's `Module.apply`/`init` process-wide once imported (gemma does)
    libraries = ("flax", "kauldron")

    def hooks(self, rec: Any) -> Any:
        return nn.intercept_methods(_interceptor)

    def accepts(self, fn: Any) -> bool:
        return isinstance(fn, nn.Module) or (inspect.ismethod(fn) and isinstance(fn.__self__, nn.Module))

    def prepare(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]:
        if isinstance(fn, nn.Module) and fn.scope is None:
            fn = fn.apply  # make_mox(model)(variables, x) == make_mox(model.apply)(...)
        return fn, args, kwargs, None

    def defaults(self, cls: type) -> dict[str, Any]:
        return _defaults(cls)

    def owns(self, x: Any) -> bool:
        return isinstance(x, nn.Module)

    places_by_module = True

    def rebuild(self, node: Mox, changes: Mapping[str, Any] | None = None) -> Any:
        t = node.module_type
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            return None
        fields = {f.name for f in dataclasses.fields(t) if f.init and f.name not in _SKIP_FIELDS}
        unknown = sorted(set(changes or {}) - fields)
        if unknown:
            raise errors.UnknownFields(t.__name__, node.path, unknown, sorted(fields))
        # parent=None: a template, never adopted by a module whose method happens to be running
        return t(**{"parent": None, **{k: v for k, v in node.attrs.items() if k in fields}, **(changes or {})})

    def fill(self, module: Any, node: Any) -> Any:
        """A template module completed from the node it replaces: its ``None``
        fields taken from the node's."""
        if not isinstance(node, Mox):
            return module
        fill = {
            f.name: node.attrs[f.name]
            for f in dataclasses.fields(module)
            if f.init and f.name not in _SKIP_FIELDS and getattr(module, f.name, 0) is None
            and node.attrs.get(f.name) is not None
        }
        return module.clone(**fill) if fill else module

    def mapping(self, node: Mox, scans: tuple[int, ...], held: Callable[[Any], Any] | None) -> MappedCall | None:
        return _vmap.mapped(node, scans, held)

    def fit_hint(self, node: Mox, found: tuple[int, ...], expected: tuple[int, ...]) -> str:
        return _vmap.fit_hint(node, found, expected)

    def trace_replacement(self, module: Any, avals: list[Any], call: Callable[..., Any],
                          mapped: MappedCall | None = None) -> tuple[Mox, Any, int]:
        """``module`` traced on ``avals``; with ``mapped`` (the replaced call runs
        inside ``nn.vmap``, `.._mapped.Mapped`) under ``jax.vmap`` the same way:
        on one instance's inputs, its variables stacked (or broadcast) as the
        original's. The variables returned are one instance's."""
        if mapped is not None and not isinstance(mapped, _vmap.Mapped):
            raise NotImplementedError("A linen module is mapped only like a call inside `nn.vmap`.")

        def apply(v: Any, *xs: Any) -> Any:
            a, k = call(xs)
            return module.apply(v, *a, **k)

        one = avals if mapped is None else mapped.instance(avals)
        var_avals = jax.eval_shape(lambda *xs: _initialised(module, call, jax.random.key(0), xs), *one)
        if mapped is None:
            return engine.make_mox(apply)(var_avals, *avals), var_avals, 0
        return _vmap.trace_mapped(module, apply, var_avals, avals, mapped), var_avals, 0

    def variables(self, mox: Mox, params: Any) -> Variables | None:
        if params is not None and not isinstance(params, Mapping):
            return None
        if not isinstance(params, (dict, flax.core.FrozenDict, type(None))) and mox.frontend != self.name and not any(
                n.info.frontend == self.name for n in mox.modules()):
            return None  # a mapping of some other system's variables (an nnx state handed to a function)
        return DictVariables(mox, params)

    def variables_argument(self, mox: Mox, args: tuple[Any, ...]) -> Any:
        return args[0] if args and isinstance(args[0], Mapping) else None

    activation_homes = ("flax.linen", "flax.linen.activation")

    def call_signature(self, target: Any) -> tuple[Callable[..., Any], int] | None:
        if inspect.ismethod(target) and isinstance(target.__self__, nn.Module) and target.__name__ == "apply":
            return target.__self__.__call__, 0  # `model.apply(variables, *inputs)`: the inputs of `__call__`
        return (target.__call__, 0) if isinstance(target, nn.Module) else None


_defaults_cache: dict[type, dict[str, Any]] = {}


def _defaults(cls: type) -> dict[str, Any]:
    d = _defaults_cache.get(cls)
    if d is None:
        d = _defaults_cache[cls] = {f.name: f.default for f in dataclasses.fields(cls)
                                    if f.default is not dataclasses.MISSING}
    return d


frontend = LinenFrontend()
register_script(frontend.name, Script(homes=(("flax.linen", "nn"),)))
