"""The explorer's view inside the model: a row's values, the tree painted by a
statistic, the first NaN or Inf, and what each says for the batch in use.

Values are reduced where the model runs (``_reduce``; gradients: ``_gradients``).
Call outputs are read off the session's measurements (`compare`'s: the original's,
made when the explorer opens, and the current model's, made by its comparison); a
model measured by nothing is run by `yax.capture` (one program per model, compiled
once) and its outputs stay on the device. Selecting a row reduces that row's outputs
to statistics, a histogram and a heatmap slice in a small jitted function (compiled
once per shape), and only those cross to the host. Equations are captured one by one
when selected. Results are kept per model, batch and row, so selecting a row
again is instant; nothing here changes the model or the history.

`Inspector` is the session's part that holds these values; the formats
are in docs/widget.md ("Values").
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

import jax

import yax
from yax.errors import NotOneNode, where
from yax.internal import ValueStats, capture_keys, node_ids

from ._costs import COST_STATS
from ._gradients import Gradients, Scalar, equation_grad_entries
from ._payloads import number
from ._reduce import Boundaries, equation_entries

if TYPE_CHECKING:
    from ._session import Session

STATS = {"norm": "norm of the outputs", "zeros": "fraction of zeros", "nonfinite": "fraction of NaN or Inf",
         "grad": "gradient norm", "gxa": "gradient × activation", **COST_STATS}
GRAD_STATS = ("grad", "gxa")  # the colourings by the gradient of a scalar of the output (`Scalar`)
SCALARS = {"loss": "the loss (`grad_of`)", "logit": "a logit", "sum": "the sum of the output"}

#: What values, colouring, the NaN search and the comparison say for a model opened with abstract parameters.
NO_VALUES = yax.errors.NO_VALUES


def value_stats(entry: dict) -> ValueStats:
    """A values-pane entry as `yax.internal.ValueStats` (what `Explorer.values` returns)."""
    nan = float("nan")
    return ValueStats(entry["type"], *(nan if entry[k] is None else entry[k] for k in ("min", "max", "mean", "std")),
                      entry["nan"], entry["posinf"], entry["neginf"], entry["zeros"], entry["size"])


class Inspector:
    """The values pane and the colouring of one `Session`: each row's values on the
    batch in use, computed on the device and kept per model, batch and row; with a
    gradient colouring, the gradient of its `Scalar` at each row too."""

    def __init__(self, session: Session):
        self._session = session
        # Each value is kept under the model and the batch's key (`Session.batch_key`), never its
        # name: a batch added again under its name is measured anew.
        self._bounds: tuple[Any, int, Boundaries] | None = None  # (model, batch, its boundaries): the latest
        self._shown: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, id): entry}
        self._grads: tuple[Any, int, tuple, Gradients] | None = None  # (model, batch, scalar key, gradients)
        self._gshown: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, key, id): grad}
        self._scalars: dict[tuple, Scalar] = {}
        self.active: Scalar | None = None  # the scalar a gradient colouring differentiates: the Values tab shows it

    def clear(self) -> None:
        """Let go of every value held."""
        self._bounds, self._shown = None, weakref.WeakKeyDictionary()
        self._grads, self._gshown = None, weakref.WeakKeyDictionary()

    def scalars(self) -> list[dict]:
        """The scalars the UI offers to differentiate, the default first."""
        kinds = ["loss", "logit", "sum"] if self._session._grad_of is not None else ["logit", "sum"]
        return [{"name": k, "label": SCALARS[k]} for k in kinds]

    def scalar(self, kind: Any, index: Any = None) -> Scalar:
        """The `Scalar` of ``kind`` and ``index``: one object each, so that each compiles once."""
        if kind not in SCALARS or (kind == "loss" and self._session._grad_of is None):
            offered = ", ".join(s["name"] for s in self.scalars())
            raise yax.YaxInputError(f"The gradient is taken of one of {offered}; not {str(kind)[:40]!r}"
                                    + (" (the explorer was opened without `grad_of`)" if kind == "loss" else "")
                                    + ".")
        if index is not None and (kind != "logit" or not isinstance(index, int) or isinstance(index, bool)
                                  or index < 0):
            raise yax.YaxInputError(f"A logit's index is a whole number from 0, not {str(index)[:40]!r}; "
                                    "only `logit` takes one.")
        key = (kind, index)
        found = self._scalars.get(key)
        if found is None:
            found = self._scalars[key] = Scalar(kind, index, self._session._grad_of)
        return found

    def values(self, target: Any) -> dict[str, ValueStats]:
        """Statistics of the outputs of ``target`` (a node of the current model,
        or an XPath selecting one) on the batch in use (`Explorer.values`)."""
        if isinstance(target, str):
            found = yax.query(target, self._session.mox)
            found = [n for n in found if isinstance(n, (yax.Mox, yax.Equation))] if isinstance(found, list) else []
            if len(found) != 1:
                raise NotOneNode("values", target, len(found))
            target = found[0]
        return {e["name"]: value_stats(e) for e in self.row(target)["outputs"]}

    def boundaries(self) -> Boundaries:
        s = self._session
        mox = s.mox
        if self._bounds is None or self._bounds[0] is not mox or self._bounds[1] != s.batch_key:
            self._bounds = None  # let go of the previous values before the device holds the new ones
            found = self._measured(mox)
            self._bounds = (mox, s.batch_key, found or Boundaries.run(mox, *s.call_args()))
        return self._bounds[2]

    def _measured(self, mox: yax.Mox) -> Boundaries | None:
        """``mox``'s rows read off the session's measurement of it on the batch in use (the
        original's, made on the worker when the explorer opened; the current model's, made
        by its comparison), or None where there is none or they cannot be."""
        s = self._session
        if s.abstract or not (s.args or s.kwargs):
            return None
        try:
            m = s.worker.measured(mox)
        except Exception:  # measuring failed (the comparison says why): the colouring runs the model itself
            return None
        return None if m is None or m.taps is None or m.shaped else Boundaries.measured(mox, m.taps)

    def gradients(self, scalar: Scalar) -> Gradients:
        """The gradient of ``scalar`` at every call row of the current model on the batch in use."""
        s = self._session
        mox = s.mox
        g = self._grads
        if g is None or g[0] is not mox or g[1] != s.batch_key or g[2] != scalar.key:
            self._grads = None  # let go of the previous gradients first
            args, kwargs = s.call_args()
            self._grads = (mox, s.batch_key, scalar.key, Gradients(mox, scalar, args, kwargs, s.batch))
        return self._grads[3]

    def row(self, node: Any) -> dict:
        """The values pane's state for ``node`` (cached per model, batch and node), with
        the gradient of the `active` scalar at its outputs when a gradient colouring is on."""
        s = self._session
        mox = s.mox
        args, kwargs = s.call_args()
        rid = node_ids(mox).get(id(node))
        if rid is None:
            raise yax.YaxInputError(f"{where(node, start=True)} is not part of the current model. "
                                    "Query `explorer.mox` for it.")
        cache = self._shown.setdefault(mox, {})
        entry = cache.get((s.batch_key, rid))
        if entry is None:
            t = time.perf_counter()
            found = self.boundaries().entries(rid) if isinstance(node, yax.Mox) else None
            if found is None:  # an equation (or a call inside a loop or branch: refused, saying why)
                _, got = yax.capture(node, mox, *args, **kwargs)
                found = equation_entries(node, got[capture_keys(mox)[id(node)]])
            outputs, more = found
            cache[(s.batch_key, rid)] = entry = {
                "id": rid, "key": capture_keys(mox)[id(node)], "batch": s.batch, "outputs": outputs, "more": more,
                "seconds": round(time.perf_counter() - t, 3)}
        if self.active is None:
            return entry
        return {**entry, "grad": self.grad_row(node, rid, self.active)}

    def grad_row(self, node: Any, rid: int, scalar: Scalar) -> dict:
        """The gradient of ``scalar`` at ``node``'s outputs, summarised as its values are."""
        s = self._session
        mox = s.mox
        cache = self._gshown.setdefault(mox, {})
        hit = cache.get((s.batch_key, scalar.key, rid))
        if hit is not None:
            return hit
        t = time.perf_counter()
        grads = self.gradients(scalar)
        outputs = grads.entries(rid) if isinstance(node, yax.Mox) else None
        if outputs is None:  # an equation: its own capture with the gradient
            args, kwargs = s.call_args()
            _, got, gs = yax.capture(node, mox, *args, grad_of=scalar, **kwargs)
            k = capture_keys(mox)[id(node)]
            outputs = equation_grad_entries(node, got[k], gs[k])
        cache[(s.batch_key, scalar.key, rid)] = found = {
            "label": grads.label(), "what": grads.what(), "scalar": grads.value, "outputs": outputs,
            "seconds": round(time.perf_counter() - t, 3)}
        return found

    def show(self, node: Any) -> dict:
        """Show ``node``'s values in the pane."""
        entry = self.row(node)
        self._session.show(values=entry)
        return entry

    def paint(self, stat: str, scalar: Any = None, index: Any = None) -> None:
        """Paint every call row by ``stat`` ("off": nothing); a gradient statistic
        (`GRAD_STATS`) by the gradient of the scalar ``scalar`` (`Scalar`; its default:
        the loss when the explorer has `grad_of`, else the logit) with ``index``. The colouring,
        the scalar and the Values tab change together or not at all (`Session.all_or_nothing`)."""
        if stat not in ("off", *STATS):
            raise yax.YaxInputError(f"The tree is painted by one of off, {', '.join(STATS)}; not {str(stat)[:40]!r}.")
        with self._session.all_or_nothing():
            self._paint(stat, scalar, index)

    def _paint(self, stat: str, scalar: Any, index: Any) -> None:
        before = self.active
        if stat in COST_STATS:  # the compiled program's: shapes only, so structure-only mode too
            self.active = None
            self._session.show(overlay=self._session.costs.overlay(stat))
        elif stat not in GRAD_STATS:
            self.active = None
            if stat == "off":
                self._session.show(overlay={})
            else:
                t = time.perf_counter()
                vals = {str(rid): number(v) for rid, v in self.boundaries().stats(stat).items()}
                shown = [v for v in vals.values() if v is not None]
                self._session.show(overlay={
                    "stat": stat, "label": STATS[stat], "batch": self._session.batch, "values": vals,
                    "lo": min(shown) if shown else None, "hi": max(shown) if shown else None,
                    "rows": len(vals), "seconds": round(time.perf_counter() - t, 3)})
        else:
            t = time.perf_counter()
            sc = self.scalar(scalar or self.scalars()[0]["name"], index)
            grads = self.gradients(sc)
            norms, gxa, why = grads.rows()
            got = norms if stat == "grad" else gxa
            vals = {str(rid): v for rid, v in got.items()}
            shown = [v for v in vals.values() if v is not None]
            self.active = sc
            self._session.show(overlay={
                "stat": stat, "label": STATS[stat], "batch": self._session.batch, "values": vals,
                "why": {str(rid): w for rid, w in why.items()},
                "nonfinite": {str(rid): n for rid, n in grads.overlay["nonfinite"].items()},
                "scalar": {"name": sc.kind, "index": sc.index, "chosen": grads.index if grads.index >= 0 else None,
                           "label": grads.label(), "what": grads.what(), "value": grads.value},
                "lo": min(shown) if shown else None, "hi": max(shown) if shown else None,
                "rows": len(vals), "seconds": round(time.perf_counter() - t, 3)})
        if self.active is not before:  # the Values tab shows the gradient with the values, or no more
            rid = self._session.state["values"].get("id")
            if rid is not None:
                try:
                    self.show(self._session.node(rid))
                except yax.YaxError:
                    self._session.show(values={})

    def batch_changed(self) -> None:
        """The batch in use changed: paint and show the selected row's values on it."""
        s = self._session
        o = s.state["overlay"]
        if o.get("stat"):
            sc = o.get("scalar") or {}
            self.paint(o["stat"], sc.get("name"), sc.get("index"))
        rid = s.state["values"].get("id")
        if rid is not None:
            try:
                self.show(s.node(rid))
            except Exception:  # the row is another model's: the pane waits for a selection
                s.show(values={})

    def nonfinite(self, scalar: Scalar | None = None) -> dict:
        """Where the first NaN or Inf of the current model on the batch in use is (with
        ``scalar``: of the gradient of that scalar, with respect to the parameters):
        the reply the front-end selects a row by."""
        s = self._session
        args, kwargs = s.call_args()
        if scalar is None:
            found = yax.first_nonfinite(s.mox, *args, **kwargs)
        else:
            found = yax.first_nonfinite(s.mox, *args, grad_of=scalar, **kwargs)
        what = "" if scalar is None else f", gradient of {scalar.describe(self._leaf(scalar))}"
        if found is None:
            if scalar is None:
                return {"found": False, "message": f"No NaN or Inf: every value is finite on the batch `{s.batch}`."}
            return {"found": False, "message": f"No NaN or Inf in the gradient: every gradient of "
                                               f"{scalar.describe(self._leaf(scalar))} is finite on the batch "
                                               f"`{s.batch}`."}
        ids = node_ids(s.mox)
        # the first line (an equation's) or paragraph (an argument's: its layer and first reader). A
        # masked one says first that every gradient is finite; its row is where the non-finite cotangent came from
        head = str(found).split("\n")[0] if found.equation is not None else \
            " ".join(line.strip() for line in str(found).split("\n\n")[0].split("\n"))
        first = found.equation or found.reader
        return {"found": True, "id": ids.get(id(found.call)) if found.call is not None else None,
                "eq": ids.get(id(first)) if first is not None else None, "masked": found.masked,
                "step": list(found.step), "message": f"{head} (batch `{s.batch}`{what})", "detail": str(found.output)}

    def _leaf(self, scalar: Scalar) -> tuple[str, int] | None:
        """The logits' name and rank for ``scalar``'s description, read off the model's traced outputs."""
        if scalar.kind == "loss":
            return None
        mox = self._session.mox
        name, x = scalar.logits(mox.sig.results([jax.ShapeDtypeStruct(o.shape, o.dtype) for o in mox.outputs]))
        return name, len(x.shape)
