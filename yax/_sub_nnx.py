"""Rewriting flax.nnx models: `sub` with nnx module replacements, and
`replace_modules`, query-driven surgery on the live module object.

An nnx MoX (from ``yax.make_mox(model)``) computes
``(state, *args) -> (out, new_state)``. Splicing an nnx module into it works
like splicing a linen module (`_sub`): the replacement is traced on the
node's input avals with ``make_mox(replacement)``, checked and spliced in; its
variables take the replaced module's place in the state, at the module's
attribute path. Leaves with the same name, variable type, shape and dtype as
the old module's keep their values (``nnx.LoRALinear`` keeps ``kernel`` and
``bias``); new leaves take the replacement's own values (nnx modules are
initialised when built, so no key is needed). The new graphdef is the old
model with the replacement set at every attribute that held the old module,
so ``nnx.merge(new_mox.graphdef, new_state)`` is the rewritten model.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ._ir import Mox, Var
from ._print import type_str
from .errors import YaxRewriteError


def _nnx():
    from flax import nnx

    return nnx


def _key(k: Any) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def flat_state(state: Any) -> list[tuple[tuple[str, ...], type, Any]]:
    """``(path, variable type, leaf)`` for every leaf of an nnx state, in
    flattening order; ``path`` is the attribute path plus the variable name."""
    nnx = _nnx()
    leaves = jax.tree_util.tree_leaves(state)
    holders = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    if len(holders) != len(leaves):
        raise YaxRewriteError("An nnx state whose variables hold several arrays each is not supported.")
    return [(tuple(_key(k) for k in kp), type(v), x) for (kp, v), x in zip(holders, leaves)]


def _get(module: Any, scope: Sequence[str]) -> Any:
    for k in scope:
        module = getattr(module, k)
    return module


def _references(root: Any) -> dict[int, list[tuple[Any, str]]]:
    """``id(object) -> [(holder, attribute)]`` for every nnx object in ``root``'s
    graph: a module shared by two attributes is replaced at both."""
    nnx = _nnx()
    refs: dict[int, list[tuple[Any, str]]] = {}
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for k, v in vars(node).items():
            if isinstance(v, nnx.Pytree):
                refs.setdefault(id(v), []).append((node, k))
                todo.append(v)
    return refs


def _swap_in(root: Any, old: Any, new: Any, refs: dict) -> None:
    if old is root:
        raise YaxRewriteError("The pattern matched the model itself; replace the model instead.")
    for holder, k in refs.get(id(old), []):
        setattr(holder, k, new)


def _call_avals(node: Mox, dyn: Sequence[Any]) -> tuple[tuple, dict]:
    leaves: list[Any] = [None] * (len(node.dyn_in) + len(node.in_static))
    for i, x in zip(node.dyn_in, dyn):
        leaves[i] = x
    for i, x in node.in_static:
        leaves[i] = x
    return jax.tree_util.tree_unflatten(node.in_tree, leaves)


def _where(node: Mox) -> str:
    return f"the {node.kind} `{node.name}` at `{node.path or 'the root'}`"


def _what(x: Any) -> str:
    return type(x).__name__


def _check_fits(new: Any, node: Mox) -> None:
    """``new`` called like ``node`` was (same method, arguments) returns arrays
    of the node's output shapes and dtypes: checked with ``nnx.eval_shape``."""
    nnx = _nnx()
    method = node.method or "__call__"
    if not callable(getattr(new, method, None)):
        raise YaxRewriteError(
            f"The replacement `{_what(new)}` for {_where(node)} has no method `{method}`, which the model "
            "calls. Give a module with that method, or replace only the calls of `__call__`."
        )
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in node.inputs]

    def call(m: Any, *dyn: Any) -> Any:
        a, k = _call_avals(node, dyn)
        return getattr(m, method)(*a, **k)

    try:
        out = nnx.eval_shape(call, nnx.clone(new), *avals)
    except Exception as e:
        raise YaxRewriteError(
            f"The replacement `{_what(new)}` for {_where(node)} could not be called the way the model calls "
            f"it (inputs {' '.join(map(type_str, node.inputs))}): {type(e).__name__}: {e}\nNothing was changed."
        ) from None
    got = [x for x in jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, nnx.Pytree))
           if isinstance(x, jax.ShapeDtypeStruct)]
    want = node.outputs
    if len(got) != len(want):
        raise YaxRewriteError(
            f"The replacement `{_what(new)}` for {_where(node)} returns {len(got)} arrays, but the node returns "
            f"{len(want)} ({' '.join(map(type_str, want))}). Nothing was changed."
        )
    for i, (a, b) in enumerate(zip(got, want)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise YaxRewriteError(
                f"The replacement `{_what(new)}` for {_where(node)} does not fit: its output {i} is "
                f"{type_str(a)} but the node's is {type_str(b)}. Nothing was changed."
            )


def _stacked(node: Mox, module: Any) -> bool:
    """Whether the live module holds more than the call saw: layers stacked by
    ``nnx.vmap`` and run by ``nnx.scan`` (one slice per step)."""
    nnx = _nnx()
    live = [np.shape(x) for x in jax.tree_util.tree_leaves(nnx.state(module))]
    seen = [tuple(a.shape) for a in jax.tree_util.tree_leaves(node.var_tree)]
    return live != seen


def replace_modules(model: Any, pattern: Any, repl: Any, *args: Any, **kwargs: Any) -> Any:
    """A copy of the nnx ``model`` with the modules ``pattern`` selects replaced:
    query-driven surgery on the live object, never in place.

    The model is traced on ``*args, **kwargs`` (abstractly, like
    `make_mox`), the XPath ``pattern`` selects module calls, and each module
    they call is replaced in a clone of ``model`` (``nnx.clone``) by setting
    every attribute that holds it, the way hand-written nnx surgery does.

    Args:
      model: an ``nnx.Module``; it is not changed.
      pattern: an XPath string selecting ``module_call`` nodes (or a list of them).
      repl: an ``nnx.Module`` (each match gets its own ``nnx.clone``), or a
        factory ``f(path, module)`` called once per matched module with its
        path (``"Model/blocks/0/fc1"``) and the module in the copy; it returns
        the new module, or ``module`` itself to keep it.
      *args, **kwargs: example inputs, as for ``model(*args, **kwargs)``.

    Returns:
      The modified copy of ``model``.

    Raises:
      YaxRewriteError: a replacement does not fit a call of the module it
        replaces (checked with ``nnx.eval_shape`` before anything changes),
        the pattern selects something other than module calls, or a module
        lives in layers stacked by ``nnx.vmap``/``nnx.scan``.

    Example:
      >>> import jax.numpy as jnp, yax
      >>> from flax import nnx
      >>> model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.relu)
      >>> lora = yax.replace_modules(model, '//module_call[@type="Linear"]',
      ...     lambda path, m: nnx.LoRALinear(3, 4, lora_rank=2, rngs=nnx.Rngs(1)), jnp.ones((1, 3)))
      >>> type(lora.layers[0]).__name__, type(model.layers[0]).__name__
      ('LoRALinear', 'Linear')
    """
    from ._sub import _locate, _matches
    from ._trace import make_mox
    from ._trace_nnx import is_module

    nnx = _nnx()
    if not is_module(model):
        raise YaxRewriteError(
            f"`replace_modules` works on an `nnx.Module`, but got a `{_what(model)}`. "
            "For linen models and functions, rewrite the MoX with `yax.sub`."
        )
    if not (is_module(repl) or callable(repl)):
        raise YaxRewriteError(
            f"A replacement must be an `nnx.Module` or a factory `f(path, module)`, but got a `{_what(repl)}`."
        )
    mox = make_mox(model)(*args, **kwargs)
    targets, _ = _locate(mox, _matches(pattern, mox))
    for n in targets:
        if not isinstance(n, Mox) or n.kind != "module_call" or not is_module_type(n.module_type):
            what = f"the {n.kind} `{n.name}`" if isinstance(n, Mox) else f"the equation `{n.name}`"
            raise YaxRewriteError(
                f"`replace_modules` replaces nnx modules, but the pattern matched {what} at "
                f"`{n.path or 'the root'}`. Narrow the pattern to `//module_call[...]`, or rewrite "
                "activations and equations of the MoX with `yax.sub`."
            )
    copy = nnx.clone(model)
    calls: dict[tuple[str, ...], list[Mox]] = {}
    for n in mox.modules():
        if n.kind == "module_call" and n.scope is not None:
            calls.setdefault(n.scope, []).append(n)
    plan: list[tuple[Any, Any, tuple[str, ...]]] = []
    done: set[tuple[str, ...]] = set()
    for n in targets:
        if n.scope in done:
            continue
        done.add(n.scope)
        old = _get(copy, n.scope)
        if _stacked(n, old):
            raise YaxRewriteError(
                f"{_where(n).capitalize()} runs inside a transform over stacked layers (`nnx.scan` or "
                "`nnx.vmap`): the module there holds every layer's variables at once. Replace it by "
                "rebuilding the stack (e.g. with `nnx.vmap` of a factory), not per layer. Nothing was changed."
            )
        new = nnx.clone(repl) if is_module(repl) else repl(n.path, old)
        if new is old:
            continue
        if not is_module(new):
            raise YaxRewriteError(
                f"The factory returned a `{_what(new)}` for {_where(n)}; it must return an `nnx.Module` "
                "(or the module it was given, to keep it). Nothing was changed."
            )
        for call in calls.get(n.scope, [n]):  # every call of the module, matched or not
            _check_fits(new, call)
        plan.append((old, new, n.scope))
    refs = _references(copy)
    for old, new, _ in plan:
        _swap_in(copy, old, new, refs)
    return copy


def is_module_type(t: Any) -> bool:
    return t is not None and isinstance(t, type) and issubclass(t, _nnx().Module)


# -- sub with nnx module replacements -------------------------------------------------

def _tree_with(tree_def: Any, dyn: Sequence[int], vals: Sequence[Any], static: Sequence[tuple[int, Any]]) -> Any:
    leaves: list[Any] = [None] * (len(dyn) + len(static))
    for i, x in zip(dyn, vals):
        leaves[i] = x
    for i, x in static:
        leaves[i] = x
    return jax.tree_util.tree_unflatten(tree_def, leaves)


def _split_tree(tree: Any) -> tuple[Any, tuple[int, ...], list[Any], tuple]:
    flat, td = jax.tree_util.tree_flatten(tree)
    dyn = tuple(i for i, x in enumerate(flat) if isinstance(x, Var))
    return td, dyn, [flat[i] for i in dyn], tuple((i, x) for i, x in enumerate(flat) if not isinstance(x, Var))


@dataclasses.dataclass
class _Site:
    node: Mox
    new: Any            # the replacement module (its own clone)
    traced: Any = None  # `_sub._Traced` with the state's vars first
    paths: list = dataclasses.field(default_factory=list)     # relative path of each state leaf
    state_out: tuple = ()  # the replacement's final state, as vars of its trace


def sub_modules(mox: Mox, plan: list[tuple[Mox, Any]], nested: set[int], params: Any, cast: bool) -> Any:
    """`sub` for nnx module replacements on a MoX from ``make_mox(model)``."""
    from ._map import map_mox
    from ._sub import _build, _check, _fit, _Traced, _unbound
    from ._trace import make_mox
    from ._trace_nnx import is_module

    nnx = _nnx()
    if mox.graphdef is None:
        raise YaxRewriteError(
            "nnx module replacements need a MoX traced from the module itself (`yax.make_mox(model)(x)`), "
            "whose state argument yax can rebuild. Replace with functions, or use `yax.replace_modules` "
            "on the model."
        )
    if params is None:
        raise YaxRewriteError(
            "The replacement has variables; pass `params=state` (with `graphdef, state = nnx.split(model)`) "
            "so yax can return the new state. Nothing was changed."
        )
    sites: list[_Site] = []
    for node, r in plan:
        if not is_module(r):
            raise YaxRewriteError(
                f"This `sub` mixes nnx module replacements with other kinds (a `{_what(r)}` for "
                f"{_where(node)}); do them in two `sub` calls. Nothing was changed."
            )
        if not isinstance(node, Mox) or node.kind != "module_call" or node.scope is None:
            raise YaxRewriteError(
                f"An nnx module can replace module calls, but the pattern matched "
                f"{_where(node) if isinstance(node, Mox) else 'the equation `' + node.name + '`'}. "
                "Replace activations and equations with functions. Nothing was changed."
            )
        if id(node) in nested:
            raise YaxRewriteError(
                f"{_where(node).capitalize()} is inside a transformed computation (an `nnx.scan`/`vmap`/`jit`/"
                "`remat` body), where yax cannot add variables yet. Replace it with a function, or use "
                "`yax.replace_modules` on the model. Nothing was changed."
            )
        sites.append(_Site(node, r))

    # A module is one object: all its calls change together, so all must be matched.
    matched = collections.Counter(s.node.scope for s in sites)
    calls = collections.Counter(n.scope for n in mox.modules() if n.kind == "module_call" and n.scope in matched)
    for s in sites:
        if calls[s.node.scope] != matched[s.node.scope]:
            raise YaxRewriteError(
                f"The module at `{s.node.path}` is called {calls[s.node.scope]} times, but the pattern matched "
                f"{matched[s.node.scope]} of its calls. An nnx module is one object, so replacing it changes "
                f"every call; match them all (e.g. `//module_call[@path=\"{s.node.path}\"]`). Nothing was changed."
            )

    # Trace and check every replacement before building anything.
    for s in sites:
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in s.node.inputs]
        try:
            root = make_mox(s.new)(*avals)
        except Exception as e:
            raise YaxRewriteError(
                f"The replacement `{_what(s.new)}` for {_where(s.node)} could not be traced on the node's "
                f"inputs ({' '.join(map(type_str, s.node.inputs))}): {type(e).__name__}: {e}\nA replacement is "
                "called with the node's array inputs, positionally. Nothing was changed."
            ) from None
        _, r_state = nnx.split(s.new)
        s.paths = [p for p, _, _ in flat_state(r_state)]
        n_state = len(s.paths)
        n_out = len(root.outvars) - n_state
        s.state_out = root.outvars[n_out:]
        root = dataclasses.replace(root, outvars=root.outvars[:n_out],
                                   outputs=tuple(a for a in root.outvars[:n_out] if isinstance(a, Var)))
        s.traced = _Traced(root, n_state, s.new, r_state)
        _check(s.traced, s.node, s.new)
    casts = [_fit(s.traced, s.node, s.new, cast) for s in sites]

    # Where the state sits among the root's arguments and results.
    (state_vars, *rest), kwargs = _tree_with(mox.in_tree, mox.dyn_in, mox.invars, mox.in_static)
    out, state_out = _tree_with(mox.out_tree, mox.dyn_out, mox.outvars, mox.out_static)
    old_in = {p: (t, v) for p, t, v in flat_state(state_vars)}
    old_out = {p: v for p, _, v in flat_state(state_out)}
    values = {p: x for p, _, x in flat_state(params)}
    if set(values) != set(old_in):
        raise YaxRewriteError(
            "`params` is not the state the MoX was traced with: its variables are at other paths. "
            "Pass `state` from `graphdef, state = nnx.split(model)`."
        )

    # One set of variables per replaced module (calls of one module share it).
    canon: dict[tuple[str, ...], dict[tuple[str, ...], Var]] = {}
    kept_vals: dict[tuple[str, ...], Any] = {}
    var_maps: list[dict[Var, Var]] = []
    final_state: dict[tuple[str, ...], Any] = {}
    new_of_scope: dict[tuple[str, ...], Any] = {}
    for s in sites:
        scope = s.node.scope
        c = canon.get(scope)
        if c is None:
            c = canon[scope] = {}
            new_of_scope[scope] = s.new
            for (rel, t, x), tv in zip(flat_state(s.traced.var_avals), s.traced.root.invars):
                old = old_in.get(scope + rel)
                if old is not None and old[0] is t and old[1].shape == tv.shape and old[1].dtype == tv.dtype:
                    c[rel] = old[1]
                    kept_vals[scope + rel] = values[scope + rel]
                else:
                    c[rel] = tv
                    kept_vals[scope + rel] = x
        elif [p for p in c] != s.paths:
            raise YaxRewriteError(
                f"Two calls of the module at `{s.node.path}` were given replacements with different variables; "
                "calls of one module share its variables, so give them the same one. Nothing was changed."
            )
        vm = {tv: c[rel] for rel, tv in zip(s.paths, s.traced.root.invars) if c[rel] is not tv}
        var_maps.append(vm)
        for rel, v in zip(s.paths, s.state_out):  # the last call's updates win
            final_state[scope + rel] = vm.get(v, v) if isinstance(v, Var) else v

    built = {id(s.node): _build(s.traced, s.node, cs, vm) for s, cs, vm in zip(sites, casts, var_maps)}
    new = map_mox(lambda n: built.get(id(n), n), mox)

    # The new model: the old one with each replaced module swapped at every attribute holding it.
    model = nnx.merge(mox.graphdef, params)
    refs = _references(model)
    for scope, r in new_of_scope.items():
        _swap_in(model, _get(model, scope), nnx.clone(r), refs)
    graphdef, shape = nnx.split(model)
    replaced = list(canon)

    def owner(p: tuple[str, ...]) -> tuple[str, ...] | None:
        return next((sc for sc in replaced if p[: len(sc)] == sc), None)

    new_vals, new_in, new_out = [], [], []
    for p, _, _ in flat_state(shape):
        sc = owner(p)
        if sc is None:
            new_vals.append(values[p])
            new_in.append(old_in[p][1])
            new_out.append(old_out[p])
        else:
            new_vals.append(kept_vals[p])
            new_in.append(canon[sc][p[len(sc):]])
            new_out.append(final_state[p])
    td = jax.tree_util.tree_structure(shape)
    new_state = jax.tree_util.tree_unflatten(td, new_vals)
    in_td, dyn_in, invars, in_static = _split_tree(((jax.tree_util.tree_unflatten(td, new_in), *rest), kwargs))
    out_td, dyn_out, outvars, out_static = _split_tree((out, jax.tree_util.tree_unflatten(td, new_out)))
    flat_in = jax.tree_util.tree_flatten_with_path(((new_state, *rest), kwargs))[0]
    new = dataclasses.replace(
        new,
        invars=tuple(invars), inputs=tuple(invars), in_tree=in_td, dyn_in=dyn_in, in_static=in_static,
        in_paths=tuple(jax.tree_util.keystr(flat_in[i][0]) for i in dyn_in),
        outvars=tuple(outvars), outputs=tuple(a for a in outvars if isinstance(a, Var)),
        out_tree=out_td, dyn_out=dyn_out, out_static=out_static, graphdef=graphdef,
    )
    bad = _unbound(new)
    if bad is not None:
        raise YaxRewriteError(
            f"After the rewrite, {_where(bad[0]) if isinstance(bad[0], Mox) else 'an equation'} would read a "
            "value that no longer exists: most likely a variable of a replaced module that another call of "
            "that module still reads (it is called from several places, or through several methods). "
            "Replace all calls of that module together. Nothing was changed."
        )
    return new, new_state


def keep_untouched_state(new: Mox, replaced: Sequence[Any]) -> Mox:
    """After functions replaced module calls of an nnx MoX: state updates the
    old calls made (a Dropout's RNG counter, batch statistics) no longer
    happen, so those state outputs become the state inputs, unchanged."""
    from ._ir import Equation

    inner: set[Var] = set()
    for n in replaced:
        if not isinstance(n, Mox):
            continue
        inner.update(a for a in n.outvars if isinstance(a, Var))
        for c in n.walk():
            if isinstance(c, (Equation, Mox)):
                inner.update(c.outputs)
    (state_in, *_), _ = _tree_with(new.in_tree, new.dyn_in, new.invars, new.in_static)
    out, state_out = _tree_with(new.out_tree, new.dyn_out, new.outvars, new.out_static)
    start = {p: v for p, _, v in flat_state(state_in)}
    flat = flat_state(state_out)
    if not any(isinstance(v, Var) and v in inner for _, _, v in flat):
        return new
    fixed = [start[p] if isinstance(v, Var) and v in inner else v for p, _, v in flat]
    td = jax.tree_util.tree_structure(state_out)
    out_td, dyn_out, outvars, out_static = _split_tree((out, jax.tree_util.tree_unflatten(td, fixed)))
    return dataclasses.replace(new, outvars=tuple(outvars), outputs=tuple(a for a in outvars if isinstance(a, Var)),
                               out_tree=out_td, dyn_out=dyn_out, out_static=out_static)
