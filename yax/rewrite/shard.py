"""Placing a rewrite's new variables where the replaced layer's live.

A `sub` on a sharded model makes its new variables (a LoRA adapter's
``lora_a``/``lora_b``, a replacement's fresh parameters) where they are
initialised, on one device. `placed` moves each onto the mesh of the layer it
replaces, with a sharding derived from that layer's variables
(`yax._sharding.derived`: ``lora_a`` split like the kernel's input axis,
``lora_b`` like its output axis), and records the new root's input shardings
(``Mox.shardings``, the ``@sharding`` the view shows). Kept variables are the
model's own arrays, untouched; on a model that is not sharded nothing moves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from .._ir import Mox, Var
from .._sharding import any_spread, derived, is_sharded, spec_of, spread
from .own import leaves, located


def _by_var(root: Mox, values: Any) -> dict[Var, Any]:
    """The root's inputs that ``values`` (a part of its arguments: the variables) holds,
    each with its value: matched by key path, the arguments' path ending in the value's."""
    flat = [(jax.tree_util.keystr(kp), x) for kp, x in jax.tree_util.tree_flatten_with_path(values)[0]]
    if not flat:
        return {}
    paths = dict(zip(root.in_paths, root.invars))
    first = flat[0][0]
    for path in root.in_paths:
        if path.endswith(first):
            prefix = path[: len(path) - len(first)]
            found = {paths[prefix + p]: x for p, x in flat if prefix + p in paths}
            if len(found) == len(flat):
                return found
    return {}


def placed(old: Mox, new: Mox, params: Any, new_params: Any, sites: list[Any]) -> tuple[Mox, Any]:
    """``(new, new_params)`` with each new variable of a replaced layer laid out on
    that layer's mesh, and the new root's input shardings recorded."""
    if not old.shardings and not any_spread(params):  # a model on one device: nothing to lay out
        return new, new_params
    before = _by_var(old, params)
    after = _by_var(new, new_params)
    kept = {id(x) for x in before.values()}
    moved: dict[int, Any] = {}
    for s in sites:
        node, traced = s.node, s.traced
        if not isinstance(node, Mox) or node.scope is None or traced.module is None:
            continue
        names = [r for r, _ in leaves(node.var_tree)]
        refs = [(r[-1], getattr(before[v], "sharding", None), tuple(before[v].shape))
                for r, v in zip(names, located(old, node.scope, names)) if v in before]
        mine = [r for r, _ in leaves(traced.var_avals)]
        for r, v in zip(mine, located(new, node.scope, mine)):
            x = after.get(v) if v is not None else None
            if not isinstance(x, jax.Array) or id(x) in kept or id(x) in moved:
                continue
            where = derived(r[-1], tuple(x.shape), refs)
            if where is not None:
                moved[id(x)] = jax.device_put(x, where)
    if moved:
        new_params = jax.tree_util.tree_map(lambda x: moved.get(id(x), x), new_params)
        after = _by_var(new, new_params)
    return _recorded(old, new, after), new_params


def _recorded(old: Mox, new: Mox, after: dict[Var, Any]) -> Mox:
    """``new`` with its input shardings: the variables' read off their values (``after``),
    the other inputs' (the batch) as `make_mox` recorded them on ``old``."""
    known = dict(old.shardings)
    specs = []
    for v in new.invars:
        spec = spec_of(after[v]) if v in after else known.get(v)
        if spec is not None:
            specs.append((v, spec))
    return dataclasses.replace(new, shardings=tuple(specs) if any(is_sharded(s) for _, s in specs) else ())


def kept_layout(old: Mox, new: Mox, params: Any, new_params: Any) -> tuple[Mox, Any]:
    """``(new, new_params)`` with every variable ``params`` had at the same path laid
    out as it was there (`yax.merge_lora`: a merged kernel keeps the kernel's sharding)."""
    was = {jax.tree_util.keystr(kp): x.sharding for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]
           if spread(x)}
    if not was:
        return new, new_params

    def one(kp: Any, x: Any) -> Any:
        s = was.get(jax.tree_util.keystr(kp))
        return jax.device_put(x, s) if s is not None and isinstance(x, jax.Array) and x.sharding != s else x

    new_params = jax.tree_util.tree_map_with_path(one, new_params)
    return _recorded(old, new, _by_var(new, new_params)), new_params
