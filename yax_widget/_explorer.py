"""The explorer widget: a thin anywidget over a `Session`.

The session (``_session``) does everything and holds the state the
front-end renders from; this class mirrors that state into synced traits,
hands each custom message to ``_protocol.answer`` and sends the reply, and
offers the session's Python API. Formats: ``docs/widget.md``.
"""

from __future__ import annotations

import inspect
import pathlib
from typing import Any

import anywidget
import jax
import traitlets

import yax

from . import _protocol
from ._follow import Leader
from ._session import Change, Session
from ._targets import caller_names

STATIC = pathlib.Path(__file__).parent / "static"

if not (STATIC / "widget.js").exists():
    raise ImportError(
        f"The explorer's front-end bundle {STATIC / 'widget.js'} is missing: this is a source checkout "
        "whose JavaScript was not built. Run `bash scripts/setup.sh`, or `npm --prefix js ci && npm "
        "--prefix js run build`."
    )

__all__ = ["Change", "Explorer"]


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (where a widget is shown)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Explorer(anywidget.AnyWidget):
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
      static_argnums, static_argnames: the arguments that are Python values for the
        trace, as for `yax.make_mox` (a grid size read with ``int(...)``); counted among
        the arguments the model is called with. The other batches must hold the same.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn
      >>> from yax_widget import Explorer
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
      >>> [n.name for n in ex.query('//activation')]
      ['relu']
      >>> print(ex.substitute('//activation', "GELU (tanh)"))
      replaced 1 node(s) selected by //activation with GELU (tanh)
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
    _compare_base = traitlets.Unicode("original").tag(sync=True)  #: "original", "previous" or a reference's name
    _references = traitlets.List().tag(sync=True)  #: the names of the references added (`add_reference`)

    _batches = traitlets.Dict().tag(sync=True)  #: the named input batches and the one in use
    _values = traitlets.Dict().tag(sync=True)   #: the selected row's values on that batch, with binary heatmaps
    _overlay = traitlets.Dict().tag(sync=True)  #: the statistic the tree is painted by, per row id
    _scalars = traitlets.List().tag(sync=True)  #: the scalars of the output a gradient colouring may differentiate
    _panes = traitlets.List().tag(sync=True)    #: the row data providers' tab titles (`_providers.PROVIDERS`)

    def __init__(self, target: Any, *args: Any, key: Any = None, warm: bool | None = None,
                 batches: Any = None, grad_of: Any = None, static_argnums: Any = None,
                 static_argnames: Any = None, **kwargs: Any):
        super().__init__()
        self.leader: Leader | None = None
        try:
            #: Everything the explorer does, without the widget (`yax_widget.Session`).
            several = jax.process_count() > 1  # a multi-process job: the other processes follow (`_follow`)
            self.session = Session(target, *args, key=key,
                                   warm=False if several else in_kernel() if warm is None else warm,
                                   batches=batches, grad_of=grad_of, on_change=self._mirror,
                                   static_argnums=static_argnums, static_argnames=static_argnames, **kwargs)
            if several:  # what broadcasts each request to the processes that `follow`
                self.leader = Leader(self.session)
            self._mirror(self.session.state)
        except BaseException:
            # the widget (and its layout) registered itself and opened its comm: an explorer that failed
            # to open leaves neither behind, nor a worker thread
            self.close()
            raise
        self.on_msg(self._on_msg)
        # "copy as code" writes the names the caller gave, where its namespace says them unambiguously: a
        # notebook cell's or a script's top level (a function's locals are not names the notebook has)
        caller = inspect.currentframe()
        caller = caller.f_back if caller is not None else None
        if caller is not None and caller.f_code.co_name == "<module>":
            names = caller_names({**caller.f_globals, **caller.f_locals}, target, args, kwargs)
            if names is not None:
                self.session.names, self.session.names_given_to = names, "Explorer(...)"
        del caller

    def _mirror(self, changes: dict[str, Any]) -> None:
        """Copy changed entries of the session's state into the synced traits, in one message."""
        with self.hold_sync():
            for name, value in changes.items():
                setattr(self, "_" + name, value)

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        leader = self.leader
        self.send(_protocol.answer(self.session, content) if leader is None else leader.answer(content))

    # -- the Python API: the session's ------------------------------------------------------

    @property
    def mox(self) -> yax.Mox:
        """The current MoX."""
        return self.session.mox

    @property
    def params(self) -> Any:
        """The current parameters (first positional argument), or ``None``."""
        return self.session.params

    @property
    def original(self) -> yax.Mox:
        """The MoX the explorer was opened with."""
        return self.session.original

    @property
    def history(self) -> list[Change]:
        """The applied changes, oldest first (undone ones are not listed)."""
        return self.session.history

    @property
    def selection(self) -> list[Any]:
        """The nodes the current query selects."""
        return self.session.selection

    @property
    def comparison(self) -> yax.Comparison | None:
        """The last comparison of the current model (None at the original)."""
        return self.session.comparison

    @property
    def batch(self) -> str:
        """The name of the batch the values, colouring and comparison use."""
        return self.session.batch

    def add_replacement(self, name: str, repl: Any, *, code: str | None = None, doc: str | None = None,
                        cast: bool = False, keep: Any = None) -> None:
        """Offer ``repl`` (anything `yax.sub` accepts) in the palette as ``name``.
        ``code`` is the Python expression "copy as code" writes for it; ``cast``
        and ``keep`` are `yax.sub`'s options, for each drop of it (``cast=True``:
        a replacement computing in another dtype, its outputs cast back). A mapping
        from queries to precision policies (like `yax.default_policy`, offered as
        "bfloat16 compute") applies `yax.mixed_precision` inside the row it is dropped on.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> m = nn.Sequential([nn.Dense(4), nn.gelu, nn.Dense(2)]); x = jnp.ones((1, 3))
          >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
          >>> ex.add_replacement("GELU in bf16", lambda v: jax.nn.gelu(v.astype(jnp.bfloat16)), cast=True)
          >>> print(ex.substitute("//activation", "GELU in bf16"))
          replaced 1 node(s) selected by //activation with GELU in bf16
        """
        self.session.add_replacement(name, repl, code=code, doc=doc, cast=cast, keep=keep)

    def query(self, xpath: str) -> list[Any]:
        """Run ``xpath`` on the current MoX, highlight the matches in the UI
        and return them (`yax.query` semantics; non-node results are
        returned as they are and highlight nothing). A query that fails
        raises and changes nothing."""
        return self.session.query(xpath)

    def substitute(self, target: Any, name: str) -> str:
        """Replace ``target`` (a node of the current MoX, an XPath, or
        ``"query"`` for the current query's matches) with the replacement
        registered as ``name``; compare with the original. Returns the
        change's description. Raises `yax.YaxRewriteError` and changes
        nothing when it does not fit."""
        return self.session.substitute(target, name)

    def undo(self) -> None:
        """Go back one change (nothing happens at the original)."""
        self.session.undo()

    def redo(self) -> None:
        """Re-apply the change last undone (nothing happens at the newest)."""
        self.session.redo()

    def goto(self, index: int) -> None:
        """Make state ``index`` of the history current (0: the original; the
        changes after it stay, to redo), as a click on a history item does."""
        self.session.goto(index)

    def compare_with(self, base: str) -> None:
        """Compare the current model with ``"original"`` (the default), with
        ``"previous"``: the state just before it in the history, so the
        comparison shows what the last change alone did, or with a reference
        added by `add_reference` (by its name). Compares again now.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> from yax_widget import Explorer
          >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
          >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
          >>> _ = ex.substitute('//activation', "GELU (tanh)"); _ = ex.substitute('//activation', "GELU (tanh)")
          >>> ex.compare_with("previous"); ex.comparison.allclose  # GELU again changes nothing
          True
        """
        self.session.compare_with(base)

    def add_reference(self, reference: yax.Reference, name: str | None = None, names: Any = None) -> str:
        """Add a recorded run of another implementation (`yax.Reference`) to compare with:
        ``compare_with(name)`` (or the compare pane's "compare with" choice) then compares
        the original and the current model with it, one column each. ``names`` maps its
        module names where they differ, as in `yax.compare`. Returns the name.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn, numpy as np, yax
          >>> from yax_widget import Explorer
          >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
          >>> p = m.init(jax.random.key(0), x)
          >>> h = np.maximum(np.asarray(x @ p["params"]["layers_0"]["kernel"]), 0)  # "another implementation"
          >>> ex = Explorer(m, p, x)
          >>> ex.add_reference(yax.Reference({"0": h + 1e-6}, source="by hand"), names={"0": "Sequential/relu"})
          'by hand'
          >>> ex.compare_with("by hand"); ex.comparison.first_divergence is None
          True
        """
        return self.session.add_reference(reference, name, names)

    def export(self, stem: str | pathlib.Path = "yax_model", *, overwrite: bool = False) -> list[str]:
        """Save the current model to run without yax: ``{stem}.jax_exported``
        (`jax.export` of the function), ``{stem}.params.npz`` (the current
        parameters, by tree path), and ``{stem}.README.md`` and
        ``{stem}.manifest.json``, which say how to call it: ``exported.call(
        *params, *positional, **keywords)``, the inputs named and ordered as
        the explorer was given them (keyword inputs stay keywords), with
        their types, and the output's leaves it returns. Returns the paths
        written, in that order. Files that exist are not replaced unless
        ``overwrite=True`` (the export is refused, naming them).

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
        return self.session.export(stem, overwrite=overwrite)

    def save_html(self, path: str | pathlib.Path, *, overwrite: bool = False) -> pathlib.Path:
        """Save the explorer as it is to ``path``, one HTML file that opens from disk
        with no kernel and no network (for CI artifacts, papers and bug reports): the
        tree, the colouring, the comparison, the values of the row the values pane
        shows, the history and the diff, read-only (what needs the kernel is
        disabled; every number in it is one the kernel computed). The Save HTML
        button does the same with the rows open and selected in the UI, as
        ``{model}_snapshot.html`` next to the notebook. Refuses a path that is no
        ``.html`` file in an existing folder, or that exists unless ``overwrite=True``
        (`SnapshotPathError`). Returns the path written.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn, tempfile, os
          >>> from yax_widget import Explorer
          >>> m = nn.Sequential([nn.Dense(4), nn.relu]); x = jnp.ones((1, 3))
          >>> ex = Explorer(m, m.init(jax.random.key(0), x), x, warm=False)
          >>> p = ex.save_html(os.path.join(tempfile.mkdtemp(), "mlp.html"))
          >>> "snapshot saved by" in p.read_text() and "Sequential" in p.read_text()
          True
        """
        from ._snapshot import save_html

        return save_html(self.session, path, overwrite=overwrite)

    def code(self) -> str:
        """The `yax.sub` calls that turn the original into the current model,
        as a script fragment (``mox`` and ``params`` are the original's)."""
        return self.session.code()

    def add_batch(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Offer the inputs ``args`` (after the parameters, when the model has
        them) and ``kwargs`` (the example's, where not given) as the batch
        ``name``: the values, colouring, NaN search and comparison can use it.
        It must have the example's structure, shapes and dtypes (the model is
        traced once). A batch of the same name is replaced, and nothing measured
        on it is shown again; when it is the batch in use, the comparison, the
        colouring and the values show the new inputs at once.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> from yax_widget import Explorer
          >>> m = nn.Dense(2); x = jnp.ones((1, 3)); p = m.init(jax.random.key(0), x)
          >>> ex = Explorer(m, p, x, batches={"ones": x, "zeros": jnp.zeros((1, 3))})
          >>> ex.add_batch("twos", 2 * x)
          >>> ex.batch, ex.session.batches
          ('ones', ['ones', 'zeros', 'twos'])
        """
        self.session.add_batch(name, *args, **kwargs)

    def use_batch(self, name: str) -> None:
        """Show values, colours and the comparison on the batch ``name``."""
        self.session.use_batch(name)

    def values(self, target: Any) -> dict[str, Any]:
        """Statistics of the outputs of ``target`` (a node of the current model,
        or an XPath selecting one) on the batch in use, computed on the device
        as the values pane shows them; the UI is not changed.

        Example:
          >>> import jax, jax.numpy as jnp, flax.linen as nn
          >>> from yax_widget import Explorer
          >>> m = nn.Sequential([nn.Dense(4), nn.relu]); x = jnp.ones((2, 3))
          >>> ex = Explorer(m, m.init(jax.random.key(0), x), x)
          >>> s = ex.values('//activation')["out"]
          >>> s.type, s.min >= 0
          ('f32[2,4]', True)
        """
        return self.session.values(target)

    def close(self) -> None:
        """Close the widget, stop its worker thread and let go of the
        measured values (the history stays readable; later commands are refused)."""
        session = getattr(self, "session", None)  # None when opening it failed (then `__del__` closes it again)
        if session is not None:
            session.close()
        leader = getattr(self, "leader", None)
        if leader is not None:
            leader.close()  # the processes that follow stop
        layout = getattr(self, "layout", None)  # made with the widget, and registered like it
        if layout is not None:
            layout.close()
        super().close()
