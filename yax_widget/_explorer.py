"""The explorer: an anywidget over a MoX that queries, rewrites and compares.

This module holds the widget's state (its traits, the history, the
registered replacements) and its Python API. The requests the front-end
sends are answered in ``_protocol``; what is sent to it (tree rows, diff
marks, the comparison) is built in ``_payloads``. Both formats are described
in ``docs/widget.md``.
"""

from __future__ import annotations

import builtins
import dataclasses
import keyword
import pathlib
import re
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anywidget
import jax
import traitlets

import yax
from yax import Equation, Mox
from yax.internal import (
    Measured,
    compare_gradients,
    compare_measured,
    is_decider,
    is_module,
    measure,
    node_ids,
    paired_outputs,
    params_argument,
    trace_target,
)

from . import _payloads, _protocol
from ._code import replacement_code, xpath_for
from ._export import input_names
from ._targets import hf_call, opening_lines, target_kind
from ._values import Values

STATIC = pathlib.Path(__file__).parent / "static"

if not (STATIC / "widget.js").exists():
    raise ImportError(
        f"The explorer's front-end bundle {STATIC / 'widget.js'} is missing: this is a source checkout "
        "whose JavaScript was not built. Run `bash scripts/setup.sh`, or `npm --prefix js ci && npm "
        "--prefix js run build`."
    )


@dataclasses.dataclass(frozen=True)
class Change:
    """One step of the history: what was done, the code doing it, and the
    model after it."""

    description: str
    code: str
    mox: Mox
    params: Any


@dataclasses.dataclass(frozen=True)
class _Item:
    name: str
    repl: Any
    code: str | None  #: a Python expression for it; None: the script must define it
    kind: str
    doc: str
    ident: str = "replacement"  #: the variable "copy as code" names it by, when code is None

    @property
    def expr(self) -> str:
        return self.code or self.ident


# Names the script "copy as code" writes uses itself.
_SCRIPT_NAMES = {"jax", "yax", "mox", "params", "KEY", "nn", "jnp", "nnx", "np"}


def _identifier(name: str, taken: set[str]) -> str:
    """A Python variable name for a replacement registered as ``name``: valid,
    no keyword, builtin or name of the script, and none another one has."""
    base = "_".join(re.findall(r"\w+", name.lower()))
    base = "".join(ch if ("a" + ch).isidentifier() else "_" for ch in base).strip("_") or "replacement"
    if not base.isidentifier():  # it starts with a digit
        base = "r_" + base
    if keyword.iskeyword(base) or keyword.issoftkeyword(base) or hasattr(builtins, base) or base in _SCRIPT_NAMES:
        base += "_"
    ident, k = base, 2
    while ident in taken:
        ident, k = f"{base}_{k}", k + 1
    return ident


def _default_palette() -> list[tuple[str, Any]]:
    import jax.numpy as jnp

    return [
        ("GELU", jax.nn.gelu), ("ReLU", jax.nn.relu), ("SiLU", jax.nn.silu), ("tanh", jnp.tanh),
        ("sigmoid", jax.nn.sigmoid), ("identity", jax.nn.identity),
        ("LoRA r=4", yax.LoRA(rank=4)),  # Dense, DenseGeneral, Einsum and nnx Linear layers
    ]


class Explorer(Values, anywidget.AnyWidget):
    """Explore a model's module tree, query it, swap layers and compare.

    Args:
      target: a root `yax.Mox`, a Flax linen module (traced as
        ``model.apply(*args, **kwargs)``), a flax.nnx module (traced as
        ``model(*args, **kwargs)``; its state becomes the parameters), or
        any JAX function.
      *args, **kwargs: the example inputs: traced with ``target`` and used
        to compare the original and modified model. When the first
        positional argument is a mapping (linen variables), it is the
        parameters `yax.sub` reconciles.
      key: PRNG key for the parameters of inserted modules (default
        ``jax.random.key(0)``, folded with each step).
      batches: more named inputs, ``{"clean": x, "corrupt": y}``: each
        the arguments after the parameters (a tuple for several), of the
        example's shapes; the UI chooses the one the values, colouring and
        comparison use (`add_batch`, `use_batch`). Not ``inputs=``: that is
        the usual name of a Flax module's own argument.
      grad_of: a function of what the model returns giving a scalar (a loss): each
        comparison also compares the gradients of ``grad_of(model(...))`` with respect
        to the parameters (`yax.compare`'s ``grad_of``), shown in the compare pane.
      warm: compile and run the original model on the example inputs in
        a background thread right away, keeping its outputs and module
        boundary values (host memory: the size of all its call outputs,
        as float32) so that each substitution compiles and runs only the
        modified model (default: when running in a Jupyter kernel, where
        the widget is shown; otherwise the first comparison does it).

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from yax_widget import Explorer
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
      >>> [n.name for n in ex.query('//activation')]
      ['relu']
      >>> print(ex.substitute('//activation', "GELU"))
      replaced 1 node(s) selected by //activation with GELU
      >>> [n.name for n in ex.mox.modules()], ex.comparison.first_divergence
      (['Sequential', 'layers_0', 'gelu', 'layers_2'], 'Sequential/relu')
    """

    _esm = STATIC / "widget.js"
    _css = STATIC / "widget.css"

    # The state the front-end renders from (docs/widget.md, "Traits"); built by `_payloads`.
    _tree = traitlets.Dict().tag(sync=True)            #: version and call rows of the current MoX
    _original_tree = traitlets.Dict().tag(sync=True)   #: version and call rows of the original MoX
    _query = traitlets.Unicode("").tag(sync=True)      #: the current query text
    _query_error = traitlets.Unicode("").tag(sync=True)  #: the last query's error, or ""
    _matches = traitlets.List().tag(sync=True)         #: ids the last good query selected
    _query_result = traitlets.Dict().tag(sync=True)    #: what the last good query returned (count, values, explain)
    _match_owners = traitlets.Dict().tag(sync=True)    #: matched equation id -> the call row it runs in
    _palette = traitlets.List().tag(sync=True)         #: registered replacements: name, kind, doc
    _history = traitlets.Dict().tag(sync=True)         #: change descriptions and the current index
    _diff = traitlets.Dict().tag(sync=True)            #: diff marks by row id, original and current
    _comparison = traitlets.Dict().tag(sync=True)      #: the last comparison, with binary heatmaps
    _status = traitlets.Dict({"busy": False, "message": ""}).tag(sync=True)  #: busy flag and message
    _notice = traitlets.Dict().tag(sync=True)          #: a refused replacement's reason, at its row
    _compare_base = traitlets.Unicode("original").tag(sync=True)  #: compare with "original" or "previous"

    def __init__(self, target: Any, *args: Any, key: Any = None, warm: bool | None = None,
                 batches: Any = None, grad_of: Any = None, **kwargs: Any):
        super().__init__()
        if grad_of is not None and not callable(grad_of):
            raise yax.YaxInputError(
                f"`grad_of` must be a function of what the model returns giving a scalar (a loss), but got a "
                f"`{type(grad_of).__name__}`. Try `grad_of=lambda out: out.sum()`.")
        self._grad_of = grad_of
        given = target
        if isinstance(target, Mox):
            if target.kind != "root":
                raise yax.YaxInputError(
                    f"`Explorer` expected a root MoX from `yax.make_mox`, but got a `{target.kind}` node. "
                    "Try `Explorer(model, variables, batch)`."
                )
            mox = target
        else:  # an nnx module's MoX runs (state, *args) -> (out, new_state): docs/nnx.md
            target, args = hf_call(target, args)  # a Hugging Face wrapper: its `params` become an argument
            mox, args = trace_target(target, *args, **kwargs)
        self._args, self._kwargs = args, kwargs
        self._target_kind = target_kind(given, target, mox)  # how "copy as code" makes `mox` again
        self._names: list[str] | None = None  # the expressions `%yax` was given: the script's names
        params = params_argument(mox, args)  # the variables or state `yax.sub` reconciles, or None
        self._has_params = params is not None
        # what the positional inputs are called in the model's own signature: the export's README names them so
        self._input_names = input_names(given, len(args) - self._has_params, self._has_params)
        self._init_values(batches)  # the named batches (_values.py)
        self._key = jax.random.key(0) if key is None else key
        self._states: list[Change] = [Change("original", "", mox, params)]
        self._index = 0
        self._items: dict[str, _Item] = {}
        self._selection: list[Any] = []
        self._fit_cache: dict = {}
        self.comparison: yax.Comparison | None = None
        self._reference: Measured | None = None  # the original's values on the example inputs
        self._base_values: tuple[Mox, Measured] | None = None  # a previous state's, for "previous"
        # One worker runs the models (in order: the original's measurement, then each change's).
        # XLA compiles without holding the GIL, so the tree is rebuilt meanwhile on this thread.
        # It starts on first use and stops with `close()` (or when the explorer is collected).
        self._pool: ThreadPoolExecutor | None = None
        self._warmer: Future | None = None
        for name, repl in _default_palette():
            self.add_replacement(name, repl)
        self._original_tree = _payloads.tree(mox, 0)
        self._refresh()
        self.on_msg(self._on_msg)
        if warm is None:
            warm = _in_kernel()
        if warm and (args or kwargs):
            # Measure the original (compile, run, fetch its outputs and module boundaries) while
            # the user looks at the tree: each substitution then runs only the modified model.
            # The worker is no daemon: a script that exits meanwhile waits for XLA rather than
            # aborting in it.
            self._warmer = self._worker().submit(self._warm)

    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="yax-explorer")
            weakref.finalize(self, _stop, self._pool)
        return self._pool

    def close(self) -> None:
        """Close the widget, stop its worker thread and let go of the
        original's measured values (the history stays readable)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            _stop(pool)
        self._reference, self._warmer, self._fit_cache, self._base_values = None, None, {}, None
        super().close()

    def _warm(self) -> None:
        try:
            self._original_values()
        except Exception:  # the first real compare reports any problem, with context
            pass

    def _original_values(self) -> Measured:
        """The original's outputs and boundary values on the example inputs,
        measured once: they never change while the explorer lives."""
        if self._reference is None:
            idx, _ = paired_outputs(self.original, self.original)
            self._reference = measure(self.original, self._args, self._kwargs, idx)
        return self._reference

    # -- the Python API ----------------------------------------------------------

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
    def selection(self) -> list[Any]:
        """The nodes the current query selects."""
        return list(self._selection)

    def add_replacement(self, name: str, repl: Any, *, code: str | None = None, doc: str | None = None) -> None:
        """Offer ``repl`` (anything `yax.sub` accepts) in the palette as ``name``.
        ``code`` is the Python expression "copy as code" writes for it."""
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise yax.YaxInputError(f"A replacement name must be a non-empty string of at most 80 characters, "
                                    f"not {name!r}.")
        kind = ("mox" if isinstance(repl, Mox) else "equation" if isinstance(repl, Equation)
                else "module" if is_module(repl) else "decider" if is_decider(repl) else "function")
        if kind == "function" and not callable(repl):
            raise yax.YaxInputError(
                f"`{name}` must be a function, a Flax module, a MoX or an Equation (anything `yax.sub` "
                f"accepts), but it is a `{type(repl).__name__}`."
            )
        text = doc if doc is not None else (getattr(repl, "__doc__", None) or "").strip().split("\n")[0]
        if code is None:
            code = replacement_code(repl)
        taken = {i.ident for n, i in self._items.items() if n != name}
        self._items[name] = _Item(name, repl, code, kind, text[:200], _identifier(name, taken))
        self._fit_cache.clear()
        self._palette = [{"name": i.name, "kind": i.kind, "doc": i.doc} for i in self._items.values()]

    def query(self, xpath: str) -> list[Any]:
        """Run ``xpath`` on the current MoX, highlight the matches in the UI
        and return them (`yax.query` semantics; non-node results are
        returned as they are and highlight nothing)."""
        self._query = xpath
        return self._run_query(xpath)

    def substitute(self, target: Any, name: str) -> str:
        """Replace ``target`` (a node of the current MoX, an XPath, or
        ``"query"`` for the current query's matches) with the replacement
        registered as ``name``; compare with the original. Returns the
        change's description. Raises `yax.YaxRewriteError` and changes
        nothing when it does not fit."""
        change = self._change(target, name)
        self._move([*self._states[:self._index + 1], change], self._index + 1)
        self._notice = {}
        return change.description

    def _change(self, target: Any, name: str) -> Change:
        """The change `substitute` makes to the current model, not applied yet (no
        comparison): what a drop does, so what the fits menu must predict. Raises
        `yax.YaxError` when it does not fit."""
        item = self._items.get(name) if isinstance(name, str) else None
        if item is None:
            raise yax.YaxInputError(f"No replacement is registered as {name!r}; registered: "
                                    f"{', '.join(self._items)}. Try `explorer.add_replacement(name, fn)`.")
        if isinstance(target, str):
            pattern = self._query if target == "query" else target
            if not pattern:
                raise yax.YaxInputError("There is no query to replace the matches of; type one first.")
            what = f"{len(yax.query(pattern, self.mox))} node(s) selected by {pattern}"
        else:
            pattern = xpath_for(target, self.mox)
            what = f"{target.path or target.name}"
        step = len(self.history) + 1
        if self.params is not None and item.kind in ("function", "equation"):  # creates no variables
            new, new_params = yax.sub(pattern, item.repl, self.mox, params=self.params)
            code = f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params)"
        elif self.params is not None:
            key = jax.random.fold_in(self._key, step)  # not made for the others: its first use compiles
            new, new_params = yax.sub(pattern, item.repl, self.mox, params=self.params, key=key)
            code = (f"mox, params = yax.sub({pattern!r}, {item.expr}, mox, params=params, "
                    f"key=jax.random.fold_in(KEY, {step}))")
        else:
            new, new_params = yax.sub(pattern, item.repl, self.mox), None
            code = f"mox = yax.sub({pattern!r}, {item.expr}, mox)"
        desc = f"replaced {what} with {name}"
        if item.code is None:
            code = f"# `{item.expr}`: the replacement registered as {name!r}; define it first\n{code}"
        return Change(desc, code, new, new_params)

    def undo(self) -> None:
        """Go back one change (nothing happens at the original)."""
        if self._index > 0:
            self._move(self._states, self._index - 1)

    def redo(self) -> None:
        """Re-apply the change last undone (nothing happens at the newest)."""
        if self._index + 1 < len(self._states):
            self._move(self._states, self._index + 1)

    def compare_with(self, base: str) -> None:
        """Compare the current model with ``"original"`` (the default) or with
        ``"previous"``: the state just before it in the history, so the
        comparison shows what the last change alone did. Compares again now.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> from yax_widget import Explorer
          >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
          >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
          >>> _ = ex.substitute('//activation', "GELU"); _ = ex.substitute('//activation', "GELU")
          >>> ex.compare_with("previous"); ex.comparison.allclose  # GELU again changes nothing
          True
        """
        if base not in ("original", "previous"):
            raise yax.YaxInputError(f"`compare_with` takes \"original\" or \"previous\", not {base!r}.")
        self._compare_base = base
        self._finish_compare(self._start_compare())

    def goto(self, index: int) -> None:
        """Make state ``index`` of the history current (0: the original; the
        changes after it stay, to redo), as a click on a history item does."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self._states):
            raise yax.YaxInputError(f"`goto` takes a state of the history, 0 (the original) to "
                                    f"{len(self._states) - 1}, not {index!r}.")
        if index != self._index:
            self._move(self._states, index)

    def _move(self, states: list[Change], index: int) -> None:
        """Make ``states[index]`` current and show it; if showing it fails, the
        explorer stays where it was, so the front-end's error reply is true."""
        before = self._states, self._index
        self._states, self._index = states, index
        try:
            self._refresh()
        except BaseException:
            self._states, self._index = before
            try:
                self._refresh()
            except Exception:  # the first failure is the one to report
                pass
            raise

    def export(self, stem: str | pathlib.Path = "yax_model") -> list[str]:
        """Save the current model to run without yax: ``{stem}.jax_exported``
        (`jax.export` of the function), ``{stem}.params.npz`` (the current
        parameters, by tree path), and ``{stem}.README.md`` and
        ``{stem}.manifest.json``, which say how to call it: ``exported.call(
        *params, *positional, **keywords)``, the inputs named and ordered as
        the explorer was given them (keyword inputs stay keywords), with
        their types, and the output's leaves it returns. Returns the paths
        written, in that order.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn, numpy as np, tempfile, os
          >>> from yax_widget import Explorer
          >>> m = nn.Dense(2); x = jnp.ones((1, 3)); v = m.init(jax.random.key(0), x)
          >>> ex = Explorer(m, v, x, warm=False)
          >>> fn, npz, readme, manifest = ex.export(os.path.join(tempfile.mkdtemp(), "dense"))
          >>> [line for line in open(readme) if line.startswith("outputs =")]
          ['outputs = exported.call(*params, inputs)\\n']
          >>> exported = jax.export.deserialize(open(fn, "rb").read()); p = np.load(npz)
          >>> out, = exported.call(*[p[k] for k in p.files], x); bool(jnp.allclose(out, m.apply(v, x)))
          True
        """
        from ._export import export

        return export(self, stem)["files"]

    def code(self) -> str:
        """The `yax.sub` calls that turn the original into the current model,
        as a script fragment (``mox`` and ``params`` are the original's)."""
        lines = [c.code for c in self.history]
        if not lines:
            return "# no changes: the model is the original"
        head = ["import jax", "import yax", "",
                *opening_lines(self._target_kind, self._names, len(self._args), self._kwargs, self._has_params), ""]
        if any("KEY" in line for line in lines):
            head.insert(2, f"KEY = {_key_code(self._key)}")
        return "\n".join(head + lines)

    # -- state sent to the front-end ---------------------------------------------

    def _refresh(self) -> None:
        compared = self._start_compare()  # first: the tree below is rebuilt while XLA compiles
        mox = self.mox
        original = mox is self.original
        self._tree = {**self._original_tree, "version": self._index} if original else _payloads.tree(mox, self._index)
        self._history = {"items": [c.description for c in self._states[1:]], "index": self._index}
        self._diff = {"original": {}, "current": {}} if original else _payloads.diff_marks(self.original, mox)
        if self._query:
            try:
                self._run_query(self._query)
            except Exception as e:  # shown as the query's error; the change itself stands
                if not isinstance(e, yax.YaxError):
                    self._query_error = f"The query failed with {type(e).__name__}: {e}"
                self._matches, self._selection, self._match_owners, self._query_result = [], [], {}, {}
        self._finish_compare(compared)

    def _run_query(self, xpath: str) -> list[Any]:
        try:
            res = yax.query(xpath, self.mox)
        except yax.YaxError as e:
            self._query_error = str(e)
            raise
        self._query_error = ""
        if isinstance(res, list):
            ids = node_ids(self.mox)
            self._selection = [n for n in res if id(n) in ids]
            owners = _payloads.owners(self.mox)
            self._match_owners = {str(i): owners[i] for i in (ids[id(n)] for n in self._selection) if i in owners}
            self._matches = [ids[id(n)] for n in self._selection]
        else:
            self._selection, self._matches = [], []
        self._query_result = _payloads.query_result(xpath, res, len(self._matches), self.mox)
        return res

    def _start_compare(self) -> tuple[Future, float, str] | None:
        """Start comparing the current model with the original (or the previous
        state, `compare_with`) on the worker."""
        if self._index == 0 or not (self._args or self._kwargs):
            return None
        previous = self._compare_base == "previous" and self._index >= 2  # before the first: the original
        base = self._states[self._index - 1] if previous else None
        self._status = {"busy": True, "message": "compiling and comparing…"}
        t = time.perf_counter()
        args = (self.params, *self._args[1:]) if self._has_params else self._args
        lowered = threading.Event()
        future = self._worker().submit(self._measure, self.mox, args, lowered, base)
        future.add_done_callback(lambda _: lowered.set())  # also when it fails
        if self._reference is not None:
            # Tracing and lowering hold the GIL like the tree rebuild does; XLA's compile, next, does
            # not: the tree is rebuilt during the compile. (Before the original is measured, the
            # tree goes first: that measurement takes longer than the tree.)
            lowered.wait()
        return future, t, "previous" if previous else "original"

    def _measure(self, mox: Mox, args: tuple, lowered: threading.Event, base: Change | None = None) -> yax.Comparison:
        c = self._measure_values(mox, args, lowered, base)
        if self._grad_of is None:
            return c
        if base is None and not self._has_params:
            raise yax.YaxInputError("`grad_of` compares gradients with respect to the parameters, but this model "
                                    "takes none. Open the explorer with the parameters as the first argument.")
        before = self.original if base is None else base.mox
        args_a = self._args if base is None else ((base.params, *self._args[1:]) if self._has_params else self._args)
        return dataclasses.replace(c, gradients=compare_gradients(before, mox, args_a, args, self._kwargs,
                                                                  self._grad_of))

    def _measure_values(self, mox: Mox, args: tuple, lowered: threading.Event,
                        base: Change | None = None) -> yax.Comparison:
        if base is None:
            _, idx = paired_outputs(self.original, mox)
            ref = self._original_values()
            # measured the way the original was (jitted, or op by op for chains of tiny calls)
            return compare_measured(self.original, mox, ref, measure(mox, args, self._kwargs, idx, lowered=lowered,
                                                                     eager=ref.eager))
        base_idx, idx = paired_outputs(base.mox, mox)
        cached = self._base_values  # the last base measured: stepping forward measures each state once more
        if cached is None or cached[0] is not base.mox:
            base_args = (base.params, *self._args[1:]) if self._has_params else self._args
            cached = self._base_values = (base.mox, measure(base.mox, base_args, self._kwargs, base_idx,
                                                            eager=self._original_values().eager))
        return compare_measured(base.mox, mox, cached[1], measure(mox, args, self._kwargs, idx, lowered=lowered,
                                                                 eager=cached[1].eager))

    def _finish_compare(self, compared: tuple[Future, float, str] | None) -> None:
        if compared is None:
            self.comparison = None
            self._comparison = {} if self._args or self._kwargs else {"message": "no example inputs to compare on"}
            if self._status.get("message"):  # "compared in …" was about a change no longer applied
                self._status = {"busy": False, "message": ""}
            return
        future, t, base = compared
        try:
            c = future.result()
        except Exception as e:  # the change stands; its comparison says why it could not be made
            self.comparison = None
            self._comparison = _payloads.comparison_failure(e)
            self._status = {"busy": False, "message": "comparison failed"}
            return
        self.comparison = c
        seconds = time.perf_counter() - t
        self._comparison = {**_payloads.comparison_state(c, self.mox, seconds), "base": base}
        self._status = {"busy": False, "message": f"compared in {seconds:.2f} s"}

    # -- requests from the front-end: answered in _protocol -------------------------------

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        _protocol.handle(self, content)


def _stop(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


def _in_kernel() -> bool:
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
