"""The compare worker: the thread of one session that compiles, runs and compares its
models (the original's measurement first, then each change's, in order), what it keeps of
those measurements, and the comparison it shows: of the current model with the original,
with the state before it, or with a recorded reference."""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import jax

import yax
from yax import Mox
from yax.internal import Measured, compare_gradients, compare_measured, measure, paired_outputs

from . import _payloads
from ._values import NO_VALUES

if TYPE_CHECKING:
    from ._batches import NamedBatch
    from ._session import Change, Session


class CompareWorker:
    """The comparing of one `Session`. One thread runs the models; XLA compiles without
    holding the GIL, so the session rebuilds its tree on its own thread meanwhile. The
    thread starts on first use and stops with `close` (or when the session is collected).

    What was measured is kept under the serial of the batch it was measured on
    (`NamedBatch`), and stored under a lock only while the session is open: `close` lets
    go of it even when a measurement ends after it."""

    #: With a reference as the base, the history states compared with it besides the original: the
    #: current one and up to this many before it (each compiles once; `compare` keeps its program).
    REFERENCE_COLUMNS = 4

    def __init__(self, session: Session, key: Any, grad_of: Any):
        self._session = session
        self._key, self._grad_of = key, grad_of
        self.references: dict[str, tuple[yax.Reference, Any]] = {}  # name -> (reference, its `names`)
        self._held = threading.Lock()
        self.closed = False
        # What was measured, each under the serial of the batch it was measured on (`NamedBatch`):
        # the original's values on each batch used so far,
        self.refs: dict[int, Measured] = {}
        # a previous state's, for "previous" (the last one measured),
        self.base_values: tuple[Mox, int, Measured] | None = None
        # and the current model's, as its comparison measured it: the values pane and colouring read it.
        self.current: tuple[Mox, int, Measured] | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.warmer: Future | None = None  # the original's measurement started by `warm`

    @property
    def reference(self) -> Measured | None:
        """The original's values on the batch in use, once measured."""
        return self.refs.get(self._session.inputs.in_use.serial)

    def _worker(self) -> ThreadPoolExecutor:
        self._session.check_open()  # a closed session starts no thread again
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="yax-explorer")
            weakref.finalize(self._session, _stop, self.pool)
        return self.pool

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the worker thread, between two measurements: its result."""
        return self._worker().submit(fn).result()

    def warm(self, batch: NamedBatch) -> None:
        """Measure the original on ``batch`` (compile, run, fetch its outputs and module
        boundaries) while the user looks at the tree: each substitution then runs only the
        modified model. The thread is no daemon: a script that exits meanwhile waits for XLA
        rather than aborting in it."""
        self.warmer = self._worker().submit(self._warm, batch)

    def _warm(self, batch: NamedBatch) -> None:
        try:
            jax.random.fold_in(self._key, 1)  # the first change's key: folding compiles once (0.05 s)
            self._original_values(batch)
        except Exception:  # the first real compare reports any problem, with context
            pass

    def _original_values(self, batch: NamedBatch) -> Measured:
        """The original's outputs and boundary values on ``batch``, measured
        once: they never change while the explorer lives (on the worker)."""
        s = self._session
        ref = self.refs.get(batch.serial)
        if ref is None:
            idx, _ = paired_outputs(s.original, s.original)
            ref = measure(s.original, batch.args, batch.kwargs, idx)
            with self._held:
                if not self.closed and (batch is s.inputs.in_use or s.inputs.named.get(batch.name) is batch):
                    self.refs[batch.serial] = ref  # (not for a batch replaced meanwhile)
        return ref

    def forget(self, batch: NamedBatch) -> None:
        """Let go of the values measured on ``batch`` (replaced: nothing asks for them again)."""
        self.refs.pop(batch.serial, None)

    def start(self) -> tuple[Future, float, str] | None:
        """Start comparing the current model with the original (or the previous
        state, `Session.compare_with`) on the worker, both on the batch in use."""
        s = self._session
        self.current = None  # another model's: let go of it
        against = self.references.get(s.state["compare_base"])
        if against is not None and (s.args or s.kwargs) and not s.abstract:
            s.status("compiling and comparing with the reference…", busy=True)
            batch = s.inputs.in_use
            future = self._worker().submit(self._measure_reference, against, s.mox, s.params, s.index, batch)
            return future, time.perf_counter(), s.state["compare_base"]
        if s.index == 0 or not (s.args or s.kwargs) or s.abstract:
            return None
        previous = s.state["compare_base"] == "previous" and s.index >= 2  # before the first: the original
        base = s.states[s.index - 1] if previous else None
        s.status("compiling and comparing…", busy=True)
        t = time.perf_counter()
        batch = s.inputs.in_use  # measured on explicitly: the batch in use may change before the worker starts
        lowered = threading.Event()
        future = self._worker().submit(self._measure, s.mox, s.params, batch, lowered, base)
        future.add_done_callback(lambda _: lowered.set())  # also when it fails
        if batch.serial in self.refs:
            # Tracing and lowering hold the GIL like the tree rebuild does; XLA's compile, next, does
            # not: the tree is rebuilt during the compile. (Before the original is measured, the
            # tree goes first: that measurement takes longer than the tree.)
            lowered.wait()
        return future, t, "previous" if previous else "original"

    def _measure(self, mox: Mox, params: Any, batch: NamedBatch, lowered: threading.Event,
                 base: Change | None = None) -> yax.Comparison:
        """The comparison of ``mox`` (with ``params``) and the original, or ``base``,
        both measured on ``batch`` (on the worker)."""
        s = self._session
        c = self._measure_values(mox, params, batch, lowered, base)
        if self._grad_of is None:
            return c
        if base is None and not s.has_params:
            raise yax.YaxInputError("`grad_of` compares gradients with respect to the parameters, but this model "
                                    "takes none. Open the explorer with the parameters as the first argument.")
        before = s.original if base is None else base.mox
        args_a = batch.args if base is None else batch.args_with(base.params, s.has_params)
        return dataclasses.replace(c, gradients=compare_gradients(before, mox, args_a,
                                                                  batch.args_with(params, s.has_params),
                                                                  batch.kwargs, self._grad_of))

    def _measure_reference(self, against: tuple[yax.Reference, Any], mox: Mox, params: Any, index: int,
                           batch: NamedBatch) -> yax.Comparisons:
        """The original and the states of the history up to the current one (the last
        `REFERENCE_COLUMNS` of them), each compared with a reference, on ``batch``."""
        s = self._session
        ref, names = against
        models: dict[str, Any] = {s.state["compare_base"]: ref}
        for i in [0, *range(max(1, index - self.REFERENCE_COLUMNS + 1), index + 1)]:
            state = s.states[i]
            m, p = (mox, params) if i == index else (state.mox, state.params if i else batch.args[0])
            models["original" if i == 0 else f"step {i}"] = (m, p) if s.has_params else m
        return yax.compare_all(models, *batch.args, names=names, **batch.kwargs)

    def _measure_values(self, mox: Mox, params: Any, batch: NamedBatch, lowered: threading.Event,
                        base: Change | None = None) -> yax.Comparison:
        s = self._session
        args = batch.args_with(params, s.has_params)
        if base is None:
            _, idx = paired_outputs(s.original, mox)
            ref = self._original_values(batch)
            # measured the way the original was (jitted, or op by op for chains of tiny calls)
            return compare_measured(s.original, mox, ref, self._keep(mox, batch, measure(
                mox, args, batch.kwargs, idx, lowered=lowered, eager=ref.eager)))
        base_idx, idx = paired_outputs(base.mox, mox)
        cached = self.base_values  # the last base measured: stepping forward measures each state once more
        if cached is None or cached[0] is not base.mox or cached[1] != batch.serial:
            cached = (base.mox, batch.serial, measure(base.mox, batch.args_with(base.params, s.has_params),
                                                      batch.kwargs, base_idx,
                                                      eager=self._original_values(batch).eager))
            with self._held:
                if not self.closed:
                    self.base_values = cached
        return compare_measured(base.mox, mox, cached[2], self._keep(mox, batch, measure(
            mox, args, batch.kwargs, idx, lowered=lowered, eager=cached[2].eager)))

    def _keep(self, mox: Mox, batch: NamedBatch, m: Measured) -> Measured:
        """``m``, kept as the current model's values on ``batch`` (on the worker)."""
        with self._held:
            if mox is self._session.mox and not self.closed:
                self.current = (mox, batch.serial, m)
        return m

    def measured(self, mox: Mox) -> Measured | None:
        """What was measured of ``mox`` on the batch in use: the original's (measured
        now if need be), or the current model's as its comparison measured it (waiting
        for a comparison under way); None where nothing was."""
        s = self._session
        batch = s.inputs.in_use
        if mox is s.original:
            return self.run(lambda: self._original_values(batch))
        found = self.run(lambda: self.current)
        return found[2] if found is not None and found[0] is mox and found[1] == batch.serial else None

    def finish(self, compared: tuple[Future, float, str] | None
               ) -> tuple[yax.Comparison | None, yax.Comparisons | None, dict[str, Any]]:
        """What the comparison `start` started (``compared``) shows, once made: the current
        model's comparison, with a reference as the base the comparisons of the history with
        it, and the entries of the session's `state` that show them."""
        s = self._session
        if compared is None:
            changes: dict[str, Any] = {
                "comparison": {"message": NO_VALUES} if s.abstract and (
                    s.index or s.state["compare_base"] in self.references) else
                {} if s.args or s.kwargs else {"message": "no example inputs to compare on"}}
            if s.state["status"].get("message"):  # "compared in …" was about a change no longer applied
                changes["status"] = {"busy": False, "message": ""}
            return None, None, changes
        future, t, base = compared
        try:
            c = future.result()
        except Exception as e:  # the change stands; its comparison says why it could not be made
            return None, None, {"comparison": _payloads.comparison_failure(e),
                                "status": {"busy": False, "message": "comparison failed"}}
        seconds = time.perf_counter() - t
        comparisons = None
        if isinstance(c, yax.Comparisons):  # with a reference: the current model's is the comparison
            comparisons = c
            c = c.against_first[c.names[-1]]  # the current state's, the last column
            state = {**_payloads.comparison_state(c, s.mox, seconds), "base": base,
                     **_payloads.columns_state(comparisons, s.mox)}
        else:
            state = {**_payloads.comparison_state(c, s.mox, seconds), "base": base}
        return c, comparisons, {"comparison": state,
                                "status": {"busy": False, "message": f"compared in {seconds:.2f} s"}}

    def close(self) -> None:
        """Stop the thread and let go of the measured values. A measurement the thread is
        making meanwhile ends, and is not kept."""
        with self._held:
            self.closed = True
            self.base_values, self.refs, self.current = None, {}, None
        pool, self.pool = self.pool, None
        if pool is not None:
            _stop(pool)


def _stop(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
