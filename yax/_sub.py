"""`sub`: replace nodes of a MoX, returning a new MoX (and parameters).

A replacement is traced with `make_mox` on the avals of the node it
replaces, checked (same number, shapes and dtypes of outputs), re-pathed to
the node's place, and spliced in: its inputs and outputs are the replaced
node's, so the rest of the tree is shared, not copied. A replacement that
is a Flax module gets its variables placed at the replaced module's scope
in the parameter tree: leaves with the same name, shape and dtype as the
old module's keep their values (a LoRA adapter keeps the frozen kernel),
new leaves are initialised with the caller's key, the rest are dropped.
The root's argument structure is rebuilt from the new parameter tree.
Nothing is changed in place; every check happens before anything is built.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._ir import CALL_KINDS, FN_KINDS, Equation, Mox, Symbol, Var
from ._map import map_mox
from ._print import type_str
from .errors import YaxRewriteError

Node = Equation | Mox


# -- small tree helpers -------------------------------------------------------------

def _avals(atoms: Sequence[Symbol]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in atoms]


def _subst(node: Node, m: dict[Var, Symbol]) -> Node:
    """``node`` with references to the vars in ``m`` replaced (a new tree)."""
    if not m:
        return node

    def one(n: Node) -> Node:
        ins = tuple(m.get(a, a) if isinstance(a, Var) else a for a in n.inputs)
        if isinstance(n, Equation):
            return n if ins == n.inputs else dataclasses.replace(n, inputs=ins)
        outs = tuple(m.get(a, a) if isinstance(a, Var) else a for a in n.outvars)
        if ins == n.inputs and outs == n.outvars:
            return n
        return dataclasses.replace(n, inputs=ins, outvars=outs)

    return map_mox(one, node) if isinstance(node, Mox) else one(node)


def _repath(node: Node, old: str, new: str, scope: tuple[str, ...] | None = None) -> Node:
    """``node`` moved from path ``old`` to ``new`` (and module scopes under ``scope``)."""
    def p(path: str) -> str:
        if path == old or not old:
            return new + path[len(old):] if old else (f"{new}/{path}" if path else new)
        if path.startswith(old + "/"):
            return new + path[len(old):]
        return f"{new}/{path}" if path else new

    def one(n: Node) -> Node:
        if isinstance(n, Mox) and n.scope is not None and scope is not None:
            return dataclasses.replace(n, path=p(n.path), scope=scope + n.scope)
        return dataclasses.replace(n, path=p(n.path))

    return map_mox(one, node) if isinstance(node, Mox) else one(node)


def _unbound(root: Mox) -> tuple[Node, Var] | None:
    """The first node reading a var that nothing bound before it, in
    evaluation order. Scoping is that of `eval_mox`: one environment for a
    root and the calls in it (a BatchNorm's updated statistics leave its call
    as root outputs), a fresh one for each nested computation."""

    def block(node: Mox, bound: set) -> tuple[Node, Var] | None:
        bound.update(node.constvars)
        bound.update(node.invars)
        for c in node.children:
            for a in c.inputs:
                if isinstance(a, Var) and a not in bound:
                    return c, a
            if isinstance(c, Equation):
                for _, sub in c.subs:
                    found = block(sub, set())
                    if found:
                        return found
            else:
                found = block(c, bound)
                if found:
                    return found
            bound.update(c.outputs)
        for a in node.outvars:
            if isinstance(a, Var) and a not in bound:
                return node, a
        return None

    return block(root, set())


def _where(node: Node) -> str:
    kind = "equation" if isinstance(node, Equation) else node.kind
    return f"the {kind} `{node.name}` at `{node.path or 'the root'}`"


# -- parameters ----------------------------------------------------------------------

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


class _Params:
    """The parameter tree passed to `sub` and where it sits in the root's arguments."""

    def __init__(self, root: Mox, params: Any):
        self.root = root
        self.values = jax.tree_util.tree_map(lambda x: x, dict(params))
        leaves = [None] * (len(root.dyn_in) + len(root.in_static))
        for i, v in zip(root.dyn_in, root.invars):
            leaves[i] = v
        for i, x in root.in_static:
            leaves[i] = x
        self.args = jax.tree_util.tree_unflatten(root.in_tree, leaves)
        by_path = {_keystr(kp): (kp, leaf) for kp, leaf in jax.tree_util.tree_flatten_with_path(self.args)[0]}
        flat = jax.tree_util.tree_flatten_with_path(self.values)[0]
        if not flat:
            raise YaxRewriteError("`params` is empty; pass the variables dict the model was traced with.")
        first = _keystr(flat[0][0])
        hits = [p for p in by_path if p.endswith(first)]
        prefix = None
        for h in hits:
            pre = h[: len(h) - len(first)]
            if all(pre + _keystr(kp) in by_path for kp, _ in flat):
                prefix = pre
                break
        if prefix is None:
            raise YaxRewriteError(
                "`params` is not among the arguments the MoX was traced with: no argument holds its "
                f"leaf `{first}` together with all its other leaves. Pass the same variables dict "
                "(e.g. the one given to `model.apply`)."
            )
        self.where = by_path[prefix + first][0][: -len(flat[0][0])]
        self.vars = jax.tree_util.tree_map_with_path(lambda kp, _: by_path[prefix + _keystr(kp)][1], self.values)
        for kp, x in flat:
            v = by_path[prefix + _keystr(kp)][1]
            if not isinstance(v, Var) or tuple(np.shape(x)) != v.shape:
                raise YaxRewriteError(
                    f"`params` leaf `{_keystr(kp)}` has shape {tuple(np.shape(x))}, but the MoX was traced "
                    f"with {getattr(v, 'shape', 'a static value')}. Pass the parameters it was traced with."
                )

    def place(self, scope: tuple[str, ...], old: Any, new_vals: Any, new_vars: Any) -> None:
        """Replace the variables of the module at ``scope``."""
        for coll in sorted(set(old or {}) | set(new_vals)):
            keys = (coll, *scope)
            val, var = new_vals.get(coll), new_vars.get(coll)
            self.values = _put(self.values, keys, val or None)
            self.vars = _put(self.vars, keys, var or None)

    def rebuilt(self, root: Mox) -> Mox:
        args = _set_in(self.args, self.where, self.vars)
        flat, tree = jax.tree_util.tree_flatten_with_path(args)
        dyn = tuple(i for i, (_, x) in enumerate(flat) if isinstance(x, Var))
        return dataclasses.replace(
            root,
            invars=tuple(flat[i][1] for i in dyn),
            inputs=tuple(flat[i][1] for i in dyn),
            in_tree=tree,
            dyn_in=dyn,
            in_static=tuple((i, x) for i, (_, x) in enumerate(flat) if not isinstance(x, Var)),
            in_paths=tuple(_keystr(flat[i][0]) for i in dyn),
        )


# -- replacements --------------------------------------------------------------------

def _is_decider(fn: Any) -> bool:
    try:
        names = list(inspect.signature(fn).parameters)[:2]
    except (TypeError, ValueError):
        return False
    return names == ["path", "node"]


def _is_module(x: Any) -> bool:
    import flax.linen as nn

    return isinstance(x, nn.Module)


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
    fields = {f.name for f in dataclasses.fields(node.module_type) if f.init and f.name not in ("parent", "name")}
    return node.module_type(**{**{k: v for k, v in node.attrs.items() if k in fields}, **changes})


def _filled(module: Any, node: Node) -> Any:
    """A template module with its ``None`` fields taken from the node it replaces."""
    if not isinstance(node, Mox):
        return module
    fill = {
        f.name: node.attrs[f.name]
        for f in dataclasses.fields(module)
        if f.init and f.name not in ("parent", "name") and getattr(module, f.name, 0) is None
        and node.attrs.get(f.name) is not None
    }
    return module.clone(**fill) if fill else module


@dataclasses.dataclass
class _Traced:
    root: Mox                     # the traced replacement
    n_vars: int = 0               # how many of root.invars are variables
    module: Any = None            # the (filled) Flax module, if any
    var_avals: Any = None         # its variables, abstract


def _fresh(root: Mox) -> Mox:
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

    def ref(atoms: Any) -> tuple:
        return tuple(m.get(a, a) if isinstance(a, Var) else a for a in atoms)

    def block(node: Mox) -> Mox:
        constvars = tuple(new(v) for v in node.constvars)
        invars = tuple(new(v) for v in node.invars)
        children: list[Node] = []
        for c in node.children:
            if isinstance(c, Equation):
                ins = ref(c.inputs)
                children.append(dataclasses.replace(c, inputs=ins, outputs=tuple(new(v) for v in c.outputs)))
            else:
                ins = ref(c.inputs)
                inner = block(c)
                children.append(dataclasses.replace(inner, inputs=ins, outputs=tuple(new(v) for v in c.outputs)))
        return dataclasses.replace(node, constvars=constvars, invars=invars, children=tuple(children),
                                   outvars=ref(node.outvars))

    out = block(root)
    return dataclasses.replace(out, inputs=out.invars, outputs=tuple(a for a in out.outvars if isinstance(a, Var)))


def _trace(repl: Any, node: Node, cache: dict[tuple, tuple[Any, _Traced]]) -> _Traced:
    """The replacement traced on the node's input avals, with fresh vars for
    this site; ``cache`` (one per `sub` call) keeps traces by replacement
    and avals, so 96 equal replacements trace once per shape."""
    from ._trace import make_mox

    avals = _avals(node.inputs)
    if isinstance(repl, Mox) and repl.kind != "root":
        raise YaxRewriteError(f"A MoX replacement must be a root from `yax.make_mox`, not a `{repl.kind}` node.")
    if isinstance(repl, Equation) and not all(isinstance(a, Var) for a in repl.inputs):
        raise YaxRewriteError("An equation replacement must take only vars as inputs (no literals).")
    module = _filled(repl, node) if _is_module(repl) else None
    if module is None and not callable(repl) and not isinstance(repl, (Mox, Equation)):
        raise YaxRewriteError(
            f"A replacement must be a MoX, an Equation, a Flax module or a function, but got a "
            f"`{type(repl).__name__}`."
        )
    key = (repr(module) if module is not None else id(repl), tuple((a.shape, str(a.dtype)) for a in avals))
    hit = cache.get(key)
    if hit is not None and (module is not None or hit[0] is repl):
        t = hit[1]
        return dataclasses.replace(t, root=_fresh(t.root))
    what = type(module).__name__ if module is not None else getattr(repl, "__name__", type(repl).__name__)
    try:
        if isinstance(repl, Mox):
            t = _Traced(repl)
        elif isinstance(repl, Equation):
            t = _Traced(Mox(kind="root", children=(repl,), inputs=repl.inputs, invars=repl.inputs,
                            outvars=repl.outputs, outputs=repl.outputs, name=repl.name))
        elif module is not None:
            var_avals = jax.eval_shape(lambda *xs: dict(module.init(jax.random.key(0), *xs)), *avals)
            root = make_mox(lambda v, *xs: module.apply(v, *xs))(var_avals, *avals)
            t = _Traced(root, len(jax.tree_util.tree_leaves(var_avals)), module, var_avals)
        else:
            t = _Traced(make_mox(repl)(*avals))
    except YaxRewriteError:
        raise
    except Exception as e:
        raise YaxRewriteError(
            f"The replacement `{what}` for {_where(node)} could not be traced on the node's inputs "
            f"({' '.join(map(type_str, node.inputs))}): {type(e).__name__}: {e}\nA replacement is called "
            "with the node's array inputs, positionally. Nothing was changed."
        ) from None
    cache[key] = (repl, t)
    return dataclasses.replace(t, root=_fresh(t.root))


def _check(t: _Traced, node: Node, repl: Any) -> None:
    what = getattr(repl, "__name__", None) or type(repl).__name__
    if len(t.root.invars) - t.n_vars != len(node.inputs):
        raise YaxRewriteError(
            f"The replacement `{what}` for {_where(node)} takes {len(t.root.invars) - t.n_vars} array "
            f"inputs, but the node has {len(node.inputs)} ({' '.join(map(type_str, node.inputs))}). "
            "Nothing was changed."
        )
    if len(t.root.outvars) != len(node.outputs):
        raise YaxRewriteError(
            f"The replacement `{what}` for {_where(node)} returns {len(t.root.outvars)} arrays, but the "
            f"node returns {len(node.outputs)} ({' '.join(map(type_str, node.outputs))}). Nothing was changed."
        )


def _fit(t: _Traced, node: Node, repl: Any, cast: bool) -> tuple[tuple[Equation, ...], dict[int, Var]]:
    """Check output avals. With ``cast``, also the equations that cast
    outputs back to the node's dtypes, and which output each one replaces."""
    from ._trace import make_mox

    what = getattr(repl, "__name__", None) or type(repl).__name__
    casts: list[tuple[int, Any]] = []
    for i, (a, b) in enumerate(zip(t.root.outvars, node.outputs)):
        if a.shape == b.shape and a.dtype == b.dtype:
            continue
        if a.shape == b.shape and cast:
            casts.append((i, b.dtype))
            continue
        raise YaxRewriteError(
            f"The replacement `{what}` for {_where(node)} does not fit: its output {i} is "
            f"{type_str(a)} but the node's is {type_str(b)}. "
            + ("Pass `cast=True` to cast outputs back to the node's dtypes. " if a.shape == b.shape else "")
            + "Nothing was changed."
        )
    if not casts:
        return (), {}
    src = [t.root.outvars[i] for i, _ in casts]
    c = make_mox(lambda *ys: [y.astype(d) for y, (_, d) in zip(ys, casts)])(*_avals(src))
    body = _subst(c, dict(zip(c.invars, src)))
    return tuple(body.children), {i: v for (i, _), v in zip(casts, c.outvars)}


def _build(t: _Traced, node: Node, casts: tuple[tuple[Equation, ...], dict[int, Var]],
           var_map: dict[Var, Var]) -> Mox:
    """The node that takes ``node``'s place: the replacement's single call
    (a module's ``__call__``, an activation) if it is one, else a
    ``function`` node around the traced body."""
    root = t.root
    ins = tuple(root.invars[t.n_vars:])
    body, cast_out = casts
    calls = [c for c in root.children if isinstance(c, Mox)]
    only = calls[0] if len(root.children) == 1 and calls else None
    if only is not None and tuple(only.inputs) == ins and tuple(only.outputs) == tuple(root.outvars):
        new = _repath(only, only.path, node.path, getattr(node, "scope", None))
        inner = dict(zip(only.outputs, only.outvars))  # casts read the call's own results
        body = tuple(_subst(e, inner) for e in body)
        new = dataclasses.replace(
            new,
            inputs=tuple(node.inputs),
            outputs=tuple(node.outputs),
            name=only.name if only.kind in FN_KINDS else getattr(node, "name", only.name),
            children=new.children + body,
            outvars=tuple(cast_out.get(i, v) for i, v in enumerate(new.outvars)),
            constvars=root.constvars + new.constvars,
            consts=root.consts + new.consts,
        )
    else:
        name = root.name or "function"
        new = Mox(
            kind="function",
            children=tuple(_repath(c, "", node.path, getattr(node, "scope", None)) for c in root.children) + body,
            inputs=tuple(node.inputs),
            invars=ins,
            outvars=tuple(cast_out.get(i, v) for i, v in enumerate(root.outvars)),
            outputs=tuple(node.outputs),
            constvars=root.constvars,
            consts=root.consts,
            path=node.path,
            name=name,
            method=name,
            ephemeral=True,
        )
    return _subst(new, var_map)


@dataclasses.dataclass
class _Scope:
    """The variables of one replaced module (shared by all its calls)."""

    node: Mox                          # the first replaced call
    traced: _Traced | None = None      # its replacement, if that has variables
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


def _variables(traced: list[tuple[Node, Any, _Traced, Any]], p: _Params | None, key: Any) -> dict[int, dict[Var, Var]]:
    """Place the replacements' variables in ``p`` (one set per module scope,
    kept leaves reused, new ones initialised with ``key``, dropped ones
    removed) and return, per replaced node, how its traced variable vars map
    to the canonical ones."""
    var_maps: dict[int, dict[Var, Var]] = {}
    scopes: dict[tuple[str, ...], _Scope] = {}
    for node, _r, t, _ in traced:
        var_maps[id(node)] = {}
        is_module = isinstance(node, Mox) and node.module_type is not None
        if t.module is None:
            if p is not None and is_module and node.var_tree and node.scope is not None:
                scopes.setdefault(node.scope, _Scope(node))  # its variables are dropped
            continue
        if p is None:
            raise YaxRewriteError(
                f"The replacement `{type(t.module).__name__}` for {_where(node)} has variables; pass "
                "`params=` (the variables dict the MoX was traced with) and `key=` so yax can place them."
            )
        if is_module and node.scope is None:
            raise YaxRewriteError(f"Cannot tell where the variables of {_where(node)} live: it has no scope.")
        scope = node.scope if is_module else tuple(node.path.split("/")[1:])
        tvars = t.root.invars[: t.n_vars]
        flat = jax.tree_util.tree_flatten_with_path(t.var_avals)[0]
        sc = scopes.get(scope)
        if sc is not None and sc.traced is not None:
            if [(a.shape, a.dtype) for _, a in flat] != [
                    (a.shape, a.dtype) for a in jax.tree_util.tree_leaves(sc.traced.var_avals)]:
                raise YaxRewriteError(
                    f"Two calls of the module at scope `{'/'.join(scope)}` were given replacements with "
                    "different variables; calls of one module share its variables, so give them the same one."
                )
        else:
            sc = scopes[scope] = _Scope(node, t)
            old_vars = {c: _get(p.vars, (c, *scope)) for c in (node.var_tree or {})} if is_module else {}
            for kp, a in flat:
                keys = [k.key for k in kp]
                ov = _get(old_vars, keys)
                if isinstance(ov, Var) and ov.shape == a.shape and ov.dtype == a.dtype:
                    sc.canon[_keystr(kp)] = ov
                    sc.kept[_keystr(kp)] = _get(p.values, keys[:1] + list(scope) + keys[1:])
        for tv, (kp, _) in zip(tvars, flat):
            sc.canon.setdefault(_keystr(kp), tv)
        var_maps[id(node)] = {tv: sc.canon[_keystr(kp)] for tv, (kp, _) in zip(tvars, flat)
                              if sc.canon[_keystr(kp)] is not tv}

    if p is not None:
        for i, (scope, sc) in enumerate(scopes.items()):
            old = sc.node.var_tree or {}
            if sc.traced is None:  # replaced by something without variables: drop the old ones
                p.place(scope, old, {}, {})
                continue
            avals = sc.traced.var_avals
            flat = jax.tree_util.tree_flatten_with_path(avals)[0]
            if len(sc.kept) < len(flat):
                if key is None:
                    raise YaxRewriteError(
                        f"The replacement at `{sc.node.path}` adds new variables; pass `key=` "
                        "(a `jax.random.key`) to initialise them. Nothing was changed."
                    )
                needed = tuple(j for j, (kp, _) in enumerate(flat) if _keystr(kp) not in sc.kept)
                xs = [jnp.zeros(a.shape, a.dtype) for a in _avals(sc.node.inputs)]
                got = _init(sc.traced.module, needed)(jax.random.fold_in(key, i), *xs)
                fresh = [None] * len(flat)
                for j, x in zip(needed, got):
                    fresh[j] = x
            else:
                fresh = [None] * len(flat)
            tree = jax.tree_util.tree_structure(avals)
            vals = jax.tree_util.tree_unflatten(tree, [sc.kept.get(_keystr(kp), x) for (kp, _), x in zip(flat, fresh)])
            vars_ = jax.tree_util.tree_unflatten(tree, [sc.canon[_keystr(kp)] for kp, _ in flat])
            p.place(scope, old, dict(vals), dict(vars_))

    return var_maps


# -- the public entry point -----------------------------------------------------------

def _matches(pattern: Any, mox: Mox) -> list[Node]:
    from ._xpath import query

    if isinstance(pattern, str):
        found = query(pattern, mox)
        if not isinstance(found, list):
            raise YaxRewriteError(
                f"The pattern `{pattern}` returned a {type(found).__name__}, not nodes. "
                "Use a location path such as `//module_call[@type=\"Dense\"]`."
            )
    elif isinstance(pattern, (Mox, Equation)):
        found = [pattern]
    elif isinstance(pattern, (list, tuple)):
        found = list(pattern)
    else:
        raise YaxRewriteError(
            f"`pattern` must be an XPath string, a node or a list of nodes, but got `{type(pattern).__name__}`."
        )
    for n in found:
        if not isinstance(n, (Mox, Equation)) or (isinstance(n, Mox) and n.kind not in CALL_KINDS):
            what = f"a `{n.kind}` node" if isinstance(n, Mox) else f"`{n!r}`"
            raise YaxRewriteError(
                f"`sub` replaces module calls, activations and equations, but the pattern matched {what}. "
                "Narrow the pattern, e.g. `//module_call[...]`."
            )
    return found


def _locate(mox: Mox, targets: list[Node]) -> tuple[list[Node], set[int]]:
    """Targets in tree order, outermost only, and the ids of those inside nested jaxprs."""
    ids = {id(t) for t in targets}
    order: list[Node] = []
    nested: set[int] = set()

    def walk(node: Mox, inside: bool) -> None:
        for c in node.children:
            if id(c) in ids:
                order.append(c)
                if inside:
                    nested.add(id(c))
                continue
            if isinstance(c, Equation):
                for _, s in c.subs:
                    walk(s, True)
            else:
                walk(c, inside)

    walk(mox, False)
    if len({id(t) for t in order}) != len(ids):
        inner = ids - {id(t) for t in order}
        outside = [t for t in targets if id(t) in inner and not any(t is n for n in mox.walk())]
        if outside:
            raise YaxRewriteError(
                f"{_where(outside[0]).capitalize()} is not part of this MoX. Query the MoX you rewrite."
            )
    return order, nested


def _checked(node: Node, r: Any, cast: bool, nested: bool, cache: dict) -> tuple[_Traced, Any]:
    """Trace ``r`` on ``node``'s inputs and run every check `sub` makes
    before it changes anything; raises `YaxRewriteError`."""
    t = _trace(r, node, cache)
    _check(t, node, r)
    casts = _fit(t, node, r, cast)
    if t.n_vars and nested:
        raise YaxRewriteError(
            f"{_where(node).capitalize()} is inside a transformed computation (an `nn.scan`/`vmap` "
            "body), where yax cannot add variables yet. Replace it with a function or a module "
            "without variables, or rewrite the model's code for this layer."
        )
    return t, casts


def misfit(repl: Any, node: Node, mox: Mox, *, cast: bool = False, cache: dict | None = None) -> str | None:
    """Why ``repl`` cannot replace ``node`` of ``mox``, or ``None`` when it
    fits: the checks `sub` runs before it changes anything (the explorer
    offers only the replacements that fit a row). ``cache`` may be shared
    between calls to trace each replacement once per input shapes."""
    _, nested = _locate(mox, [node])
    try:
        r = repl(node.path, node) if _is_decider(repl) else repl
        if r is not node:
            _checked(node, r, cast, id(node) in nested, {} if cache is None else cache)
    except YaxRewriteError as e:
        return str(e)
    return None


def sub(pattern: Any, repl: Any, mox: Mox, *, params: Any = None, key: Any = None,
        cast: bool = False) -> Any:
    """Replace the nodes ``pattern`` selects by ``repl``; never in place.

    Args:
      pattern: an XPath string, a node, or a list of nodes (module calls,
        method calls, activations or equations). A match inside another
        match is left to the outer one's replacement.
      repl: what to put there, called on the node's array inputs:
        a function (``jax.nn.gelu``, ``lambda x: x``), a Flax linen module
        instance (its fields left ``None`` are taken from the module it
        replaces, so ``yax.LoRA(rank=4)`` fits every ``Dense``), a root MoX,
        an Equation, or a function whose first two parameters are named
        ``path`` and ``node`` that returns the replacement for each match
        (or the node itself, to keep it).
      mox: the root MoX to rewrite.
      params: the variables dict the MoX was traced with (the first argument
        of ``model.apply``). Needed when a replacement has variables, and to
        drop the variables of replaced modules.
      key: a PRNG key for new variables (folded with each module's index).
      cast: allow outputs of another dtype (same shape) and cast them back
        to the node's dtypes at its boundary (mixed precision).

    Returns:
      The new MoX; ``(new_mox, new_params)`` when ``params`` is given.
      Evaluate it with ``yax.eval_mox(new_mox, new_params, *rest)``.

    Raises:
      YaxRewriteError: a replacement does not fit (which node, which
        input/output, expected vs found); the inputs are untouched.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu]); x = jnp.ones((1, 3))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> new = yax.sub('//*[@name="relu"]', jax.nn.gelu, mox)
      >>> [n.name for n in new.modules()], [n.name for n in mox.modules()]
      (['Sequential', 'layers_0', 'gelu'], ['Sequential', 'layers_0', 'relu'])
      >>> bool(jnp.allclose(yax.eval_mox(new, p, x), jax.nn.gelu(nn.Dense(4).apply(
      ...     {"params": p["params"]["layers_0"]}, x))))
      True
    """
    if not isinstance(mox, Mox) or mox.kind != "root":
        raise YaxRewriteError(
            f"`sub` rewrites the root MoX from `yax.make_mox`, but got {getattr(mox, 'kind', type(mox).__name__)!r}."
        )
    targets, nested = _locate(mox, _matches(pattern, mox))
    decide = _is_decider(repl)
    plan: list[tuple[Node, Any]] = []
    for node in targets:
        r = repl(node.path, node) if decide else repl
        if r is node:
            continue
        plan.append((node, r))

    from ._trace_nnx import is_module as is_nnx_module

    if any(is_nnx_module(r) for _, r in plan):
        from ._sub_nnx import sub_modules

        return sub_modules(mox, plan, nested, params, cast)
    nnx_root = mox.graphdef is not None

    # Trace and check every replacement before building anything.
    traced = []
    cache: dict[tuple, tuple[Any, _Traced]] = {}
    for node, r in plan:
        traced.append((node, r, *_checked(node, r, cast, id(node) in nested, cache)))

    # An nnx root keeps its state: replaced modules' variables stay in it, unused.
    p = _Params(mox, params) if params is not None and not nnx_root else None
    var_maps = _variables(traced, p, key)
    built = {id(node): _build(t, node, casts, var_maps[id(node)]) for node, _r, t, casts in traced}
    new = map_mox(lambda n: built.get(id(n), n), mox) if built else mox
    if p is not None:
        new = p.rebuilt(new)
    if nnx_root:
        from ._sub_nnx import keep_untouched_state

        new = keep_untouched_state(new, [n for n, _ in plan])
    bad = _unbound(new)
    if bad is not None:
        node, _ = bad
        raise YaxRewriteError(
            f"After the rewrite, {_where(node)} would read a value that no longer exists: most likely "
            "a variable of a replaced module that this call shares (another method of the module, or "
            "another call of it). Replace all calls of that module together, or keep variables with the "
            "same names and shapes. Nothing was changed."
        )
    if nnx_root and params is not None:
        return new, params
    return (new, p.values) if p is not None else new
