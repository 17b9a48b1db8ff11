"""The explorer's session: everything the explorer does, in plain Python.

A `Session` holds the history of changes, the query and its matches, and the
state the front-end renders from; it composes the rest, each in its own module:
the registered replacements (`_palette.Palette`), the named input batches
(`_batches.Batches`), the worker thread that compiles and compares
(`_worker.CompareWorker`) and the values pane (`_values.Inspector`). It imports
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

import contextlib
import dataclasses
import pathlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

import yax
from yax import Equation, Mox
from yax.errors import CannotCompare, LossNotAFunction, NotARootMox, UnknownName, WrongType
from yax.internal import CALL_KINDS, node_ids, node_index, trace_target, variables_argument

from . import _payloads
from ._batches import EXAMPLE, Batches, NamedBatch, as_args, same_inputs
from ._costs import Costs
from ._export import input_names
from ._palette import Item, Palette, default_palette
from ._providers import PROVIDERS
from ._targets import check_static, hf_call, opening_lines, target_kind
from ._values import Inspector
from ._worker import CompareWorker


@dataclasses.dataclass(frozen=True)
class Change:
    """One step of the history: what was done, the code doing it, and the
    model after it."""

    description: str
    code: str
    mox: Mox
    params: Any


class SessionClosed(yax.YaxInputError):
    """A command reached an explorer after `close()`. Its history stays
    readable; open a new explorer to change or compare the model again."""


#: What `Session.state` holds at first: the keys the front-end renders from (docs/widget.md, "Traits").
INITIAL_STATE: dict[str, Any] = {
    "tree": {}, "original_tree": {}, "query": "", "query_error": "", "matches": [], "query_result": {},
    "match_owners": {}, "palette": [], "history": {}, "diff": {}, "comparison": {},
    "status": {"busy": False, "message": ""}, "compare_base": "original", "references": [],
    "batches": {}, "values": {}, "overlay": {}, "scalars": [], "panes": [],
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
            raise LossNotAFunction("Explorer", grad_of)
        self.state: dict[str, Any] = dict(INITIAL_STATE)
        self._version = 0  # how many times `state` changed, the status line aside (`version`)
        #: Held while a request from the front-end runs (`_protocol.answer`): requests reaching the
        #: session from several threads run one at a time, each seeing and leaving it whole.
        self.lock = threading.RLock()
        self._on_change = on_change
        self._grad_of = grad_of
        given = target
        if isinstance(target, Mox):
            if target.kind != "root":
                raise NotARootMox("Explorer", f"a `{target.kind}` node", "Try `Explorer(model, variables, batch)`.")
            if static_argnums is not None or static_argnames is not None:
                raise yax.YaxInputError(
                    "`static_argnums`/`static_argnames` say how to trace a model, but `Explorer` was given a "
                    "MoX, traced already. Pass them to `yax.make_mox`, or give `Explorer` the model.")
            mox = target
        else:  # an nnx module's MoX runs (state, *args) -> (out, new_state): docs/nnx.md
            check_static(static_argnums, static_argnames)
            target, args = hf_call(target, args)  # a Hugging Face wrapper: its `params` become an argument
            mox, args = trace_target(target, *args, static_argnums=static_argnums,
                                     static_argnames=static_argnames, **kwargs)
        #: the static options as `make_mox` takes them, for "copy as code" (``", static_argnums=(1,)"``)
        self._static = "".join(f", {k}={v!r}" for k, v in (("static_argnums", static_argnums),
                                                             ("static_argnames", static_argnames)) if v is not None)
        self.inputs = Batches(NamedBatch(EXAMPLE, args, kwargs))  # the named batches and the one in use
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
        self.palette = Palette()  # the registered replacements
        self._selection: list[Any] = []
        self.comparison: yax.Comparison | None = None
        #: with a `yax.Reference` as the base: the original's (and the current model's) comparisons with it
        self.comparisons: yax.Comparisons | None = None
        self._saved: tuple | None = None  # what `all_or_nothing` puts back if the command under way fails
        self._closed = False
        self.worker = CompareWorker(self, self._key, grad_of)  # the thread that measures and compares
        self.inspector = Inspector(self)
        self.costs = Costs(self)  # the compiled program's cost, compiled when first asked
        self._set(scalars=self.inspector.scalars())  # what the gradient colouring may differentiate
        self._init_batches(batches)
        for name, repl, options in default_palette():
            self.add_replacement(name, repl, **options)
        self._set(original_tree=_payloads.tree(mox, 0))
        self._refresh()
        self._set(panes=list(PROVIDERS))  # a tab each (`_providers`), filled by the `details` request
        if warm and (args or kwargs) and not self.abstract:
            self.worker.warm(self.inputs.in_use)  # measured while the user looks at the tree

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
        return dict(self.palette.items)

    @property
    def batch(self) -> str:
        """The name of the batch the values, colouring and comparison use."""
        return self.inputs.in_use.name

    @property
    def batch_key(self) -> int:
        """What the values measured on the batch in use are kept under: its `NamedBatch.serial`,
        which no other batch has, even one added again under the same name."""
        return self.inputs.in_use.serial

    @property
    def args(self) -> tuple:
        """The positional inputs of the batch in use, the parameters first."""
        return self.inputs.in_use.args

    @property
    def kwargs(self) -> dict:
        """The keyword inputs of the batch in use."""
        return self.inputs.in_use.kwargs

    @property
    def batches(self) -> list[str]:
        """The names of the input batches."""
        return list(self.inputs.named)

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
            raise yax.errors.AbstractParams("values")
        return self.inputs.in_use.args_with(self.params, self.has_params), self.kwargs

    def node(self, rid: Any, kinds: tuple = (*CALL_KINDS, "equation"), field: str = "id") -> Any:
        """The node of the current model whose row id is ``rid`` (its number in the node index: no
        XML view is built), of one of ``kinds``."""
        nodes = node_index(self.mox).nodes
        if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < len(nodes):
            raise yax.YaxInputError(f"`{field}` must be the id of a node of the current model, not {str(rid)[:40]!r}.")
        node = nodes[rid]
        kind = "equation" if isinstance(node, Equation) else node.kind
        if kind not in kinds:
            raise yax.YaxInputError(f"Node {rid} is a `{kind}` node, which cannot be used here.")
        return node

    def fits(self, node: Any) -> tuple[list[str], dict[str, str]]:
        """The replacements a drop on ``node`` accepts, and why each other one is refused."""
        return self.palette.fits(node, self.mox, self.params)

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
        self.palette.add(name, repl, code=code, doc=doc, cast=cast, keep=keep)
        self._set(palette=self.palette.shown())

    def query(self, xpath: str) -> list[Any]:
        """Run ``xpath`` on the current MoX, highlight the matches and return them
        (`yax.query` semantics; non-node results are returned as they are and
        highlight nothing). A query that fails raises and changes nothing; an
        empty one clears the highlight."""
        self.check_open()
        if not isinstance(xpath, str):
            raise WrongType("xpath", "an XPath string", xpath)
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
        matches = [ids[id(n)] for n in selection]
        changes = {"query_error": "", "matches": matches, "match_owners": _payloads.owners(self.mox, matches),
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
        step = len(self.history) + 1
        return Change(*self.palette.change(target, name, self.mox, self.params, self._key, step,
                                           self.state["query"]))

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
        if base not in ("original", "previous") and base not in self.worker.references:
            raise UnknownName("state to compare with", base, ["original", "previous", *self.worker.references],
                              "A reference is added with `add_reference`.")
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
            raise WrongType("reference", "a `yax.Reference` (recorded with `Reference.from_torch`, or loaded with "
                            "`Reference.load`)", reference)
        name = str(name or reference.source or "reference")
        if name in ("original", "previous"):
            raise CannotCompare("Explorer.add_reference", "reserved name", f"A reference cannot be called \"{name}\": "
                                "that names a state of the history. Pass another `name`.", name)
        self.worker.references[name] = (reference, names)
        self._set(references=list(self.worker.references))
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
        saved = self._saved = (self._states, self._index, dict(self.inputs.named), self.inputs.in_use,
                               self._selection, self.comparison, self.comparisons, self.worker.current,
                               self.inspector.active, dict(self.state))
        try:
            yield
        except BaseException:
            (self._states, self._index, self.inputs.named, self.inputs.in_use, self._selection, self.comparison,
             self.comparisons, self.worker.current, self.inspector.active, state) = saved
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
        from ._export import export

        return export(self, stem, overwrite=overwrite)["files"]

    def export_next(self) -> dict:
        """The Export button: write ``yax_model_step{K}`` (K: the current step) in the
        working directory, with ``_2``, ``_3``… added when files of that name exist
        (none is replaced). Returns the files and their sizes."""
        self.check_open()
        from ._export import export_next

        reply = export_next(self)
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
        self._closed = True
        self.palette.forget()
        self.worker.close()
        self.inspector.clear()

    # -- batches ---------------------------------------------------------------------------

    def _init_batches(self, batches: Mapping[str, Any] | None) -> None:
        if batches is not None and not isinstance(batches, Mapping):
            raise WrongType("batches", "a mapping of names to inputs, such as `{'clean': x, 'corrupt': y}`", batches)
        example = self.args[1:] if self.has_params else self.args
        given = dict(batches or {})
        same = next((k for k, v in given.items() if same_inputs(as_args(v, len(example)), example)), None)
        if same is None and (self.args or self.kwargs):
            self.inputs.named[EXAMPLE] = self.inputs.in_use
        for name, v in given.items():
            self.add_batch(name, *as_args(v, len(example)))
        named = self.inputs.named
        self.inputs.in_use = named.get(same or EXAMPLE, next(iter(named.values()), self.inputs.in_use))
        self._sync_batches()

    def add_batch(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Offer the inputs ``args`` (after the parameters, when the model has
        them) and ``kwargs`` (the example's, where not given) as the batch
        ``name`` (`Explorer.add_batch`). A batch of that name is replaced; when
        it is the one in use, the comparison and the values show the new one."""
        self.check_open()
        new = self.inputs.fitting(name, args, kwargs, self.has_params)
        old = self.inputs.named.get(name)
        with self.all_or_nothing():
            self.inputs.named[name] = new
            if old is not None and old is self.inputs.in_use:
                self._show_batch(new)
            else:
                self._sync_batches()
        if old is not None:
            self.worker.forget(old)

    def use_batch(self, name: str) -> None:
        """Show values, colours and the comparison on the batch ``name``."""
        self.check_open()
        batch = self.inputs.get(name)
        if batch is not self.inputs.in_use:
            with self.all_or_nothing():
                self._show_batch(batch)

    def _show_batch(self, batch: NamedBatch) -> None:
        """Make ``batch`` the one in use and show the comparison, colours and values on it."""
        self.inputs.in_use = batch
        self._sync_batches()
        self._finish_compare(self._start_compare())  # the comparison, on the new batch
        self.inspector.batch_changed()

    def _sync_batches(self) -> None:
        self._set(batches=self.inputs.shown(self.input_names, self.has_params))

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

    def _start_compare(self) -> Any:
        """Start comparing the current model on the batch in use (`CompareWorker.start`)."""
        self.comparisons = None
        return self.worker.start()

    def _finish_compare(self, compared: Any) -> None:
        """Show the comparison ``compared`` (`_start_compare`'s), waiting for it."""
        self.comparison, self.comparisons, changes = self.worker.finish(compared)
        self._set(**changes)


def _key_code(key: Any) -> str:
    try:
        data = jax.random.key_data(key)
        if data.shape == (2,) and int(data[0]) == 0:
            return f"jax.random.key({int(data[1])})"
    except Exception:
        pass
    return "...  # the key passed to Explorer(key=...)"
