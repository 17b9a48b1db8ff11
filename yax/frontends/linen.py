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
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .. import _activations, errors
from .._ir import Kind, ModuleInfo, Mox, Var
from .._record import CallInfo, Recorder, marked_call, recorder
from ..errors import YaxRewriteError, where
from . import Frontend

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
    return "/".join([rec.root_name or "Model", *names])


def _fields(module: nn.Module) -> dict[str, Any]:
    return {f.name: getattr(module, f.name, None) for f in dataclasses.fields(module) if f.name not in _SKIP_FIELDS}


def _count(tree: Any) -> int:
    return sum(math.prod(np.shape(x)) for x in jax.tree_util.tree_leaves(tree))


def _abstract(tree: Any) -> Any:
    def one(x: Any) -> Any:
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)

    return jax.tree_util.tree_map(one, tree)


def _interceptor(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
    rec = recorder()
    if rec is None or context.method_name == "setup":
        return next_fun(*args, **kwargs)
    module = context.module
    method = context.method_name
    if not method.isidentifier():  # lifted transforms wrap __call__ in a lambda
        method = "__call__"
    same = bool(rec.stack) and rec.stack[-1][1] is module
    path = _path(module, rec)
    call = CallInfo(kind=Kind.METHOD_CALL if same else Kind.MODULE_CALL, path=path,
                    name=path.rsplit("/", 1)[-1], module=module)
    fields = [(module, f.name) for f in dataclasses.fields(module)]
    undo = _activations.swapped(fields, getattr, object.__setattr__)
    try:
        out = marked_call(call, next_fun, args, kwargs)
    finally:
        _activations.restore(undo, object.__setattr__)
    try:
        variables = module.variables
    except Exception:  # an unbound helper module: nothing to count
        variables = {}
    call.info = ModuleInfo(
        type=type(module), method=method, attrs=_fields(module), defaults=frontend.defaults(type(module)),
        num_params=_count(variables.get("params", {})), var_tree=_abstract(dict(variables)),
        scope=tuple(module.path) if module.scope is not None else None, frontend=frontend.name,
    )
    return out


# -- parameters ------------------------------------------------------------------------

def _keystr(path: Sequence[Any]) -> str:
    return jax.tree_util.keystr(tuple(path))


def _get(tree: Any, keys: Sequence[str]) -> Any:
    for k in keys:
        if not isinstance(tree, dict) or k not in tree:
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


def _find(args: Any, values: Any) -> tuple[tuple, Any]:
    """Where the dict ``values`` sits among the traced arguments ``args``
    (a key path) and the same dict holding the root's vars."""
    by_path = {_keystr(kp): (kp, leaf) for kp, leaf in jax.tree_util.tree_flatten_with_path(args)[0]}
    flat = jax.tree_util.tree_flatten_with_path(values)[0]
    if not flat:
        raise YaxRewriteError("`params` is empty; pass the variables dict the model was traced with.")
    first = _keystr(flat[0][0])
    prefix = next((h[: len(h) - len(first)] for h in by_path if h.endswith(first)
                   and all(h[: len(h) - len(first)] + _keystr(kp) in by_path for kp, _ in flat)), None)
    if prefix is None:
        raise YaxRewriteError(
            "`params` is not among the arguments the MoX was traced with: no argument holds its "
            f"leaf `{first}` together with all its other leaves. Pass the same variables dict "
            "(e.g. the one given to `model.apply`)."
        )
    for kp, x in flat:
        v = by_path[prefix + _keystr(kp)][1]
        if not isinstance(v, Var) or tuple(np.shape(x)) != v.shape:
            raise YaxRewriteError(
                f"`params` leaf `{_keystr(kp)}` has shape {tuple(np.shape(x))}, but the MoX was traced "
                f"with {getattr(v, 'shape', 'a static value')}. Pass the parameters it was traced with."
            )
    where = by_path[prefix + first][0][: -len(flat[0][0])]
    return where, jax.tree_util.tree_map_with_path(lambda kp, _: by_path[prefix + _keystr(kp)][1], values)


@dataclasses.dataclass
class _Scope:
    """The variables of one replaced module (shared by all its calls)."""

    node: Mox                          # the first replaced call
    traced: Any = None                 # its replacement, if that has variables
    canon: dict[str, Var] = dataclasses.field(default_factory=dict)   # leaf path -> var
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)    # leaf path -> old value


_inits: dict[tuple, Callable] = {}


def _init(module: Any, needed: tuple[int, ...]) -> Callable:
    """A jitted ``module.init`` returning only the leaves at ``needed``
    (XLA then skips initialising kept ones), shared by equal modules: 96 LoRA
    layers of two shapes compile twice."""
    k = (repr(module), needed)
    f = _inits.get(k)
    if f is None:
        if len(_inits) > 64:
            _inits.clear()

        def init(key: Any, *xs: Any) -> list[Any]:
            leaves = jax.tree_util.tree_leaves(dict(module.init(key, *xs)))
            return [leaves[i] for i in needed]

        f = _inits[k] = jax.jit(init)
    return f


class DictVariables:
    """The variables dict of a `sub` (``{collection: {scope...: leaf}}``) and
    where it sits among the root's arguments; ``None`` params when none was given."""

    def __init__(self, root: Mox, params: Any):
        self.root = root
        self.given = params is not None
        self.scopes: dict[tuple[str, ...], _Scope] = {}
        if not self.given:
            return
        self.values = jax.tree_util.tree_map(lambda x: x, dict(params))
        self.args = root.sig.args(root.invars)
        self.where, self.vars = _find(self.args, self.values)

    def place(self, sites: list[Any], key: Any) -> dict[int, dict[Var, Var]]:
        """Decide, per replaced module scope, which var each variable of the
        replacements is (kept leaves reuse the old var), initialise new leaves
        with ``key`` and place the result; returns per node how its traced
        variable vars map to the canonical ones."""
        var_maps = {id(s.node): self._assign(s) for s in sites}
        if self.given:
            for i, (scope, sc) in enumerate(self.scopes.items()):
                self._fill(i, scope, sc, key)
        return var_maps

    def _assign(self, site: Any) -> dict[Var, Var]:
        node, t = site.node, site.traced
        is_module = isinstance(node, Mox) and node.module_type is not None
        if t.module is None:
            if self.given and is_module and node.var_tree and node.scope is not None:
                self.scopes.setdefault(node.scope, _Scope(node))  # its variables are dropped
            return {}
        if t.frontend != frontend.name:
            raise YaxRewriteError(
                f"The replacement `{type(t.module).__name__}` for {where(node)} is a `{t.frontend}` module, "
                "whose variables cannot live in a linen variables dict. Trace the model with its own module "
                "system (`yax.make_mox(model)`), or replace it with a linen module or a function."
            )
        if not self.given:
            raise YaxRewriteError(
                f"The replacement `{type(t.module).__name__}` for {where(node)} has variables; pass "
                "`params=` (the variables dict the MoX was traced with) and `key=` so yax can place them."
            )
        if is_module and node.scope is None:
            raise YaxRewriteError(f"Cannot tell where the variables of {where(node)} live: it has no scope.")
        scope = node.scope if is_module else tuple(node.path.split("/")[1:])
        flat = jax.tree_util.tree_flatten_with_path(t.var_avals)[0]
        sc = self.scopes.get(scope)
        if sc is not None and sc.traced is not None:
            if [(a.shape, a.dtype) for _, a in flat] != [
                    (a.shape, a.dtype) for a in jax.tree_util.tree_leaves(sc.traced.var_avals)]:
                raise errors.shared_variables('/'.join(scope))
        else:
            sc = self.scopes[scope] = _Scope(node, t)
            self._keep(sc, scope, flat, is_module)
        tvars = t.root.invars[: t.n_vars]
        for tv, (kp, _) in zip(tvars, flat):
            sc.canon.setdefault(_keystr(kp), tv)
        return {tv: sc.canon[_keystr(kp)] for tv, (kp, _) in zip(tvars, flat) if sc.canon[_keystr(kp)] is not tv}

    def _keep(self, sc: _Scope, scope: tuple[str, ...], flat: list, is_module: bool) -> None:
        """The old module's leaves of the same name, shape and dtype keep their vars and values."""
        node = sc.node
        old_vars = {c: _get(self.vars, (c, *scope)) for c in (node.var_tree or {})} if is_module else {}
        for kp, a in flat:
            keys = [k.key for k in kp]
            ov = _get(old_vars, keys)
            if isinstance(ov, Var) and ov.shape == a.shape and ov.dtype == a.dtype:
                sc.canon[_keystr(kp)] = ov
                sc.kept[_keystr(kp)] = _get(self.values, keys[:1] + list(scope) + keys[1:])

    def _fill(self, i: int, scope: tuple[str, ...], sc: _Scope, key: Any) -> None:
        old = sc.node.var_tree or {}
        if sc.traced is None:  # replaced by something without variables: drop the old ones
            self._put(scope, old, {}, {})
            return
        avals = sc.traced.var_avals
        flat = jax.tree_util.tree_flatten_with_path(avals)[0]
        fresh: list[Any] = [None] * len(flat)
        if len(sc.kept) < len(flat):
            if key is None:
                raise YaxRewriteError(
                    f"The replacement at `{sc.node.path}` adds new variables; pass `key=` "
                    "(a `jax.random.key`) to initialise them."
                )
            needed = tuple(j for j, (kp, _) in enumerate(flat) if _keystr(kp) not in sc.kept)
            xs = [jnp.zeros(a.shape, a.dtype) for a in sc.node.inputs]
            for j, x in zip(needed, _init(sc.traced.module, needed)(jax.random.fold_in(key, i), *xs)):
                fresh[j] = x
        tree = jax.tree_util.tree_structure(avals)
        vals = jax.tree_util.tree_unflatten(tree, [sc.kept.get(_keystr(kp), x) for (kp, _), x in zip(flat, fresh)])
        vars_ = jax.tree_util.tree_unflatten(tree, [sc.canon[_keystr(kp)] for kp, _ in flat])
        self._put(scope, old, dict(vals), dict(vars_))

    def _put(self, scope: tuple[str, ...], old: Any, new_vals: Any, new_vars: Any) -> None:
        """Replace the variables of the module at ``scope``."""
        for coll in sorted(set(old or {}) | set(new_vals)):
            keys = (coll, *scope)
            self.values = _put(self.values, keys, new_vals.get(coll) or None)
            self.vars = _put(self.vars, keys, new_vars.get(coll) or None)

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

    def hooks(self, rec: Any) -> Any:
        return nn.intercept_methods(_interceptor)

    def accepts(self, fn: Any) -> bool:
        return isinstance(fn, nn.Module) or (inspect.ismethod(fn) and isinstance(fn.__self__, nn.Module))

    def prepare(self, fn: Any, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict, Any]:
        if isinstance(fn, nn.Module) and fn.scope is None:
            fn = fn.apply  # make_mox(model)(variables, x) == make_mox(model.apply)(...)
        return fn, args, kwargs, None

    def defaults(self, cls: type) -> dict[str, Any]:
        return _defaults(cls)

    def owns(self, x: Any) -> bool:
        return isinstance(x, nn.Module)

    def fill(self, module: Any, node: Any) -> Any:
        """A template module with its ``None`` fields taken from the node it replaces."""
        if not isinstance(node, Mox):
            return module
        fill = {
            f.name: node.attrs[f.name]
            for f in dataclasses.fields(module)
            if f.init and f.name not in _SKIP_FIELDS and getattr(module, f.name, 0) is None
            and node.attrs.get(f.name) is not None
        }
        return module.clone(**fill) if fill else module

    def trace_replacement(self, module: Any, avals: list) -> tuple[Mox, Any, int]:
        from .._trace import make_mox

        var_avals = jax.eval_shape(lambda *xs: dict(module.init(jax.random.key(0), *xs)), *avals)
        return make_mox(lambda v, *xs: module.apply(v, *xs))(var_avals, *avals), var_avals, 0

    def variables(self, mox: Mox, params: Any) -> Any:
        if params is not None and not isinstance(params, Mapping):
            return None
        return DictVariables(mox, params)

    def params_argument(self, mox: Mox, args: tuple) -> Any:
        return args[0] if args and isinstance(args[0], Mapping) else None


_defaults_cache: dict[type, dict[str, Any]] = {}


def _defaults(cls: type) -> dict[str, Any]:
    d = _defaults_cache.get(cls)
    if d is None:
        d = _defaults_cache[cls] = {f.name: f.default for f in dataclasses.fields(cls)
                                    if f.default is not dataclasses.MISSING}
    return d


frontend = LinenFrontend()


def module_of(node: Mox, **changes: Any) -> Any:
    """A new, unbound Flax module of the same type and fields as the module
    call ``node``, with ``changes`` applied: the replacement for "the same
    layer, but …" rewrites (``dtype=jnp.bfloat16``).

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
    """
    if not isinstance(node, Mox) or node.module_type is None:
        raise YaxRewriteError(f"`module_of` needs a module call node, but got {node!r}.")
    fields = {f.name for f in dataclasses.fields(node.module_type) if f.init and f.name not in _SKIP_FIELDS}
    return node.module_type(**{**{k: v for k, v in node.attrs.items() if k in fields}, **changes})
