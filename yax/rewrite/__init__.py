"""The rewrite engine: `sub` and `misfit` (see README.md beside this file).

Selecting (`select`), tracing and checking a replacement (`replacement`),
splicing it in (`splice`), and placing variables (the root's frontend's
layout, `yax.frontends.variables`) are separate steps; `sub` and `misfit`
run the same checks, so they never disagree about what fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import _roots, errors, frontends
from .._check import check_if_enabled
from .._ir import Equation, Kind, ModuleInfo, Mox, Signature, Var
from .._map import mapped
from ..errors import YaxError, YaxRewriteError
from .replacement import Decider, Site, checked, decider, is_decider, is_module, module_of
from .select import locate, matches, outside_rules
from .shard import placed
from .splice import spliced, unbound
from .thread import Threads

__all__ = ["Decider", "decider", "module_of", "sub", "misfit", "is_decider", "is_module"]


def _plan(pattern: Any, repl: Any, mox: Mox, must_match: bool) -> tuple[list[tuple[Any, Any]], dict[int, tuple[Any, ...]]]:
    """``(node, replacement)`` for each match, outermost first, and the ids of
    matches inside nested computations. A decider's "keep" (the node itself) drops the match.
    A match inside a custom derivative rule's computation is replaced with the rule (`outside_rules`)."""
    targets, nested = locate(mox, matches(pattern, mox))
    if not targets and must_match:
        from .._xpath import explain

        raise errors.NothingToRewrite(pattern, explain(pattern, mox) if isinstance(pattern, str) else "")
    decide = is_decider(repl)
    plan: list[tuple[Any, Any]] = []
    for node in targets:
        r = _decided(repl, node) if decide else repl
        if r is not node:
            node, chain = outside_rules(mox, node, nested.get(id(node), ()))
            if chain:
                nested[id(node)] = chain
            if all(node is not n for n, _ in plan):  # two matches that are one rule's whole computation
                plan.append((node, r))
    return plan, nested


def _decided(decider: Any, node: Any) -> Any:
    """What the decider ``f(path, node)`` answers for ``node``; its errors as
    `YaxRewriteError`. A decider that changed the node (or a node below it)
    is refused, the change undone."""
    name = getattr(decider, "__name__", type(decider).__name__)
    kept = _fields_of(node)
    try:
        answer = decider(node.path, node)
    except YaxRewriteError:
        _undo(kept)
        raise
    except Exception as e:
        _undo(kept)
        raise YaxRewriteError(
            f"The decider `{name}` raised {type(e).__name__}: {e} when asked about {errors.where(node)}. Fix the "
            "decider, or narrow the pattern to the nodes it handles."
        ) from e
    changed = _undo(kept)
    if changed:
        raise errors.DeciderMutated(name, node, changed)
    return answer


# Nodes are frozen dataclasses and `ModuleInfo.attrs` is read-only, but Python cannot stop
# `object.__setattr__(node, ...)` or `node.params[...] = ...` (an equation's params are a
# dict). A decider is user code handed the very nodes of the MoX (so that returning the node
# means "keep it"), so what it could change is recorded before it runs and checked after: a
# change would make printing and the cached query view disagree, and rewrites depend on
# nodes never changing.
def _fields_of(node: Any) -> list[tuple[Any, str, dict[str, Any]]]:
    """``(object, label, {field: value})`` for ``node``, the nodes below it and
    their module facts and call signatures; an equation's params as ``"params"``."""
    kept: list[tuple[Any, str, dict[str, Any]]] = []
    seen: set[int] = set()
    below = node.walk() if isinstance(node, Mox) else (x for _, s in node.subs for x in (s, *s.walk()))
    for n in (node, *below):
        at = "" if n is node else f"`{n.path or n.name}`: "  # a node below the one asked about
        parts: list[tuple[Mox | Equation | ModuleInfo | Signature, str]] = (
            [(n, at), (n.info, f"{at}info."), (n.sig, f"{at}sig.")] if isinstance(n, Mox) else [(n, at)])
        for obj, label in parts:
            if id(obj) not in seen:
                seen.add(id(obj))
                names = _FIELDS.get(type(obj)) or _FIELDS.setdefault(
                    type(obj), tuple(f.name for f in dataclasses.fields(obj)))
                fields = {k: getattr(obj, k) for k in names}
                if isinstance(fields.get("params"), dict):
                    fields["params"] = (fields["params"], dict(fields["params"]))
                kept.append((obj, label, fields))
    return kept


_FIELDS: dict[type, tuple[str, ...]] = {}


def _undo(kept: list[tuple[Any, str, dict[str, Any]]]) -> list[str]:
    """Put back every field `_fields_of` recorded that changed; which ones."""
    changed = []
    for obj, label, fields in kept:
        for k, v in fields.items():
            if k == "params" and isinstance(v, tuple):  # the dict itself, and what it held
                v, held = v
                if obj.params is v and v.keys() == held.keys() and all(v[x] is held[x] for x in held):
                    continue
                v.clear()
                v.update(held)
            elif getattr(obj, k) is v:
                continue
            object.__setattr__(obj, k, v)
            changed.append(label + k)
    return changed


def _check_key(key: Any) -> None:
    """``key`` is ``None`` or a PRNG key: a typed key (`jax.random.key`) or raw ``uint32[2]``."""
    if key is None:
        return
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    issubdtype = jax.dtypes.issubdtype  # type: ignore[attr-defined]  # public, re-exported without `as`
    if dtype is not None and (issubdtype(dtype, jax.dtypes.prng_key) or
                              (dtype == np.uint32 and shape is not None and tuple(shape) == (2,))):
        return
    raise YaxRewriteError(
        f"`key` must be a PRNG key (`jax.random.key(0)`), but got the {type(key).__name__} "
        f"{str(key)[:40]!r}. It initialises the replacements' new variables."
    )


def _held(layout: frontends.Variables) -> Callable[[Any], Any]:
    """``held(node)``: the shapes of a module's variables as the model holds them
    (``{collection: tree}``, or ``None``; `Variables.held`): how a mapping
    transform (``nn.vmap``) stacks a module's variables is read from them."""
    return layout.held


def _built(mox: Mox, sites: list[Site], var_maps: dict[int, dict[Var, Var]], dropped: set[Any]) -> Mox:
    """The tree with every site's replacement spliced in; variables read inside
    nested computations passed down to them, dropped ones no longer passed."""
    threads = Threads()
    threads.dropped = set(dropped)
    for s in sites:  # a MoX reading the replaced module's variables where they are (`own.resolve`)
        if s.reads:
            var_maps[id(s.node)] = {**s.reads, **var_maps.get(id(s.node), {})}
    for s in sites:
        threads.follow(s.chain)
        if s.chain:
            var_maps[id(s.node)] = {tv: threads.inner(v, s.chain) for tv, v in var_maps[id(s.node)].items()}
    built = {id(s.node): spliced(s.traced, s.node, s.casts, var_maps[id(s.node)]) for s in sites}
    before = threads.before if threads.on_chains else None
    return mapped(lambda n: built.get(id(n), n), mox, before=before) if built else mox


def misfit(repl: Any, node: Any, mox: Mox, *, cast: bool = False, cache: dict[Any, Any] | None = None,
           params: Any = None) -> str | None:
    """Why ``repl`` cannot replace ``node`` of ``mox``, or ``None`` when it
    fits: `sub` itself run on ``node`` (the explorer offers only the
    replacements that fit a row, so the menu never offers what a drop
    refuses), its result thrown away. With ``params`` (as `sub` takes them)
    that is done on abstract copies of the parameters: nothing is initialised.
    ``cache`` may be shared between calls to trace each replacement once per
    input shapes."""
    abstract = None if params is None else jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), getattr(x, "dtype", None) or np.asarray(x).dtype), params)
    try:
        # every check `sub` makes, the ones made while the result is built too (an nnx MoX that
        # functions were put in refuses nnx modules only then): a copy of them would drift
        _sub([node], repl, mox, abstract, None, cast, True, None, cache)
    except YaxError as e:
        return errors.message(e)  # a reason, without the docs pointer
    except Exception as e:  # as `sub` reports it
        return str(errors.unexpected("`yax.sub`", e, YaxRewriteError))
    return None


def sub(pattern: Any, repl: Any, mox: Mox, *, params: Any = None, key: Any = None,
        cast: bool = False, must_match: bool = True, keep: dict[str, str] | None = None) -> Any:
    """Replace the nodes ``pattern`` selects by ``repl``; never in place.

    Args:
      pattern: an XPath string, a node, or a list of nodes (module calls,
        method calls, activations or equations). A match inside another
        match is left to the outer one's replacement.
      repl: what to put there, called on the node's array inputs:
        a function (``jax.nn.gelu``, ``lambda x: x``), a module of the
        MoX's module system (a Flax linen module instance, its fields left
        ``None`` taken from the module it replaces; an nnx module on a MoX of
        an nnx model), a template completed from each node it replaces
        (``yax.LoRA(rank=4)``: each layer's own adapter), a root MoX or a call node cut from
        another MoX (put in with its own equations, never re-traced; its
        variables placed like a module's), an Equation, or a function
        whose first two parameters are named ``path`` and ``node`` that
        returns the replacement for each match (or the node itself, to keep it).
        A node that is the whole computation of a custom derivative rule
        (``//jit[@name="relu"]`` inside ``jax.nn.relu``) is replaced with
        its rule; one that is only part of it is refused.
      mox: the root MoX to rewrite.
      params: the variables the MoX was traced with (the first argument of
        ``model.apply``; for an nnx model, its state). Needed when a
        replacement has variables, and to drop the variables of replaced modules.
        Given as ``jax.ShapeDtypeStruct``s (``jax.eval_shape`` of an init),
        the new variables come back abstract too: nothing is allocated.
      key: a PRNG key for new variables (folded with each module's index).
      cast: allow outputs of another dtype (same shape) and cast them back
        to the node's dtypes at its boundary (mixed precision).
      keep: which old variable each new leaf takes its value from, as paths
        inside the module (``{"params/base/kernel": "params/kernel"}``), for
        layouts yax cannot match by itself (it matches leaves of the same path,
        and leaves inside a submodule of the replaced module's type); ``{}``
        initialises every new leaf afresh.
      must_match: refuse a pattern that matches nothing (the default, with
        `yax.explain`'s account of where the query stopped matching); with
        ``False`` such a `sub` returns its inputs unchanged.

    Returns:
      The new MoX; ``(new_mox, new_params)`` when ``params`` is given.
      Evaluate it with ``yax.eval_mox(new_mox, new_params, *rest)``.

    Raises:
      YaxRewriteError: a replacement does not fit (which node, which
        input/output, expected vs found); the inputs are untouched. Every
        failure is a `YaxError` (a query's `YaxQueryError`; anything
        unforeseen as a `YaxRewriteError`, its cause chained).

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
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        raise YaxRewriteError(
            f"`sub` rewrites the root MoX from `yax.make_mox`, but got {getattr(mox, 'kind', type(mox).__name__)!r}."
        )
    try:
        return check_if_enabled(_sub(pattern, repl, mox, params, key, cast, must_match, keep))
    except YaxError:
        raise
    except Exception as e:
        raise errors.unexpected("`yax.sub`", e, YaxRewriteError) from e


def _sub(pattern: Any, repl: Any, mox: Mox, params: Any, key: Any, cast: bool, must_match: bool,
         keep: dict[str, str] | None, cache: dict[Any, Any] | None = None) -> Any:
    _check_key(key)
    plan, nested = _plan(pattern, repl, mox, must_match)
    if not plan:  # nothing to replace (`must_match=False`, or a decider kept every match)
        return mox if params is None else (mox, params)
    # Trace and check every replacement before building anything.
    layout = frontends.variables(mox, params)
    if layout is None:
        raise errors.ParamsDoNotFit(
            f"`params` is a `{type(params).__name__}`, which no module system of this MoX holds its variables "
            "in.", "Pass the variables the MoX was traced with (the first argument of `model.apply`, or an nnx state). "
            "A MoX of a function that takes the model as an argument (a jitted `forward(model, cache, tokens)`) "
            "holds no variables of its own to rewrite: trace the model itself (`yax.make_mox(model)(tokens, cache)`) "
            "for rewrites that add or change variables; rewrites without new variables (an activation swap) work on "
            "either."
        )
    cache = {} if cache is None else cache
    held = _held(layout)
    sites: list[Site] = [checked(node, r, cast, nested.get(id(node), ()), cache, held, mox) for node, r in plan]
    new = _built(mox, sites, layout.place(sites, key, keep), layout.dropped())
    result = layout.finish(new, sites)
    if isinstance(result, tuple):  # new variables laid out like the replaced layers' (a sharded model's)
        result = placed(mox, result[0], params, result[1], sites)
    root = result[0] if isinstance(result, tuple) else result
    bad = unbound(root)
    if bad is not None:
        from .._print import window

        raise errors.Dangling(errors.where(bad[0]), window(root, bad[0]))
    _roots.note(root)  # a node cut from it can be used in another MoX (`own`)
    return result


frontends.engine.provide(sub=sub, locate=locate, matches=matches)
