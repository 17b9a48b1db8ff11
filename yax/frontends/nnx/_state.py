"""Rewriting flax.nnx models: the state layout `sub` places variables in,
and `replace_modules`, query-driven surgery on the live module object.

An nnx MoX (from ``yax.make_mox(model)``) computes
``(state, *args) -> (out, new_state)``. A replacement nnx module is traced
on the node's input avals with ``make_mox(replacement)`` (by the engine,
through `NnxFrontend.trace_replacement`); its variables take the replaced
module's place in the state, at the module's attribute path. Leaves with the
same name, variable type, shape and dtype as the old module's keep their
values (``nnx.LoRALinear`` keeps ``kernel`` and ``bias``); new leaves take
the replacement's own values (nnx modules are initialised when built, so no
key is needed), but for the ``lora_a`` of `yax.LoRA`'s adapters, drawn from
``key`` per layer (`_lora.drawn`). The new graphdef is the old model with
the replacement set at every attribute that held the old module, so
``nnx.merge(new_mox.graphdef, new_state)`` is the rewritten model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ... import errors
from ..._ir import Kind, Mox, Packing, Var
from ..._vocab import key_name, type_str
from ...errors import YaxRewriteError, where
from .._protocol import Variables, engine
from . import _lora
from ._base import NAME, flax_nnx, is_module, is_module_type


def flat_state(state: Any) -> list[tuple[tuple[str, ...], type, Any]]:
    """``(path, variable type, leaf)`` for every leaf of an nnx state, in
    flattening order; ``path`` is the attribute path plus the variable name."""
    nnx = flax_nnx()
    leaves = jax.tree_util.tree_leaves(state)
    holders = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    if len(holders) != len(leaves):
        raise YaxRewriteError("An nnx state whose variables hold several arrays each is not supported.")
    return [(tuple(key_name(k) for k in kp), type(v), x) for (kp, v), x in zip(holders, leaves)]


def _get(module: Any, scope: Sequence[str]) -> Any:
    for k in scope:
        module = getattr(module, k)
    return module


def _references(root: Any) -> dict[int, list[tuple[Any, str]]]:
    """``id(object) -> [(holder, attribute)]`` for every nnx object in ``root``'s
    graph: a module shared by two attributes is replaced at both."""
    nnx = flax_nnx()
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


def _swap_in(root: Any, old: Any, new: Any, refs: dict[int, list[tuple[Any, str]]]) -> Any:
    """``new`` in place of ``old`` at every attribute holding it; the model after (``new``
    itself where ``old`` is the model: `nnx.Linear` traced as the model, say)."""
    if old is root:
        return new
    for holder, k in refs.get(id(old), []):
        setattr(holder, k, new)
    return root


def _what(x: Any) -> str:
    return type(x).__name__


# -- replace_modules ----------------------------------------------------------------------

def _check_fits(new: Any, node: Mox) -> None:
    """``new`` called like ``node`` was (same method, arguments) returns arrays
    of the node's output shapes and dtypes: checked with ``nnx.eval_shape``."""
    nnx = flax_nnx()
    method = node.method or "__call__"
    if not callable(getattr(new, method, None)):
        raise errors.NnxCannotReplace(
            "no method",
            f"The replacement `{_what(new)}` for {where(node)} has no method `{method}`, which the model "
            "calls. Give a module with that method, or replace only the calls of `__call__`.", node, method)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in node.inputs]

    def call(m: Any, *dyn: Any) -> Any:
        a, k = node.sig.args(dyn)
        return getattr(m, method)(*a, **k)

    try:
        out = nnx.eval_shape(call, nnx.clone(new), *avals)
    except Exception as e:
        raise errors.NotTraceable(_what(new), node, " ".join(map(type_str, node.inputs)), e,
                                  "Try a module whose method takes the inputs the model gives it.") from None
    got = [x for x in jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, nnx.Pytree))
           if isinstance(x, jax.ShapeDtypeStruct)]
    want = node.outputs
    if len(got) != len(want):
        raise errors.WrongCount(_what(new), node, "outputs", len(got), len(want), " ".join(map(type_str, want)))
    for i, (a, b) in enumerate(zip(got, want)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise errors.DoesNotFit(_what(new), node, i, type_str(a), type_str(b))


def _stacked(node: Mox, module: Any) -> bool:
    """Whether the live module holds more than the call saw: layers stacked by
    ``nnx.vmap`` and run by ``nnx.scan`` (one slice per step)."""
    live = [np.shape(x) for x in jax.tree_util.tree_leaves(flax_nnx().state(module))]
    seen = [tuple(a.shape) for a in jax.tree_util.tree_leaves(node.var_tree)]
    return live != seen


def _module_calls(targets: list[Any]) -> list[Mox]:
    """``targets``, each checked to be a call of an nnx module."""
    calls = []
    for n in targets:
        if not isinstance(n, Mox) or n.kind != Kind.MODULE_CALL or not is_module_type(n.module_type):
            raise errors.WrongNodeKind(
                "`replace_modules`", "replaces nnx modules", where(n), "Narrow the pattern to `//module_call[...]`, "
                "or rewrite activations and equations of the MoX with `yax.sub`.", n)
        calls.append(n)
    return calls


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
    make_mox, locate, matches = engine.make_mox, engine.locate, engine.matches
    nnx = flax_nnx()
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
    targets, _ = locate(mox, matches(pattern, mox), "replace_modules")
    calls = _module_calls(targets)
    copy = nnx.clone(model)
    plan = _surgery_plan(mox, calls, copy, repl)
    refs = _references(copy)
    for old, new in plan:
        copy = _swap_in(copy, old, new, refs)
    return copy


def _surgery_plan(mox: Mox, targets: list[Mox], copy: Any, repl: Any) -> list[tuple[Any, Any]]:
    """``(old module, new module)`` in ``copy`` for each matched module, checked against all its calls."""
    nnx = flax_nnx()
    calls: dict[tuple[str, ...], list[Mox]] = {}
    for n in mox.modules():
        if n.kind == Kind.MODULE_CALL and n.scope is not None:
            calls.setdefault(n.scope, []).append(n)
    plan: list[tuple[Any, Any]] = []
    done: set[tuple[str, ...]] = set()
    for n in targets:
        if n.scope in done:
            continue
        done.add(n.scope)
        old = _get(copy, n.scope)
        if _stacked(n, old):
            raise errors.NnxCannotReplace(
                "stacked",
                f"{where(n, start=True)} runs inside a transform over stacked layers (`nnx.scan` or "
                "`nnx.vmap`): the module there holds every layer's variables at once. Replace it by "
                "rebuilding the stack (e.g. with `nnx.vmap` of a factory), not per layer.", n)
        new = nnx.clone(repl) if is_module(repl) else repl(n.path, old)
        if new is old:
            continue
        if not is_module(new):
            raise errors.NnxCannotReplace(
                "not a module",
                f"The factory returned a `{_what(new)}` for {where(n)}; it must return an `nnx.Module` "
                "(or the module it was given, to keep it).", n, _what(new))
        for call in calls.get(n.scope, [n]):  # every call of the module, matched or not
            _check_fits(new, call)
        plan.append((old, new))
    return plan


# -- sub: the state layout -------------------------------------------------------------

def _var(x: Any) -> bool:
    return isinstance(x, Var)


class StateVariables(Variables):
    """The state of an nnx root during a `sub`: where replaced modules'
    variables go, and the new state and graphdef."""

    def __init__(self, root: Mox, params: Any):
        self.root = root
        self.params = params
        self.canon: dict[tuple[str, ...], dict[tuple[str, ...], Var]] = {}
        self.kept: dict[tuple[str, ...], Any] = {}
        self.final: dict[tuple[str, ...], Any] = {}
        self.modules: dict[tuple[str, ...], Any] = {}
        self._old_in: dict[tuple[str, ...], tuple[type, Var]] = {}

    def place(self, sites: list[Any], key: Any, keep: Any = None) -> dict[int, dict[Var, Var]]:
        """One set of variables per replaced module (calls of one module share it)."""
        if keep is not None:
            raise errors.NnxCannotReplace(
                "keep",
                "`keep=` maps variables of linen modules; an nnx replacement keeps the leaves of the same "
                "attribute path, variable type, shape and dtype. Build the replacement with those names.")
        ours = [s for s in sites if s.traced.frontend == NAME]
        for s in sites:
            if s.traced.module is not None and s.traced.frontend != NAME:
                raise errors.ForeignModule(_what(s.traced.module), s.node, s.traced.frontend, NAME, "an nnx state",
                                           "Replace with an nnx module or a function.")
        if not ours:
            return {id(s.node): {} for s in sites}
        self._check(sites)
        (state_vars, *_), _ = self.root.sig.args(self.root.invars)
        old_in = {p: (t, v) for p, t, v in flat_state(state_vars)}
        values = {p: x for p, _, x in flat_state(self.params)}
        if set(values) != set(old_in):
            raise errors.ParamsDoNotFit(
                "`params` is not the state the MoX was traced with: its variables are at other paths.",
                "Pass `state` from `graphdef, state = nnx.split(model)`.")
        self._old_in = old_in
        return {id(s.node): self._assign(s, old_in, values, key) for s in sites}

    def dropped(self) -> set[Var]:
        """The root vars of the replaced modules' variables no replacement keeps."""
        kept = {v for c in self.canon.values() for v in c.values()}
        return {v for p, (_, v) in self._old_in.items()
                if v not in kept and any(p[: len(sc)] == sc for sc in self.canon)}

    def _check(self, sites: list[Any]) -> None:
        if self.params is None:
            raise errors.NeedsParams(
                "The replacement has variables; pass `params=state` (with `graphdef, state = nnx.split(model)`) "
                "so yax can return the new state.", "sub")
        for s in sites:
            if s.traced.module is None:
                raise errors.MixedReplacements("nnx", s.node, f"a `{_what(s.repl)}` ")
            if not isinstance(s.node, Mox) or s.node.kind != Kind.MODULE_CALL or s.node.scope is None:
                raise errors.WrongNodeKind("An nnx module", "can replace module calls", where(s.node),
                                           "Replace activations and equations with functions.", s.node)
        # A module is one object: all its calls change together, so all must be matched.
        errors.PartlyMatchedModule.check(self.root, sites, "nnx", "one object")
        if self.root.graphdef is not None:
            model = flax_nnx().merge(self.root.graphdef, self.params)
            for s in sites:
                try:
                    _get(model, s.node.scope)
                except AttributeError:
                    raise errors.NnxCannotReplace(
                        "not held",
                        f"The replaced call, {where(s.node)}, is an nnx module the model does not hold as an "
                        "attribute: something builds it on each call (a `bridge.ToLinen` inside a linen module), so "
                        "there is no module to swap. Replace the module that builds it, or its activations and "
                        "equations with functions.", s.node) from None

    def _assign(self, s: Any, old_in: dict[tuple[str, ...], tuple[type, Any]],
                values: dict[tuple[str, ...], Any], key: Any) -> dict[Var, Var]:
        scope, t = s.node.scope, s.traced
        paths = [p for p, _, _ in flat_state(t.var_avals)]
        c = self.canon.get(scope)
        lead = tuple(s.stack)
        if c is None:
            # `yax.LoRA`'s adapters draw `lora_a` from `key`, folded with the scope's index (as linen's)
            own = _lora.drawn(t.module, key, len(self.canon), lead if s.chain else ())
            c = self.canon[scope] = {}
            self.modules[scope] = t.module
            for (rel, typ, x), tv in zip(flat_state(t.var_avals), t.root.invars):
                x = own.get(rel, x)
                old = old_in.get(scope + rel)
                shape = (*lead, *tv.shape)
                if old is not None and old[0] is typ and old[1].shape == shape and old[1].dtype == tv.dtype:
                    c[rel], self.kept[scope + rel] = old[1], values[scope + rel]
                elif s.chain:  # a root input of its own, passed down (and stacked per scanned layer)
                    c[rel] = Var(shape, tv.dtype, tv.weak_type)
                    self.kept[scope + rel] = jax.numpy.broadcast_to(x, shape) if lead and rel not in own else x
                else:
                    c[rel], self.kept[scope + rel] = tv, x
        elif list(c) != paths:
            raise errors.SharedVariables(s.node.path)
        vm = {tv: c[rel] for rel, tv in zip(paths, t.root.invars) if c[rel] is not tv}
        for rel, v, tv in zip(paths, t.state_out, t.root.invars):  # the last call's updates win
            if s.chain and v is not tv:
                raise errors.NnxCannotReplace(
                    "updates",
                    f"The replacement `{_what(t.module)}` for {where(s.node)} updates its variable "
                    f"`{'/'.join(rel)}` (batch statistics, an RNG count), but the call runs inside "
                    f"`{s.chain[-1][0].name}`, whose updates yax cannot carry out to the state yet. Replace it "
                    "with a module that only reads its variables, or with a function.", s.node,
                    ("/".join(rel), s.chain[-1][0].name))
            self.final[scope + rel] = vm.get(v, v) if isinstance(v, Var) else v
        return vm

    def finish(self, new: Mox, sites: list[Any]) -> Any:
        if not self.canon:
            new = keep_untouched_state(new, [s.node for s in sites])
            if sites:
                # No nnx model computes what functions were put in: `nnx.merge` of the old graphdef
                # would silently be the unchanged model. The MoX is the model now (docs/nnx.md).
                new = dataclasses.replace(new, origin=None)
            return new if self.params is None else (new, self.params)
        return self._rebuilt(new)

    def _rebuilt(self, new: Mox) -> tuple[Mox, Any]:
        """The new model: the old one with each replaced module swapped at
        every attribute holding it; its state and the root's signature."""
        nnx = flax_nnx()
        if self.root.graphdef is None:
            raise errors.NnxCannotReplace(
                "graphdef gone",
                "This MoX already holds replacements that are not nnx modules, so no nnx model computes it "
                "and nnx modules cannot be put in any more. Put the nnx module replacements in first, then "
                "the functions; save the result with `yax.to_function` and `jax.export`.")
        model = nnx.merge(self.root.graphdef, self.params)
        refs = _references(model)
        for scope, r in self.modules.items():
            model = _swap_in(model, _get(model, scope), nnx.clone(r), refs)
        graphdef, shape = nnx.split(model)
        (state_vars, *rest), kwargs = self.root.sig.args(self.root.invars)
        out, state_out = self.root.sig.results(self.root.outvars)
        old_in = {p: v for p, _, v in flat_state(state_vars)}
        old_out = {p: v for p, _, v in flat_state(state_out)}
        values = {p: x for p, _, x in flat_state(self.params)}
        new_vals, new_in, new_out = [], [], []
        for p, _, _ in flat_state(shape):
            sc = next((sc for sc in self.canon if p[: len(sc)] == sc), None)
            new_vals.append(values[p] if sc is None else self.kept[p])
            new_in.append(old_in[p] if sc is None else self.canon[sc][p[len(sc):]])
            new_out.append(old_out[p] if sc is None else self.final[p])
        td = jax.tree_util.tree_structure(shape)
        new_state = jax.tree_util.tree_unflatten(td, new_vals)
        args = ((jax.tree_util.tree_unflatten(td, new_in), *rest), kwargs)
        ins, invars = Packing.of(args, _var, with_paths=True)
        outs, outvars = Packing.of((out, jax.tree_util.tree_unflatten(td, new_out)), _var)
        new = dataclasses.replace(
            new, invars=tuple(invars), inputs=tuple(invars), outvars=tuple(outvars), outputs=tuple(outvars),
            sig=dataclasses.replace(new.sig, ins=ins, outs=outs), origin=graphdef,
        )
        return new, new_state


def keep_untouched_state(new: Mox, replaced: Sequence[Any]) -> Mox:
    """After functions replaced module calls of an nnx MoX: state updates the
    old calls made (a Dropout's RNG counter, batch statistics) no longer
    happen, so those state outputs become the state inputs, unchanged."""
    inner: set[Var] = set()
    for n in replaced:
        if not isinstance(n, Mox):
            continue
        inner.update(a for a in n.outvars if isinstance(a, Var))
        inner.update(v for c in n.walk() for v in c.outputs)
    (state_in, *_), _ = new.sig.args(new.invars)
    out, state_out = new.sig.results(new.outvars)
    start = {p: v for p, _, v in flat_state(state_in)}
    flat = flat_state(state_out)
    if not any(isinstance(v, Var) and v in inner for _, _, v in flat):
        return new
    fixed = [start[p] if isinstance(v, Var) and v in inner else v for p, _, v in flat]
    td = jax.tree_util.tree_structure(state_out)
    outs, outvars = Packing.of((out, jax.tree_util.tree_unflatten(td, fixed)), _var)
    return dataclasses.replace(new, outvars=tuple(outvars), outputs=tuple(outvars),
                               sig=dataclasses.replace(new.sig, outs=outs))
