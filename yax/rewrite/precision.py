"""Mixed precision by query: `mixed_precision`, a rewrite built on `sub`.

`mixed_precision` sets the compute (and parameter) dtype of the calls a
policy's queries match, as PAX's policies did, through the layer's own
``dtype``/``param_dtype`` (`yax.module_of`), so the layer's own code decides
what a half-precision version of it is (Flax's norms keep their statistics in
float32). Between calls the MoX keeps its traced dtypes: a rewritten call's
output is cast back to the dtype the next call was traced with (``output``
must be that dtype; a policy that hands half-precision values to the next
layer needs the model traced with them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from .. import frontends
from .._check import check_if_enabled
from .._ir import Kind, Mox
from .._precision import PARAM_RULES, Policy, precisions
from .._vocab import key_name
from .._xpath import query
from ..errors import BadPolicy, NeedsParams, PolicyNotApplied, WrongNodeKind, YaxRewriteError, said
from . import module_of, sub

#: The layers whose math is matrix products or convolutions, by type, in linen, nnx and Hugging Face's GPT-2.
LINEAR_TYPES = ("Dense", "DenseGeneral", "Einsum", "Conv", "ConvTranspose", "ConvLocal", "Linear",
                "LinearGeneral", "FlaxConv1D")


def _is_linear() -> str:
    return " or ".join(f'@type="{t}"' for t in LINEAR_TYPES)


#: PAX's default policy: dense-like and convolution layers compute in bfloat16 with float32
#: parameters and outputs; normalisation layers compute in float32. Later entries win.
default_policy: dict[str, str] = {
    f"//module_call[{_is_linear()}]": "params=float32,compute=bfloat16,output=float32",
    '//module_call[contains(@type, "Norm")]': "params=float32,compute=float32,output=float32",
}


def mixed_precision(mox: Mox, policy: Mapping[str, Any] | None = None, params: Any = None) -> Any:
    """A new MoX whose calls compute as ``policy`` says: a mapping from a query
    to a jmp-style policy (``"params=float32,compute=bfloat16,output=float32"``,
    or a ``jmp.Policy``), or to ``None`` to leave what it matches as it is;
    later entries win where queries overlap; calls no query matches are left
    as they are. `yax.default_policy` (the default) is
    PAX's: dense-like and convolution layers in bfloat16, normalisation in float32.

    Each matched call whose compute dtype differs is rebuilt with ``dtype=``
    (and ``param_dtype=`` for a params dtype, its parameters cast) by
    `yax.module_of`, and its output cast back at its boundary; a call nested
    in another matched one is rewritten after it. With ``params=``, returns
    ``(new_mox, new_params)`` like `yax.sub`. Nothing changes on error.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.LayerNorm()]); x = jnp.ones((2, 3))
      >>> mox = yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
      >>> half = yax.mixed_precision(mox)
      >>> [(n.path, n.type) for n in yax.query('//module_call[@compute="float32"]', half)]
      [('Sequential/layers_1', 'LayerNorm')]
      >>> yax.query('//module_call[@name="layers_0"]/@policy', half)
      ['params=float32,compute=bfloat16,output=float32']
    """
    if policy is None:
        policy = default_policy
    if not isinstance(policy, Mapping):
        raise BadPolicy(policy, None,
            f"`mixed_precision` takes a mapping from queries to policies, but got a `{type(policy).__name__}`. "
            f"For every layer: {{\"//module_call\": {str(policy)!r}}}; PAX's default is `yax.default_policy`.")
    chosen: dict[str, tuple[Mox, Policy]] = {}
    for q, p in policy.items():
        pol = Policy.parse(p) if p is not None else None
        for n in query(q, mox):
            if not isinstance(n, Mox) or n.kind != Kind.MODULE_CALL:
                raise WrongNodeKind(
                    "A mixed-precision policy", "applies to module calls",
                    f"{getattr(n, 'path', None) or n!r}, a {getattr(n, 'kind', type(n).__name__)}",
                    "Add `module_call` to the query: `//module_call[...]`.", n, pattern=q)
            if pol is None:
                chosen.pop(n.path, None)
            else:
                chosen[n.path] = (n, pol)
    now = precisions(mox)
    todo: dict[str, dict[str, Any]] = {}
    for path, (n, pol) in chosen.items():
        has = now[id(n)]
        if pol.output is not None and has.output is not None and pol.output != has.output:
            raise PolicyNotApplied(
                "output",
                f"The policy {str(pol)!r} asks the `{n.type}` at {path!r} for {pol.output} outputs, but the "
                f"calls after it were traced with its {has.output} outputs, and a rewrite changes a call, not "
                f"what its neighbours receive. Use output={has.output} (the value is computed in the compute "
                f"dtype either way), or trace the model with {pol.output} inputs.",
                path, str(pol), pol.output, has.output)
        changes: dict[str, Any] = {}
        if pol.compute is not None and has.compute != pol.compute:
            changes["dtype"] = jnp.dtype(pol.compute).type
        if pol.params is not None and has.params is not None and has.params != pol.params:
            changes["param_dtype"] = jnp.dtype(pol.params).type
        if changes:
            todo[path] = changes
    if any("param_dtype" in c for c in todo.values()) and params is None:
        raise NeedsParams("The policy changes the dtype of parameters, which are cast to it: pass them "
                          "(`yax.mixed_precision(mox, policy, params=params)`).", "mixed_precision")
    new, new_params = mox, params
    # outermost first: a call rebuilt with a dtype re-traces what is inside it, which later levels then set
    for depth in sorted({p.count("/") for p in todo}):
        level = {p: c for p, c in todo.items() if p.count("/") == depth}

        def rebuilt(path: str, node: Mox, level: dict[str, dict[str, Any]] = level) -> Any:
            changes = level.get(node.path)
            if changes is None:
                return node
            try:
                return module_of(node, **changes)
            except YaxRewriteError as e:
                raise PolicyNotApplied(
                    "dtype",
                    f"The policy sets the compute dtype of the `{node.type}` at {node.path!r} through its own "
                    f"`dtype`, which yax could not set: {_said(e)} Give the policy to the layers inside it "
                    f"instead (`//module_call[@path=\"{node.path}\"]//module_call[...]`).", node.path,
                    cause=e) from None

        targets = [n for n in new.modules() if n.path in level]
        try:
            if new_params is None:
                new = sub(targets, rebuilt, new, cast=True)
            else:
                cast = _cast_params(targets, level, new_params)
                if cast is new_params or not frontends.get(new.frontend).places_by_module:  # nnx reads them in place
                    new, new_params = sub(targets, rebuilt, new, params=new_params, cast=True)
                else:  # variables of another dtype are new to `sub`: it makes them, then they take the cast values
                    new, made = sub(targets, rebuilt, new, params=cast, cast=True, key=jax.random.key(0), keep={})
                    new_params = _cast_params(targets, level, made, like=cast)
        except NeedsParams as e:
            raise NeedsParams(f"`mixed_precision` rebuilds the layers its policy matches. {_said(e)}",
                              "mixed_precision") from None
        except YaxRewriteError as e:
            inner = e if isinstance(e, PolicyNotApplied) else None  # the layer's own dtype: keep what it says
            raise PolicyNotApplied(
                inner.problem if inner else "rewrite", f"{_said(e)} To leave a layer out of the policy, map a query "
                "for it to None: `{**policy, '//module_call[@path=\"...\"]': None}`.",
                inner.path if inner else getattr(getattr(e, "node", None), "path", None),
                cause=inner.cause if inner else e) from None
    return check_if_enabled(new if params is None else (new, new_params))


def _said(e: BaseException) -> str:
    return said(e)


def _cast_params(targets: list[Mox], level: dict[str, dict[str, Any]], params: Any, like: Any = None) -> Any:
    """``params`` with the floating parameters of each target whose policy sets
    ``param_dtype`` cast to it, in the layout given: at the target's scope in
    the ``params`` collection of a linen variables dict, in a bare parameter
    dict (Hugging Face's), or the ``nnx.Param`` variables of an nnx state.
    With ``like``, those parameters are taken from ``like`` (at the same path)."""
    casts = {tuple(n.scope or ()): level[n.path]["param_dtype"] for n in targets if "param_dtype" in level[n.path]}
    if not casts:
        return params

    def variable(x: Any) -> bool:
        return type(x).__name__ != "ArrayImpl" and hasattr(x, "get_value") and hasattr(x, "replace")

    def param(x: Any) -> bool:  # a plain array, or a variable object some system says holds a parameter
        return not variable(x) or any(rule(x) for rule in PARAM_RULES.values())

    source = {} if like is None else {tuple(map(key_name, kp)): x for kp, x in
                                        jax.tree_util.tree_flatten_with_path(like, is_leaf=variable)[0]}

    def cast(kp: Any, x: Any) -> Any:
        keys = tuple(map(key_name, kp))
        for scope, dt in casts.items():
            at = 1 if keys[:1] == ("params",) else 0
            if scope and keys[at: at + len(scope)] == scope and param(x):
                return jax.tree_util.tree_map(
                    lambda a: a.astype(dt) if jnp.issubdtype(a.dtype, jnp.floating) else a, source.get(keys, x))
        return x

    return jax.tree_util.tree_map_with_path(cast, params, is_leaf=variable)
