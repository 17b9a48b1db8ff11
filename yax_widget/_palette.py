"""The palette: the replacements a session offers by name, which of them fit a node,
and the change a drop of one makes (`yax.sub` with its options, or `yax.mixed_precision`
for a precision policy), with its line of "copy as code"."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import keyword
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

import yax
from yax import Equation, Mox
from yax.errors import BadArgument, NotNodes, UnknownName, WrongType
from yax.internal import frontends, is_decider, is_module, misfit, script_of

from ._code import replacement_code, xpath_for


@dataclasses.dataclass(frozen=True)
class Item:
    """A replacement offered in the palette."""

    name: str
    repl: Any
    code: str | None  #: a Python expression for it; None: the script must define it
    kind: str
    doc: str
    ident: str = "replacement"  #: the variable "copy as code" names it by, when code is None
    options: dict = dataclasses.field(default_factory=dict)  #: `yax.sub`'s options for it (``cast``, ``keep``)

    @property
    def expr(self) -> str:
        return self.code or self.ident


class PartialFit(yax.YaxRewriteError):
    """A replacement dropped on the matches of a query fits some of them, not
    all: nothing was changed. ``fitting`` are the matches it fits (each by
    `misfit`, the drop's own check): ``explorer.substitute(e.fitting, name)``
    replaces just those, as the button the explorer then offers does."""

    def __init__(self, message: str, fitting: list[Any], refused: dict[int, str]):
        super().__init__(message)
        self.fitting = fitting
        self.refused = refused  #: id(node) -> why (`misfit`'s sentence)


@functools.cache
def _script_names() -> frozenset[str]:
    """Names the script "copy as code" writes uses itself: its own, and the aliases of the frontends' modules."""
    return frozenset({"jax", "yax", "mox", "params", "KEY", "jnp", "np",
                      *(alias.split(".")[0] for f in frontends() for _, alias in script_of(f.name).homes)})


def _identifier(name: str, taken: set[str]) -> str:
    """A Python variable name for a replacement registered as ``name``: valid,
    no keyword, builtin or name of the script, and none another one has."""
    base = "_".join(re.findall(r"\w+", name.lower()))
    base = "".join(ch if ("a" + ch).isidentifier() else "_" for ch in base).strip("_") or "replacement"
    if not base.isidentifier():  # it starts with a digit
        base = "r_" + base
    if keyword.iskeyword(base) or keyword.issoftkeyword(base) or hasattr(builtins, base) or base in _script_names():
        base += "_"
    ident, k = base, 2
    while ident in taken:
        ident, k = f"{base}_{k}", k + 1
    return ident


def _gelu_erf(x: Any) -> Any:
    """GELU as x·Φ(x), with the exact normal CDF (erf): PyTorch's and Hugging Face's "gelu"."""
    return jax.nn.gelu(x, approximate=False)


def default_palette() -> list[tuple[str, Any, dict[str, Any]]]:
    """The replacements every explorer offers: ``(name, replacement, add_replacement's options)``."""
    import jax.numpy as jnp

    return [
        ("GELU (tanh)", jax.nn.gelu, {"doc": "GELU's tanh approximation: jax.nn.gelu, flax's nn.gelu, Hugging "
                                             "Face's gelu_new"}),
        ("GELU (erf)", _gelu_erf, {"code": "lambda x: jax.nn.gelu(x, approximate=False)",
                                   "doc": "GELU with the exact erf: PyTorch's nn.GELU() and Hugging Face's \"gelu\""}),
        ("ReLU", jax.nn.relu, {}), ("SiLU", jax.nn.silu, {}), ("tanh", jnp.tanh, {}),
        ("sigmoid", jax.nn.sigmoid, {}), ("identity", jax.nn.identity, {}),
        ("LoRA r=4", yax.LoRA(rank=4), {}),  # Dense, DenseGeneral, Einsum and nnx Linear layers
        ("bfloat16 compute", yax.default_policy,
         {"code": "yax.default_policy", "doc": "PAX's mixed precision, inside the row dropped on: dense-like and "
          "convolution layers compute in bfloat16 (float32 parameters and outputs), norms in float32"}),
    ]


def _within(pattern: str, policy: Mapping[str, Any]) -> dict[str, Any]:
    """``policy`` (a query -> precision policy mapping, `yax.mixed_precision`'s) restricted to the
    calls ``pattern`` selects and the calls inside them."""
    out = {}
    for q, p in policy.items():
        if re.fullmatch(r"//[A-Za-z_][\w.-]*(\[.*\])?", q, re.S) and "|" not in q:  # //module_call[...]
            out[f"({pattern})/descendant-or-self::{q[2:]}"] = p
        else:  # any other query: its nodes that are in the subtrees
            out[f"({pattern})/descendant-or-self::*[count(. | {q}) = count({q})]"] = p
    return out


def _listed(names: list[str], most: int = 3) -> str:
    """``a, b, c and 2 more``: the first ``most`` of ``names``."""
    if len(names) <= most:
        return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
    return f"{', '.join(names[:most])} and {len(names) - most} more"


class Palette:
    """The replacements of one session, by name: registering them (`Session.add_replacement`),
    which fit a node (the fits menu), and what a drop of one makes of a model. Nothing here
    changes a model: `change` returns the new one, and the session's history keeps it."""

    def __init__(self) -> None:
        self.items: dict[str, Item] = {}
        self._fit_cache: dict = {}

    def add(self, name: str, repl: Any, *, code: str | None = None, doc: str | None = None,
            cast: bool = False, keep: Mapping[str, str] | None = None) -> None:
        """Register ``repl`` as ``name`` (`Session.add_replacement` says how), replacing
        one of that name; refuse it, saying why, when `yax.sub` could not take it."""
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise BadArgument("name", "a non-empty string of at most 80 characters", name, "A replacement name")
        if not isinstance(cast, bool) or keep is not None and not (
                isinstance(keep, Mapping) and all(isinstance(x, str) for kv in keep.items() for x in kv)):
            raise yax.YaxInputError(
                f"`cast` is True or False and `keep` maps paths to paths (`{{'params/base/kernel': 'params/kernel'}}`), "
                f"as `yax.sub` takes them, but got cast={str(cast)[:40]!r}, keep={str(keep)[:60]!r}.")
        options = {k: v for k, v in (("cast", cast), ("keep", None if keep is None else dict(keep))) if v}
        kind = ("mox" if isinstance(repl, Mox) else "equation" if isinstance(repl, Equation)
                else "policy" if isinstance(repl, Mapping)
                else "module" if is_module(repl) else "decider" if is_decider(repl) else "function")
        if kind == "policy" and (options or not all(isinstance(q, str) for q in repl)):
            raise yax.YaxInputError(
                f"`{name}` is a mapping, which the palette takes as a mixed-precision policy (queries -> policies, "
                "like `yax.default_policy`): its keys must be XPath strings, and it takes no `cast`/`keep`.")
        if kind == "function" and not callable(repl):
            raise WrongType(name, "a function, a Flax module, a MoX or an Equation (anything `yax.sub` accepts)", repl)
        text = doc if doc is not None else (getattr(repl, "__doc__", None) or "").strip().split("\n")[0]
        if code is None:
            code = replacement_code(repl)
        taken = {i.ident for n, i in self.items.items() if n != name}
        self.items[name] = Item(name, repl, code, kind, text[:200], _identifier(name, taken), options)
        self._fit_cache.clear()

    def shown(self) -> list[dict]:
        """The ``palette`` entry of the session's `state`."""
        return [{"name": i.name, "kind": i.kind, "doc": i.doc} for i in self.items.values()]

    def fits(self, node: Any, mox: Mox, params: Any) -> tuple[list[str], dict[str, str]]:
        """The replacements a drop on ``node`` of ``mox`` (with ``params``) accepts, and why each
        other one is refused."""
        fits, refused = [], {}
        for item in self.items.values():
            # with the explorer's parameters, misfit places variables exactly as the drop's `sub` does
            why = self._policy_misfit(item, node, mox, params) if item.kind == "policy" else misfit(
                item.repl, node, mox, cache=self._fit_cache, params=params, cast=item.options.get("cast", False))
            if why is None:
                fits.append(item.name)
            else:
                refused[item.name] = why
        return fits, refused

    def change(self, target: Any, name: Any, mox: Mox, params: Any, key: Any, step: int,
               query: str) -> tuple[str, str, Mox, Any]:
        """What a drop of the replacement ``name`` on ``target`` makes of ``mox`` (with
        ``params``) as change number ``step`` (`Session.change`): the change's description,
        its code, the new model and its parameters. ``target``: a node, a list of them, an
        XPath, or ``"query"`` for the matches of ``query``. Raises `yax.YaxError` when it
        does not fit (`PartialFit` when it fits only some of an XPath's matches)."""
        item = self.items.get(name) if isinstance(name, str) else None
        if item is None:
            raise UnknownName("replacement", name, list(self.items), "Try `explorer.add_replacement(name, fn)`.")
        if isinstance(target, str):
            pattern = query if target == "query" else target
            if not pattern:
                raise yax.YaxInputError("There is no query to replace the matches of; type one first.")
            found = yax.query(pattern, mox)
            if not isinstance(found, list):
                raise NotNodes(f"the {name} replacement", pattern, found)
            what = f"{len(found)} node(s) selected by {pattern}"
        elif isinstance(target, list):  # some nodes (the matches a drop fits): one change, `sub` checks each
            if not target:
                raise NotNodes(f"the {name} replacement", "", [])
            # `sub` is given the nodes; their XPaths, joined, are for "copy as code" to replay them
            pattern = " | ".join(xpath_for(node, mox) for node in target)
            what = _listed([n.path or n.name for n in target])
        else:
            pattern = xpath_for(target, mox)
            what = f"{target.path or target.name}"
        nodes = None if isinstance(target, str) else target if isinstance(target, list) else [target]
        try:
            new, new_params, code = self._sub(pattern, item, mox, params, key, step, nodes)
        except yax.YaxRewriteError as e:
            if isinstance(target, str):
                # raises when it fits some of the matches
                self._partial_fit(item, found, pattern, mox, params, key, step, e)
            raise
        desc = f"replaced {what} with {name}"
        if item.code is None:
            code = f"# `{item.expr}`: the replacement registered as {name!r}; define it first\n{code}"
        return desc, code, new, new_params

    def _sub(self, pattern: str, item: Item, mox: Mox, params: Any, key: Any,
             step: int, nodes: list[Any] | None = None) -> tuple[Mox, Any, str]:
        """`yax.sub` of ``item`` on ``nodes`` (the nodes in hand: a drop's row) or else on
        ``pattern``'s matches in ``mox`` (with ``params``) as change number ``step`` (new
        variables drawn from ``key`` folded with it): the new model, its parameters, and the
        line of "copy as code" doing it, which selects with ``pattern``."""
        if item.kind == "policy":
            return self._policy(pattern, item, mox, params)
        selected: Any = pattern if nodes is None else nodes
        opts = item.options
        said = "".join(f", {k}={v!r}" for k, v in opts.items())
        if params is not None and item.kind in ("function", "equation"):  # creates no variables
            new, new_params = yax.sub(selected, item.repl, mox, params=params, **opts)
            return new, new_params, f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params{said})"
        if params is not None:
            key = jax.random.fold_in(key, step)  # not made for the others: its first use compiles
            new, new_params = yax.sub(selected, item.repl, mox, params=params, key=key, **opts)
            return new, new_params, (f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params, "
                                     f"key=jax.random.fold_in(KEY, {step}){said})")
        return (yax.sub(selected, item.repl, mox, **opts), None,
                f"mox = yax.sub({pattern!r}, {item.expr}, mox{said})")

    def _policy(self, pattern: str, item: Item, mox: Mox, params: Any) -> tuple[Mox, Any, str]:
        """The mixed-precision policy ``item`` applied to the calls ``pattern`` selects and those
        inside them: the new model, its parameters and the line of "copy as code"."""
        policy = _within(pattern, item.repl)
        try:
            done = yax.mixed_precision(mox, policy, params=params)
        except yax.YaxQueryError as e:  # a query of the policy: a rewrite that does not fit, to the user
            raise yax.YaxRewriteError(f"The policy {item.name!r} could not be applied: {e}") from None
        new, new_params = done if params is not None else (done, None)
        if new is mox:
            raise yax.YaxRewriteError(  # its own sentence (as `NothingToRewrite` it read "The pattern `…` matched no node")
                f"{item.name} changes nothing there: no call inside it computes in another dtype than the policy "
                "asks (dense-like and convolution layers, norms, for `yax.default_policy`). Drop it on a row "
                "holding such layers, or on the whole model.")
        args = f"{{{', '.join(f'{q!r}: {p!r}' for q, p in policy.items())}}}"
        return new, new_params, (f"mox, params = yax.mixed_precision(mox, {args}, params=params)"
                                 if params is not None else f"mox = yax.mixed_precision(mox, {args})")

    def _policy_misfit(self, item: Item, node: Any, mox: Mox, params: Any) -> str | None:
        """Why the policy ``item`` cannot be dropped on ``node``, or None: the drop itself on abstract
        copies of the parameters (nothing is computed), as `yax.rewrite.misfit` does for `sub`."""
        abstract = None if params is None else jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), params)
        try:
            self._policy(xpath_for(node, mox), item, mox, abstract)
        except yax.YaxError as e:
            return yax.errors.message(e)  # a reason, without the docs pointer, as `misfit` gives it
        return None

    def _partial_fit(self, item: Item, found: list[Any], pattern: str, mox: Mox, params: Any, key: Any,
                     step: int, error: yax.YaxRewriteError) -> None:
        """Raise `PartialFit` when ``item`` fits some, not all, of the nodes
        ``pattern`` found (each checked alone, as the fits menu does, and the
        ones that fit replaced together, as the offer's drop does: never is
        an offer refused); return otherwise (``error`` is the one to report)."""
        refused: dict[int, str] = {}
        fitting = []
        for node in found:
            why = misfit(item.repl, node, mox, cache=self._fit_cache, params=params)
            if why is None:
                fitting.append(node)
            else:
                refused[id(node)] = why
        if not fitting or not refused:
            return
        try:
            self._sub(" | ".join(xpath_for(node, mox) for node in fitting), item, mox, params, key, step, fitting)
        except yax.YaxError:
            return
        groups: dict[str, list[Any]] = {}  # the refused matches by type, in document order
        for node in found:
            if id(node) in refused:
                groups.setdefault(getattr(node, "type", None) or node.name, []).append(node)
        done = "Nothing was changed."
        parts = []
        for kind, nodes in list(groups.items())[:2]:  # each reason is a sentence or two: the first two types
            paths = list(dict.fromkeys(f"`{n.path or n.name}`" for n in nodes))  # a module called twice: once
            why = refused[id(nodes[0])].removesuffix(done).rstrip()
            parts.append(f"The `{kind}` at {paths[0]} is refused: {why}" if len(nodes) == 1 else
                         f"The {len(nodes)} `{kind}` matches ({_listed(paths)}) are refused; at {paths[0]}: {why}")
        rest = [f"{len(nodes)} `{kind}`" for kind, nodes in list(groups.items())[2:]]
        if rest:
            parts.append(f"Refused too: {_listed(rest, 6)} (drop it on one of their rows to see why).")
        k, n = len(fitting), len(found)
        raise PartialFit(
            f"{item.name} fits {k} of the {n} matches of `{pattern}`. {' '.join(parts)} Replace just the "
            f"{k} that fit{'s' if k == 1 else ''} (the explorer offers it with a button; in Python, "
            f"`explorer.substitute(error.fitting, {item.name!r})`), or narrow the query. {done}",
            fitting, refused) from error

    def forget(self) -> None:
        """Let go of what the fit checks keep (the session closes)."""
        self._fit_cache = {}
