"""The explorer's session: everything the explorer does, in plain Python.

A `Session` holds the history of changes, the registered replacements, the
query and its matches, the named input batches, the worker thread that
compiles and compares, and the values pane (`_values.Inspector`). It imports
no widget library, so it runs and is tested without a front-end: the
`Explorer` widget (``_explorer``) is a thin layer that mirrors `Session.state`
into synced traits and hands the front-end's requests (``_protocol``) to it.

What the front-end renders from is `Session.state`, a dict of plain values
built by ``_payloads``; each change to it is told to ``on_change`` (the widget
copies it into its traits). A command either changes the state as a whole or
raises a `yax.YaxError` and changes nothing; one that fails otherwise or is
interrupted (a KeyboardInterrupt) while it shows its change puts back what it
changed (`Session.all_or_nothing`), so the front-end never shows a half-made one.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import itertools
import keyword
import pathlib
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

import yax
from yax import Equation, Mox
from yax.errors import NothingToRewrite
from yax.internal import (
    CALL_KINDS,
    Measured,
    compare_gradients,
    compare_measured,
    frontends,
    is_decider,
    is_module,
    measure,
    misfit,
    node_ids,
    paired_outputs,
    trace_target,
    variables_argument,
    view,
)

from . import _payloads
from ._code import replacement_code, xpath_for
from ._export import input_names
from ._targets import hf_call, opening_lines, target_kind
from ._values import EXAMPLE, Inspector, as_args, check_fits, same_inputs


@dataclasses.dataclass(frozen=True)
class Change:
    """One step of the history: what was done, the code doing it, and the
    model after it."""

    description: str
    code: str
    mox: Mox
    params: Any


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


_serials = itertools.count()


@dataclasses.dataclass(frozen=True, eq=False)
class NamedBatch:
    """A batch of inputs and its name: the model's arguments (its parameters
    first) and keywords. Whatever is measured on a batch is kept under its
    ``serial``, never its name: a batch added again under the same name is a new
    `NamedBatch`, so it can never be served the numbers of the one it replaces."""

    name: str
    args: tuple
    kwargs: dict
    serial: int = dataclasses.field(default_factory=lambda: next(_serials))


class SessionClosed(yax.YaxInputError):
    """A command reached an explorer after `close()`. Its history stays
    readable; open a new explorer to change or compare the model again."""


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
                      *(alias.split(".")[0] for f in frontends() for _, alias in f.code_homes)})


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


#: What values, colouring, the NaN search and the comparison say for a model opened with abstract parameters.
NO_VALUES = ("Values, colouring, the NaN search and the comparison need concrete parameters: this explorer was "
             "opened with abstract ones (`jax.ShapeDtypeStruct`), which give the structure only; open it with "
             "the real weights to see numbers.")

#: What `Session.state` holds at first: the keys the front-end renders from (docs/widget.md, "Traits").
INITIAL_STATE: dict[str, Any] = {
    "tree": {}, "original_tree": {}, "query": "", "query_error": "", "matches": [], "query_result": {},
    "match_owners": {}, "palette": [], "history": {}, "diff": {}, "comparison": {},
    "status": {"busy": False, "message": ""}, "compare_base": "original", "references": [],
    "batches": {}, "values": {}, "overlay": {}, "scalars": [],
}


class Session:
    """The explorer without a widget: history, substitutions, comparison, batches,
    values and export. `yax_widget.Explorer` takes the same arguments and shows it.

    Args:
      target: what to explore, and the example inputs and options after it (``key``,
        ``batches``, ``grad_of`` and keyword inputs), as for `Explorer`.
      warm: measure the original on the example inputs in the worker right away.
      on_change: called with the entries of `state` that changed, after each change.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from yax_widget import Session
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> s = Session(m, m.init(jax.random.key(0), x), x)
      >>> s.substitute('//activation', "GELU (tanh)")
      'replaced 1 node(s) selected by //activation with GELU (tanh)'
      >>> s.comparison.label(s.comparison.first_divergence), s.state["history"]["index"]
      ('Sequential/relu (now gelu)', 1)
      >>> s.close()
    """

    def __init__(self, target: Any, *args: Any, key: Any = None, warm: bool = False, batches: Any = None,
                 grad_of: Any = None, on_change: Callable[[dict[str, Any]], None] | None = None,
                 static_argnums: Any = None, static_argnames: Any = None, **kwargs: Any):
        if grad_of is not None and not callable(grad_of):
            raise yax.YaxInputError(
                f"`grad_of` must be a function of what the model returns giving a scalar (a loss), but got a "
                f"`{type(grad_of).__name__}`. Try `grad_of=lambda out: out.sum()`.")
        self.state: dict[str, Any] = dict(INITIAL_STATE)
        self._version = 0  # how many times `state` changed, the status line aside (`version`)
        #: Held while a request from the front-end runs (`_protocol.answer`): requests reaching the
        #: session from several threads run one at a time, each seeing and leaving it whole.
        self.lock = threading.RLock()
        # What the worker keeps of its measurements is stored under this lock, and only while the
        # session is open: `close` lets go of it even when a measurement ends after it.
        self._held = threading.Lock()
        self._on_change = on_change
        self._grad_of = grad_of
        given = target
        if isinstance(target, Mox):
            if target.kind != "root":
                raise yax.YaxInputError(
                    f"`Explorer` expected a root MoX from `yax.make_mox`, but got a `{target.kind}` node. "
                    "Try `Explorer(model, variables, batch)`.")
            if static_argnums is not None or static_argnames is not None:
                raise yax.YaxInputError(
                    "`static_argnums`/`static_argnames` say how to trace a model, but `Explorer` was given a "
                    "MoX, traced already. Pass them to `yax.make_mox`, or give `Explorer` the model.")
            mox = target
        else:  # an nnx module's MoX runs (state, *args) -> (out, new_state): docs/nnx.md
            _check_static(static_argnums, static_argnames)
            target, args = hf_call(target, args)  # a Hugging Face wrapper: its `params` become an argument
            mox, args = trace_target(target, *args, static_argnums=static_argnums,
                                     static_argnames=static_argnames, **kwargs)
        #: the static options as `make_mox` takes them, for "copy as code" (``", static_argnums=(1,)"``)
        self._static = "".join(f", {k}={v!r}" for k, v in (("static_argnums", static_argnums),
                                                             ("static_argnames", static_argnames)) if v is not None)
        self._in_use = NamedBatch(EXAMPLE, args, kwargs)  # the batch the values and the comparison use
        # opened with `jax.ShapeDtypeStruct` leaves (a 70B model planned before any weight exists):
        # the structure works (tree, queries, rewrites, history, code); values need arrays
        self.abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves((args, kwargs)))
        self.target_kind = target_kind(given, target, mox)  # how "copy as code" makes `mox` again
        self.names: list[str] | None = None  # the expressions `%yax` (or Explorer's caller) gave: the script's names
        self.names_given_to = "%yax"  # which: `%yax` or "Explorer(...)"
        params = variables_argument(mox, args)  # the variables or state `yax.sub` reconciles, or None
        self.has_params = params is not None
        # what the positional inputs are called in the model's own signature: the export's README names them so
        self.input_names = input_names(given, len(args) - self.has_params, self.has_params)
        self._key = jax.random.key(0) if key is None else key
        self._states: list[Change] = [Change("original", "", mox, params)]
        self._index = 0
        self._items: dict[str, Item] = {}
        self._selection: list[Any] = []
        self._fit_cache: dict = {}
        self.comparison: yax.Comparison | None = None
        #: with a `yax.Reference` as the base: the original's (and the current model's) comparisons with it
        self.comparisons: yax.Comparisons | None = None
        self._references: dict[str, tuple[yax.Reference, Any]] = {}  # name -> (reference, its `names`)
        # What was measured, each under the serial of the batch it was measured on (`NamedBatch`):
        # the original's values on each batch used so far,
        self._refs: dict[int, Measured] = {}
        # a previous state's, for "previous" (the last one measured),
        self._base_values: tuple[Mox, int, Measured] | None = None
        # and the current model's, as its comparison measured it: the values pane and colouring read it.
        self._current: tuple[Mox, int, Measured] | None = None
        self._saved: tuple | None = None  # what `all_or_nothing` puts back if the command under way fails
        # One worker runs the models (in order: the original's measurement, then each change's).
        # XLA compiles without holding the GIL, so the tree is rebuilt meanwhile on this thread.
        # It starts on first use and stops with `close()` (or when the session is collected).
        self._pool: ThreadPoolExecutor | None = None
        self._warmer: Future | None = None
        self._closed = False
        self._inputs: dict[str, NamedBatch] = {}  # the named batches
        self.inspector = Inspector(self)
        self._set(scalars=self.inspector.scalars())  # what the gradient colouring may differentiate
        self._init_batches(batches)
        for name, repl, options in default_palette():
            self.add_replacement(name, repl, **options)
        self._set(original_tree=_payloads.tree(mox, 0))
        self._refresh()
        if warm and (args or kwargs) and not self.abstract:
            # Measure the original (compile, run, fetch its outputs and module boundaries) while
            # the user looks at the tree: each substitution then runs only the modified model.
            # The worker is no daemon: a script that exits meanwhile waits for XLA rather than
            # aborting in it.
            self._warmer = self._worker().submit(self._warm, self._in_use)

    # -- state -----------------------------------------------------------------------------

    def _set(self, **changes: Any) -> None:
        """Change entries of `state` together and tell ``on_change``."""
        self.state.update(changes)
        if changes.keys() - {"status"}:
            self._version += 1
        if self._on_change is not None:
            self._on_change(changes)

    def status(self, message: str, busy: bool = False) -> None:
        """Show ``message`` in the status line."""
        self._set(status={"busy": busy, "message": message})

    def show(self, **changes: Any) -> None:
        """Set the values pane's entries of `state` (``values``, ``overlay``): for the `Inspector`."""
        if set(changes) - {"values", "overlay"}:
            raise ValueError(f"`show` sets the values pane's state only, not {sorted(changes)}.")
        self._set(**changes)

    # -- reading ---------------------------------------------------------------------------

    @property
    def mox(self) -> Mox:
        """The current MoX."""
        return self._states[self._index].mox

    @property
    def params(self) -> Any:
        """The current parameters (first positional argument), or ``None``."""
        return self._states[self._index].params

    @property
    def original(self) -> Mox:
        """The MoX the explorer was opened with."""
        return self._states[0].mox

    @property
    def history(self) -> list[Change]:
        """The applied changes, oldest first (undone ones are not listed)."""
        return self._states[1:self._index + 1]

    @property
    def states(self) -> tuple[Change, ...]:
        """Every state of the history, the original first and undone ones included."""
        return tuple(self._states)

    @property
    def index(self) -> int:
        """Which of `states` is current."""
        return self._index

    @property
    def selection(self) -> list[Any]:
        """The nodes the current query selects."""
        return list(self._selection)

    @property
    def items(self) -> Mapping[str, Item]:
        """The registered replacements, by name."""
        return dict(self._items)

    @property
    def batch(self) -> str:
        """The name of the batch the values, colouring and comparison use."""
        return self._in_use.name

    @property
    def batch_key(self) -> int:
        """What the values measured on the batch in use are kept under: its `NamedBatch.serial`,
        which no other batch has, even one added again under the same name."""
        return self._in_use.serial

    @property
    def args(self) -> tuple:
        """The positional inputs of the batch in use, the parameters first."""
        return self._in_use.args

    @property
    def kwargs(self) -> dict:
        """The keyword inputs of the batch in use."""
        return self._in_use.kwargs

    @property
    def _reference(self) -> Measured | None:
        """The original's values on the batch in use, once measured."""
        return self._refs.get(self._in_use.serial)

    @property
    def batches(self) -> list[str]:
        """The names of the input batches."""
        return list(self._inputs)

    @property
    def version(self) -> int:
        """A number that changes whenever `state` does (the status line aside): what the
        front-end shows is the same as long as it is (a snapshot of it is written once)."""
        return self._version

    @property
    def closed(self) -> bool:
        """Whether `close` was called: commands are refused, the history stays readable."""
        return self._closed

    def call_args(self) -> tuple[tuple, dict]:
        """The current model's arguments on the batch in use (its parameters first)."""
        if not self.args and not self.kwargs:
            raise yax.YaxInputError("The explorer was opened without example inputs, so the model has no values "
                                    "to show. Open it as `Explorer(model, variables, batch)`.")
        if self.abstract:
            raise yax.YaxInputError(NO_VALUES)
        return self._args_of(self.params, self._in_use), self.kwargs

    def _args_of(self, params: Any, batch: NamedBatch) -> tuple:
        """The positional arguments of a model with ``params`` on ``batch``."""
        return (params, *batch.args[1:]) if self.has_params else batch.args

    def node(self, rid: Any, kinds: tuple = (*CALL_KINDS, "equation"), field: str = "id") -> Any:
        """The node of the current model whose row id is ``rid``, of one of ``kinds``."""
        nodes = view(self.mox).nodes
        if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < len(nodes):
            raise yax.YaxInputError(f"`{field}` must be the id of a node of the current model, not {str(rid)[:40]!r}.")
        node = nodes[rid]
        kind = "equation" if isinstance(node, Equation) else node.kind
        if kind not in kinds:
            raise yax.YaxInputError(f"Node {rid} is a `{kind}` node, which cannot be used here.")
        return node

    def fits(self, node: Any) -> tuple[list[str], dict[str, str]]:
        """The replacements a drop on ``node`` accepts, and why each other one is refused."""
        fits, refused = [], {}
        for item in self._items.values():
            # with the explorer's parameters, misfit places variables exactly as the drop's `sub` does
            why = self._policy_misfit(item, node) if item.kind == "policy" else misfit(
                item.repl, node, self.mox, cache=self._fit_cache, params=self.params, cast=item.options.get("cast", False))
            if why is None:
                fits.append(item.name)
            else:
                refused[item.name] = why
        return fits, refused

    # -- commands --------------------------------------------------------------------------

    def check_open(self) -> None:
        """Raise `SessionClosed` after `close`: what every command checks first."""
        if self._closed:
            raise SessionClosed("This explorer is closed, so it changes, compares and computes nothing more; "
                                "its history stays readable. Open a new `Explorer` to go on.")

    def add_replacement(self, name: str, repl: Any, *, code: str | None = None, doc: str | None = None,
                        cast: bool = False, keep: Mapping[str, str] | None = None) -> None:
        """Offer ``repl`` (anything `yax.sub` accepts) in the palette as ``name``.
        ``code`` is the Python expression "copy as code" writes for it; ``cast`` and
        ``keep`` are `yax.sub`'s options, used by each drop (``cast=True``: a
        replacement computing in another dtype, its outputs cast back). A mapping
        from queries to precision policies (`yax.default_policy`) is a mixed-precision
        policy: a drop applies it (`yax.mixed_precision`) to the calls inside the row."""
        self.check_open()
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise yax.YaxInputError(f"A replacement name must be a non-empty string of at most 80 characters, "
                                    f"not {name!r}.")
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
            raise yax.YaxInputError(
                f"`{name}` must be a function, a Flax module, a MoX or an Equation (anything `yax.sub` "
                f"accepts), but it is a `{type(repl).__name__}`.")
        text = doc if doc is not None else (getattr(repl, "__doc__", None) or "").strip().split("\n")[0]
        if code is None:
            code = replacement_code(repl)
        taken = {i.ident for n, i in self._items.items() if n != name}
        self._items[name] = Item(name, repl, code, kind, text[:200], _identifier(name, taken), options)
        self._fit_cache.clear()
        self._set(palette=[{"name": i.name, "kind": i.kind, "doc": i.doc} for i in self._items.values()])

    def query(self, xpath: str) -> list[Any]:
        """Run ``xpath`` on the current MoX, highlight the matches and return them
        (`yax.query` semantics; non-node results are returned as they are and
        highlight nothing). A query that fails raises and changes nothing; an
        empty one clears the highlight."""
        self.check_open()
        if not isinstance(xpath, str):
            raise yax.YaxInputError(f"A query is an XPath string, not a `{type(xpath).__name__}`.")
        if not xpath.strip():
            self._selection = []
            self._set(query=xpath, query_error="", matches=[], query_result={}, match_owners={})
            return []
        res, changes = self._run_query(xpath)
        self._set(query=xpath, **changes)
        return res

    def _run_query(self, xpath: str) -> tuple[Any, dict[str, Any]]:
        """``xpath``'s result on the current model and the state showing it (raises on a failure)."""
        res = yax.query(xpath, self.mox)
        ids = node_ids(self.mox)
        selection = [n for n in res if id(n) in ids] if isinstance(res, list) else []
        owners = _payloads.owners(self.mox)
        matches = [ids[id(n)] for n in selection]
        changes = {"query_error": "", "matches": matches,
                   "match_owners": {str(i): owners[i] for i in matches if i in owners},
                   "query_result": _payloads.query_result(xpath, res, len(matches), self.mox)}
        self._selection = selection
        return res, changes

    def substitute(self, target: Any, name: str) -> str:
        """Replace ``target`` (a node of the current MoX, a list of them, an XPath,
        or ``"query"`` for the current query's matches) with the replacement
        registered as ``name``, in one change; compare with the original.
        Returns the change's description. Raises `yax.YaxRewriteError` and
        changes nothing when it does not fit (`PartialFit` when it fits only
        some of an XPath's matches: its ``fitting`` are those)."""
        self.check_open()
        change = self.change(target, name)
        self._move([*self._states[:self._index + 1], change], self._index + 1)
        return change.description

    def change(self, target: Any, name: str) -> Change:
        """The change `substitute` makes to the current model, not applied yet (no
        comparison): what a drop does, so what the fits menu must predict. Raises
        `yax.YaxError` when it does not fit."""
        item = self._items.get(name) if isinstance(name, str) else None
        if item is None:
            raise yax.YaxInputError(f"No replacement is registered as {name!r}; registered: "
                                    f"{', '.join(self._items)}. Try `explorer.add_replacement(name, fn)`.")
        if isinstance(target, str):
            pattern = self.state["query"] if target == "query" else target
            if not pattern:
                raise yax.YaxInputError("There is no query to replace the matches of; type one first.")
            found = yax.query(pattern, self.mox)
            if not isinstance(found, list):
                raise yax.YaxInputError(
                    f"`{pattern}` gives the {type(found).__name__} {found!r}, not nodes, so there is nothing for "
                    f"{name} to replace. Select nodes, such as `//activation`.")
            what = f"{len(found)} node(s) selected by {pattern}"
        elif isinstance(target, list):  # some nodes (the matches a drop fits): one change, `sub` checks each
            if not target:
                raise yax.YaxInputError(f"There are no nodes to replace with {name}; give at least one.")
            # the XPath of each node, joined: "copy as code" replays exactly these nodes
            pattern = " | ".join(xpath_for(node, self.mox) for node in target)
            what = _listed([n.path or n.name for n in target])
        else:
            pattern = xpath_for(target, self.mox)
            what = f"{target.path or target.name}"
        step = len(self.history) + 1
        try:
            new, new_params, code = self._sub(pattern, item, step)
        except yax.YaxRewriteError as e:
            if isinstance(target, str):
                self._partial_fit(item, found, pattern, step, e)  # raises when it fits some of the matches
            raise
        desc = f"replaced {what} with {name}"
        if item.code is None:
            code = f"# `{item.expr}`: the replacement registered as {name!r}; define it first\n{code}"
        return Change(desc, code, new, new_params)

    def _sub(self, pattern: str, item: Item, step: int) -> tuple[Mox, Any, str]:
        """`yax.sub` of ``item`` on ``pattern`` as change number ``step``: the new
        model, its parameters, and the line of "copy as code" doing it."""
        if item.kind == "policy":
            return self._policy(pattern, item, self.params)
        opts = item.options
        said = "".join(f", {k}={v!r}" for k, v in opts.items())
        if self.params is not None and item.kind in ("function", "equation"):  # creates no variables
            new, new_params = yax.sub(pattern, item.repl, self.mox, params=self.params, **opts)
            return new, new_params, f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params{said})"
        if self.params is not None:
            key = jax.random.fold_in(self._key, step)  # not made for the others: its first use compiles
            new, new_params = yax.sub(pattern, item.repl, self.mox, params=self.params, key=key, **opts)
            return new, new_params, (f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params, "
                                     f"key=jax.random.fold_in(KEY, {step}){said})")
        return (yax.sub(pattern, item.repl, self.mox, **opts), None,
                f"mox = yax.sub({pattern!r}, {item.expr}, mox{said})")

    def _policy(self, pattern: str, item: Item, params: Any) -> tuple[Mox, Any, str]:
        """The mixed-precision policy ``item`` applied to the calls ``pattern`` selects and those
        inside them: the new model, its parameters and the line of "copy as code"."""
        policy = _within(pattern, item.repl)
        try:
            done = yax.mixed_precision(self.mox, policy, params=params)
        except yax.YaxQueryError as e:  # a query of the policy: a rewrite that does not fit, to the user
            raise yax.YaxRewriteError(f"The policy {item.name!r} could not be applied: {e}") from None
        new, new_params = done if params is not None else (done, None)
        if new is self.mox:
            raise NothingToRewrite(
                f"{item.name} changes nothing there: no call inside it computes in another dtype than the policy "
                "asks (dense-like and convolution layers, norms, for `yax.default_policy`). Drop it on a row "
                "holding such layers, or on the whole model.")
        args = f"{{{', '.join(f'{q!r}: {p!r}' for q, p in policy.items())}}}"
        return new, new_params, (f"mox, params = yax.mixed_precision(mox, {args}, params=params)"
                                 if params is not None else f"mox = yax.mixed_precision(mox, {args})")

    def _policy_misfit(self, item: Item, node: Any) -> str | None:
        """Why the policy ``item`` cannot be dropped on ``node``, or None: the drop itself on abstract
        copies of the parameters (nothing is computed), as `yax.rewrite.misfit` does for `sub`."""
        abstract = None if self.params is None else jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), self.params)
        try:
            self._policy(xpath_for(node, self.mox), item, abstract)
        except yax.YaxError as e:
            return str(e)
        return None

    def _partial_fit(self, item: Item, found: list[Any], pattern: str, step: int,
                     error: yax.YaxRewriteError) -> None:
        """Raise `PartialFit` when ``item`` fits some, not all, of the nodes
        ``pattern`` found (each checked alone, as the fits menu does, and the
        ones that fit replaced together, as the offer's drop does: never is
        an offer refused); return otherwise (``error`` is the one to report)."""
        refused: dict[int, str] = {}
        fitting = []
        for node in found:
            why = misfit(item.repl, node, self.mox, cache=self._fit_cache, params=self.params)
            if why is None:
                fitting.append(node)
            else:
                refused[id(node)] = why
        if not fitting or not refused:
            return
        try:
            self._sub(" | ".join(xpath_for(node, self.mox) for node in fitting), item, step)
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

    def undo(self) -> None:
        """Go back one change (nothing happens at the original)."""
        self.check_open()
        if self._index > 0:
            self._move(self._states, self._index - 1)

    def redo(self) -> None:
        """Re-apply the change last undone (nothing happens at the newest)."""
        self.check_open()
        if self._index + 1 < len(self._states):
            self._move(self._states, self._index + 1)

    def goto(self, index: int) -> None:
        """Make state ``index`` of the history current (0: the original; the
        changes after it stay, to redo), as a click on a history item does."""
        self.check_open()
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self._states):
            raise yax.YaxInputError(f"`goto` takes a state of the history, 0 (the original) to "
                                    f"{len(self._states) - 1}, not {index!r}.")
        if index != self._index:
            self._move(self._states, index)

    def compare_with(self, base: str) -> None:
        """Compare the current model with ``"original"`` (the default), with
        ``"previous"`` (the state just before it in the history, so the
        comparison shows what the last change alone did), or with a reference
        added by `add_reference`, by its name: then the original and the states
        of the history up to the current one (the last few) are each compared with
        it (`yax.compare_all`), one column each.
        Compares again now."""
        self.check_open()
        if base not in ("original", "previous") and base not in self._references:
            refs = "".join(f", \"{n}\"" for n in self._references)
            raise yax.YaxInputError(f"`compare_with` takes \"original\", \"previous\"{refs} (a reference added with "
                                    f"`add_reference`), not {str(base)[:40]!r}.")
        with self.all_or_nothing():
            self._set(compare_base=base)
            self._finish_compare(self._start_compare())

    def add_reference(self, reference: yax.Reference, name: str | None = None, names: Any = None) -> str:
        """Add a recorded run of another implementation (`yax.Reference`: the PyTorch
        original of a port, another checkpoint's run) to compare with, under ``name``
        (default: its source); ``names`` maps its module names where they differ, as in
        `yax.compare`. ``compare_with(name)`` compares with it. It was recorded on some
        inputs: compare on the batch of the same inputs. Returns the name."""
        self.check_open()
        if not isinstance(reference, yax.Reference):
            raise yax.YaxInputError(f"`add_reference` takes a `yax.Reference` (recorded with `Reference.from_torch`, "
                                    f"or loaded with `Reference.load`), not a `{type(reference).__name__}`.")
        name = str(name or reference.source or "reference")
        if name in ("original", "previous"):
            raise yax.YaxInputError(f"A reference cannot be called \"{name}\": that names a state of the history. "
                                    f"Pass another `name`.")
        self._references[name] = (reference, names)
        self._set(references=list(self._references))
        return name

    def _move(self, states: list[Change], index: int) -> None:
        """Make ``states[index]`` current and show it (`all_or_nothing`)."""
        with self.all_or_nothing():
            self._states, self._index = states, index
            self._refresh()

    @contextlib.contextmanager
    def all_or_nothing(self) -> Iterator[None]:
        """Make the changes of a command as a whole: if it fails or is interrupted
        (a KeyboardInterrupt too) before it is done, the explorer is put back as it
        was (the model, the batches and the one in use, the query's selection, the
        comparison, what the values pane shows and the whole `state`, the status
        included), so the front-end's error reply is true and nothing half-changed
        is shown. What was measured meanwhile stays cached: it is kept under the
        model and batch it was measured on. Inside another command, that one puts
        back."""
        if self._saved is not None:
            yield
            return
        saved = self._saved = (self._states, self._index, dict(self._inputs), self._in_use, self._selection,
                               self.comparison, self.comparisons, self._current, self.inspector.active,
                               dict(self.state))
        try:
            yield
        except BaseException:
            (self._states, self._index, self._inputs, self._in_use, self._selection, self.comparison,
             self.comparisons, self._current, self.inspector.active, state) = saved
            changed = {k: v for k, v in state.items() if self.state.get(k) is not v}
            self.state.update(state)
            self._version += 1
            if changed and self._on_change is not None:
                try:
                    self._on_change(changed)
                except Exception:  # the first failure is the one to report
                    pass
            raise
        finally:
            self._saved = None

    def export(self, stem: str | pathlib.Path = "yax_model", *, overwrite: bool = False) -> list[str]:
        """Save the current model to run without yax (`Explorer.export`). Refuses to
        replace existing files unless ``overwrite``."""
        self.check_open()
        self._check_concrete_for_export()
        from ._export import export

        return export(self, stem, overwrite=overwrite)["files"]

    def _check_concrete_for_export(self) -> None:
        if self.abstract:
            raise yax.YaxInputError(
                "Export writes the model's parameters beside its program, but this explorer was opened with "
                "abstract ones (`jax.ShapeDtypeStruct`); open it with the real weights to export.")

    def export_next(self) -> dict:
        """The Export button: write ``yax_model_step{K}`` (K: the current step) in the
        working directory, with ``_2``, ``_3``… added when files of that name exist
        (none is replaced). Returns the files and their sizes."""
        self.check_open()
        self._check_concrete_for_export()
        from ._export import export, taken

        stem, k = f"yax_model_step{self._index}", 2
        while taken(pathlib.Path(stem)):
            stem, k = f"yax_model_step{self._index}_{k}", k + 1
        reply = export(self, stem)
        self.status("exported to " + ", ".join(
            f"{f} ({b / 2**20:.1f} MiB)" for f, b in zip(reply["files"], reply["bytes"])))
        return reply

    def code(self) -> str:
        """The `yax.sub` calls that turn the original into the current model,
        as a script fragment (``mox`` and ``params`` are the original's)."""
        lines = [c.code for c in self.history]
        if not lines:
            return "# no changes: the model is the original"
        head = ["import jax", "import yax", "",
                *opening_lines(self.target_kind, self.names, len(self.args), self.kwargs, self.has_params,
                               self._static, self.names_given_to), ""]
        if any("KEY" in line for line in lines):
            head.insert(2, f"KEY = {_key_code(self._key)}")
        return "\n".join(head + lines)

    def values(self, target: Any) -> dict[str, Any]:
        """Statistics of the outputs of ``target`` on the batch in use (`Explorer.values`)."""
        self.check_open()
        return self.inspector.values(target)

    def close(self) -> None:
        """Stop the worker thread and let go of the measured values. The history
        stays readable; every later command is refused (`SessionClosed`). A
        measurement the worker is making meanwhile ends, and is not kept."""
        with self._held:
            self._closed = True
            self._fit_cache, self._base_values, self._refs, self._current = {}, None, {}, None
        pool, self._pool = self._pool, None
        if pool is not None:
            _stop(pool)
        self.inspector.clear()

    # -- batches ---------------------------------------------------------------------------

    def _init_batches(self, batches: Mapping[str, Any] | None) -> None:
        if batches is not None and not isinstance(batches, Mapping):
            raise yax.YaxInputError(
                f"`batches` must map names to inputs, such as `{{'clean': x, 'corrupt': y}}`, but got a "
                f"`{type(batches).__name__}`.")
        example = self.args[1:] if self.has_params else self.args
        given = dict(batches or {})
        same = next((k for k, v in given.items() if same_inputs(as_args(v, len(example)), example)), None)
        if same is None and (self.args or self.kwargs):
            self._inputs[EXAMPLE] = self._in_use
        for name, v in given.items():
            self.add_batch(name, *as_args(v, len(example)))
        self._in_use = self._inputs.get(same or EXAMPLE, next(iter(self._inputs.values()), self._in_use))
        self._sync_batches()

    def add_batch(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Offer the inputs ``args`` (after the parameters, when the model has
        them) and ``kwargs`` (the example's, where not given) as the batch
        ``name`` (`Explorer.add_batch`). A batch of that name is replaced; when
        it is the one in use, the comparison and the values show the new one."""
        self.check_open()
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise yax.YaxInputError(f"A batch name must be a non-empty string of at most 80 characters, not {name!r}.")
        head = self.args[:1] if self.has_params else ()
        new = NamedBatch(name, (*head, *args), {**self.kwargs, **kwargs})
        check_fits(name, (self.args, self.kwargs), (new.args, new.kwargs))
        old = self._inputs.get(name)
        with self.all_or_nothing():
            self._inputs[name] = new
            if old is not None and old is self._in_use:
                self._show_batch(new)
            else:
                self._sync_batches()
        if old is not None:
            self._refs.pop(old.serial, None)  # nothing asks for the values measured on it again

    def use_batch(self, name: str) -> None:
        """Show values, colours and the comparison on the batch ``name``."""
        self.check_open()
        if not isinstance(name, str) or name not in self._inputs:
            raise yax.YaxInputError(f"No batch is named {str(name)[:40]!r}; the batches are "
                                    f"{', '.join(map(repr, self._inputs)) or 'none'}. Add one with "
                                    "`explorer.add_batch(name, *inputs)`.")
        if self._inputs[name] is not self._in_use:
            with self.all_or_nothing():
                self._show_batch(self._inputs[name])

    def _show_batch(self, batch: NamedBatch) -> None:
        """Make ``batch`` the one in use and show the comparison, colours and values on it."""
        self._in_use = batch
        self._sync_batches()
        self._finish_compare(self._start_compare())  # the comparison, on the new batch
        self.inspector.batch_changed()

    def _sync_batches(self) -> None:
        b = self._in_use  # its inputs as given (a wrapper's parameters and an nnx state, put first, aside)
        shown = _payloads.inputs(self.input_names or [], b.args[1 if self.has_params else 0:], b.kwargs)
        self._set(batches={"names": list(self._inputs), "current": self.batch, "inputs": shown})

    # -- showing the current model ---------------------------------------------------------

    def _refresh(self) -> None:
        compared = self._start_compare()  # first: the tree below is rebuilt while XLA compiles
        mox = self.mox
        original = mox is self.original
        changes: dict[str, Any] = {
            "tree": ({**self.state["original_tree"], "version": self._index} if original
                     else _payloads.tree(mox, self._index)),
            "history": {"items": [c.description for c in self._states[1:]], "index": self._index},
            "diff": {"original": {}, "current": {}} if original else _payloads.diff_marks(self.original, mox)}
        if self.state["query"]:
            try:
                changes.update(self._run_query(self.state["query"])[1])
            except Exception as e:  # shown as the query's error; the change itself stands
                self._selection = []
                changes.update(query_error=str(e) if isinstance(e, yax.YaxError) else
                               f"The query failed with {type(e).__name__}: {e}",
                               matches=[], match_owners={}, query_result={})
        self._set(**changes)
        self._finish_compare(compared)

    # -- comparing, on the worker ----------------------------------------------------------

    def _worker(self) -> ThreadPoolExecutor:
        self.check_open()  # a closed session starts no thread again
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="yax-explorer")
            weakref.finalize(self, _stop, self._pool)
        return self._pool

    def run_on_worker(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the worker thread, between two measurements: its result."""
        return self._worker().submit(fn).result()

    def _warm(self, batch: NamedBatch) -> None:
        try:
            jax.random.fold_in(self._key, 1)  # the first change's key: folding compiles once (0.05 s)
            self._original_values(batch)
        except Exception:  # the first real compare reports any problem, with context
            pass

    def _original_values(self, batch: NamedBatch) -> Measured:
        """The original's outputs and boundary values on ``batch``, measured
        once: they never change while the explorer lives (on the worker)."""
        ref = self._refs.get(batch.serial)
        if ref is None:
            idx, _ = paired_outputs(self.original, self.original)
            ref = measure(self.original, batch.args, batch.kwargs, idx)
            with self._held:
                if not self._closed and (batch is self._in_use or self._inputs.get(batch.name) is batch):
                    self._refs[batch.serial] = ref  # (not for a batch replaced meanwhile)
        return ref

    def _start_compare(self) -> tuple[Future, float, str] | None:
        """Start comparing the current model with the original (or the previous
        state, `compare_with`) on the worker, both on the batch in use."""
        self._current = None  # another model's: let go of it
        self.comparisons = None
        against = self._references.get(self.state["compare_base"])
        if against is not None and (self.args or self.kwargs) and not self.abstract:
            self.status("compiling and comparing with the reference…", busy=True)
            batch = self._in_use
            future = self._worker().submit(self._measure_reference, against, self.mox, self.params, self._index, batch)
            return future, time.perf_counter(), self.state["compare_base"]
        if self._index == 0 or not (self.args or self.kwargs) or self.abstract:
            return None
        previous = self.state["compare_base"] == "previous" and self._index >= 2  # before the first: the original
        base = self._states[self._index - 1] if previous else None
        self.status("compiling and comparing…", busy=True)
        t = time.perf_counter()
        batch = self._in_use  # measured on explicitly: the batch in use may change before the worker starts
        lowered = threading.Event()
        future = self._worker().submit(self._measure, self.mox, self.params, batch, lowered, base)
        future.add_done_callback(lambda _: lowered.set())  # also when it fails
        if batch.serial in self._refs:
            # Tracing and lowering hold the GIL like the tree rebuild does; XLA's compile, next, does
            # not: the tree is rebuilt during the compile. (Before the original is measured, the
            # tree goes first: that measurement takes longer than the tree.)
            lowered.wait()
        return future, t, "previous" if previous else "original"

    def _measure(self, mox: Mox, params: Any, batch: NamedBatch, lowered: threading.Event,
                 base: Change | None = None) -> yax.Comparison:
        """The comparison of ``mox`` (with ``params``) and the original, or ``base``,
        both measured on ``batch`` (on the worker)."""
        c = self._measure_values(mox, params, batch, lowered, base)
        if self._grad_of is None:
            return c
        if base is None and not self.has_params:
            raise yax.YaxInputError("`grad_of` compares gradients with respect to the parameters, but this model "
                                    "takes none. Open the explorer with the parameters as the first argument.")
        before = self.original if base is None else base.mox
        args_a = batch.args if base is None else self._args_of(base.params, batch)
        return dataclasses.replace(c, gradients=compare_gradients(before, mox, args_a, self._args_of(params, batch),
                                                                  batch.kwargs, self._grad_of))

    #: With a reference as the base, the history states compared with it besides the original: the
    #: current one and up to this many before it (each compiles once; `compare` keeps its program).
    REFERENCE_COLUMNS = 4

    def _measure_reference(self, against: tuple[yax.Reference, Any], mox: Mox, params: Any, index: int,
                           batch: NamedBatch) -> yax.Comparisons:
        """The original and the states of the history up to the current one (the last
        `REFERENCE_COLUMNS` of them), each compared with a reference, on ``batch``."""
        ref, names = against
        models: dict[str, Any] = {self.state["compare_base"]: ref}
        for i in [0, *range(max(1, index - self.REFERENCE_COLUMNS + 1), index + 1)]:
            state = self._states[i]
            m, p = (mox, params) if i == index else (state.mox, state.params if i else batch.args[0])
            models["original" if i == 0 else f"step {i}"] = (m, p) if self.has_params else m
        return yax.compare_all(models, *batch.args, names=names, **batch.kwargs)

    def _measure_values(self, mox: Mox, params: Any, batch: NamedBatch, lowered: threading.Event,
                        base: Change | None = None) -> yax.Comparison:
        args = self._args_of(params, batch)
        if base is None:
            _, idx = paired_outputs(self.original, mox)
            ref = self._original_values(batch)
            # measured the way the original was (jitted, or op by op for chains of tiny calls)
            return compare_measured(self.original, mox, ref, self._keep(mox, batch, measure(
                mox, args, batch.kwargs, idx, lowered=lowered, eager=ref.eager)))
        base_idx, idx = paired_outputs(base.mox, mox)
        cached = self._base_values  # the last base measured: stepping forward measures each state once more
        if cached is None or cached[0] is not base.mox or cached[1] != batch.serial:
            cached = (base.mox, batch.serial, measure(base.mox, self._args_of(base.params, batch), batch.kwargs,
                                                      base_idx, eager=self._original_values(batch).eager))
            with self._held:
                if not self._closed:
                    self._base_values = cached
        return compare_measured(base.mox, mox, cached[2], self._keep(mox, batch, measure(
            mox, args, batch.kwargs, idx, lowered=lowered, eager=cached[2].eager)))

    def _keep(self, mox: Mox, batch: NamedBatch, m: Measured) -> Measured:
        """``m``, kept as the current model's values on ``batch`` (on the worker)."""
        with self._held:
            if mox is self.mox and not self._closed:
                self._current = (mox, batch.serial, m)
        return m

    def measured(self, mox: Mox) -> Measured | None:
        """What was measured of ``mox`` on the batch in use: the original's (measured
        now if need be), or the current model's as its comparison measured it (waiting
        for a comparison under way); None where nothing was."""
        batch = self._in_use
        if mox is self.original:
            return self.run_on_worker(lambda: self._original_values(batch))
        found = self.run_on_worker(lambda: self._current)
        return found[2] if found is not None and found[0] is mox and found[1] == batch.serial else None

    def _finish_compare(self, compared: tuple[Future, float, str] | None) -> None:
        if compared is None:
            self.comparison = None
            changes: dict[str, Any] = {
                "comparison": {"message": NO_VALUES} if self.abstract and (
                    self._index or self.state["compare_base"] in self._references) else
                {} if self.args or self.kwargs else {"message": "no example inputs to compare on"}}
            if self.state["status"].get("message"):  # "compared in …" was about a change no longer applied
                changes["status"] = {"busy": False, "message": ""}
            self._set(**changes)
            return
        future, t, base = compared
        try:
            c = future.result()
        except Exception as e:  # the change stands; its comparison says why it could not be made
            self.comparison = None
            self._set(comparison=_payloads.comparison_failure(e), status={"busy": False, "message": "comparison failed"})
            return
        seconds = time.perf_counter() - t
        if isinstance(c, yax.Comparisons):  # with a reference: the current model's is the comparison
            self.comparisons = c
            c = c.against_first[c.names[-1]]  # the current state's, the last column
            state = {**_payloads.comparison_state(c, self.mox, seconds), "base": base,
                     **_payloads.columns_state(self.comparisons, self.mox)}
        else:
            state = {**_payloads.comparison_state(c, self.mox, seconds), "base": base}
        self.comparison = c
        self._set(comparison=state,
                  status={"busy": False, "message": f"compared in {seconds:.2f} s"})


def _check_static(argnums: Any, argnames: Any) -> None:
    """Refuse ``static_argnums``/``static_argnames`` that `yax.make_mox` (as `jax.jit`) does not take."""
    def each(v: Any, kind: type) -> bool:
        items = [v] if isinstance(v, kind) else list(v) if isinstance(v, (list, tuple)) else None
        return items is not None and all(isinstance(i, kind) and not isinstance(i, bool) for i in items)

    if argnums is not None and not each(argnums, int):
        raise yax.YaxInputError(f"`static_argnums` must be the position of an argument or a tuple of them, such "
                                f"as `(1,)`, not `{str(argnums)[:40]}` (a `{type(argnums).__name__}`).")
    if argnames is not None and not each(argnames, str):
        raise yax.YaxInputError(f"`static_argnames` must be the name of an argument or a tuple of them, such as "
                                f"`(\"grid\",)`, not `{str(argnames)[:40]}` (a `{type(argnames).__name__}`).")


def _listed(names: list[str], most: int = 3) -> str:
    """``a, b, c and 2 more``: the first ``most`` of ``names``."""
    if len(names) <= most:
        return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
    return f"{', '.join(names[:most])} and {len(names) - most} more"


def _stop(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (where a widget is shown)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _key_code(key: Any) -> str:
    try:
        data = jax.random.key_data(key)
        if data.shape == (2,) and int(data[0]) == 0:
            return f"jax.random.key({int(data[1])})"
    except Exception:
        pass
    return "...  # the key passed to Explorer(key=...)"
