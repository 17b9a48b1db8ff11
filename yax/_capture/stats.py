"""What the NaN search and the explorer report about values: `ValueStats`, `NonFinite`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._ir import Equation, Mox
from .._sharding import reduced_stats, spread, subnormal_count, to_host
from .._vocab import type_str


@dataclasses.dataclass(frozen=True)
class ValueStats:
    """Statistics of one array: its type, the range, mean and standard
    deviation of its finite values, and counts of NaN, ±Inf and zeros."""

    type: str
    min: float
    max: float
    mean: float
    std: float
    nan: int
    posinf: int
    neginf: int
    zeros: int
    size: int

    @classmethod
    def of(cls, x: Any) -> ValueStats:
        """The statistics of ``x``: in NumPy (float64) on the host, or, for an array
        laid out over several devices, reduced where it is (float32; float64 values in
        float64), unless it holds subnormal values, which XLA reads as 0 (then on the host).
        The mean and std are of the values scaled by the largest |value|, so that no sum or
        square overflows (1e300 in float64)."""
        size = int(np.size(x))
        try:
            dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
        except TypeError:  # an extended dtype (a PRNG key's): no statistics
            dtype = np.dtype(object)
        if not (jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_):  # jnp's knows bfloat16 and float8
            return cls(type_str(x), np.nan, np.nan, np.nan, np.nan, 0, 0, 0, 0, size)
        if spread(x) and not int(subnormal_count(x)):
            stats, counts = to_host(reduced_stats(x))
            n, nan, posinf, neginf, zeros = (int(c) for c in counts)
            lo, hi, mean, std = (float(v) if n else float("nan") for v in stats)
            return cls(type_str(x), lo, hi, mean, std, nan, posinf, neginf, zeros, size)
        a = np.asarray(x)
        f = a.astype(np.float64) if not np.iscomplexobj(a) else np.abs(a).astype(np.float64)
        fin = f[np.isfinite(f)]
        counts = (int(np.isnan(f).sum()), int(np.isposinf(f).sum()), int(np.isneginf(f).sum()), int((f == 0).sum()))
        if not fin.size:
            return cls(type_str(x), np.nan, np.nan, np.nan, np.nan, *counts, size)
        big = float(np.abs(fin).max()) or 1.0
        scaled = fin / big
        return cls(type_str(x), float(fin.min()), float(fin.max()), big * float(scaled.mean()),
                   big * float(scaled.std()), *counts, size)

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def __str__(self) -> str:
        bad = [f"{n} {w}" for n, w in ((self.nan, "NaN"), (self.posinf, "+Inf"), (self.neginf, "-Inf")) if n]
        if self.nonfinite == self.size and self.size:
            return f"{self.type}  no finite values ({', '.join(bad)})"
        return (f"{self.type}  min {self.min:.4g}  max {self.max:.4g}  mean {self.mean:.4g}  std {self.std:.4g}"
                + (f"  ({', '.join(bad)} of {self.size})" if bad else ""))


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """Where a model's first NaN or Inf comes from (`first_nonfinite`).

    Attributes:
      equation: the first equation, in evaluation order, whose output holds a
        NaN or an Inf (``None`` when an argument holds one already).
      call: the innermost call it ran in (a module call or activation;
        ``None`` at the root).
      path: that call's path, or the argument's name (``args[1]``).
      step: the scan steps it ran in, outermost scan first (``()`` outside scans).
      output: statistics of the non-finite output at that step.
      inputs: statistics of the equation's inputs at that step.
      call_inputs: statistics of the call's inputs at that step.
      window: the printed MoX around the equation, marked with ``>>>``.
      reader: when an argument holds the NaN or Inf: the first equation that reads it
        (``call`` is the call it runs in, ``step`` the layers of a stacked argument that
        hold non-finite values, when a scan slices it per step).
      direction: ``"forward"``, or ``"backward"`` for the first non-finite
        gradient (`first_nonfinite` with ``grad_of``). Then ``equation`` is the
        forward equation whose derivative rule produced it (``None`` when the
        loss's own gradient is non-finite, ``path`` then naming the output),
        ``output`` the cotangent it sent to its input ``input_index``,
        ``inputs`` the forward values the rule used, ``cotangents`` the
        cotangents that came in at its outputs (finite), and ``backward`` the
        first primitive of the rule whose result is non-finite. It is the
        first equation, in the order the backward pass runs, whose non-finite
        cotangent reaches the gradients; ``path`` names an argument
        (``args[0]...``) when only adding up the finite cotangents sent to it
        overflowed.
      masked: backward only: every gradient with respect to the differentiated
        arguments is finite, though a non-finite cotangent appears on the way:
        the one described above, which a later rule drops (a ``relu`` or
        ``where`` sends zeros where its branch was not taken).
      masked_by: then the first equation, in backward order, whose rule received
        a non-finite cotangent and sent only finite ones (``None`` if none was
        found), ``masked_call`` the call it ran in and ``masked_step`` its scan steps.
    """

    equation: Equation | None
    call: Mox | None
    path: str
    step: tuple[int, ...]
    output: ValueStats
    inputs: tuple[ValueStats, ...] = ()
    call_inputs: tuple[ValueStats, ...] = ()
    window: str = dataclasses.field(default="", repr=False)
    reader: Equation | None = dataclasses.field(default=None, repr=False)
    direction: str = "forward"
    cotangents: tuple[ValueStats, ...] = ()
    backward: str = ""
    input_index: int = 0
    masked: bool = False
    masked_by: Equation | None = dataclasses.field(default=None, repr=False)
    masked_call: Mox | None = dataclasses.field(default=None, repr=False)
    masked_step: tuple[int, ...] = ()

    def __str__(self) -> str:
        if self.direction == "backward":
            return self._backward_str()
        at = f" at scan step {', '.join(map(str, self.step))}" if self.step else ""
        if self.equation is None:
            head = f"The argument `{self.path}` already holds non-finite values: {self.output}"
            if self.step:
                head += (f"\n  They are in layer {self.step[0]} of the stack (the scan slices the argument per step; "
                         f"step {self.step[0]} is the first to read them).")
            if self.reader is not None:
                who = f"`{self.call.path}` ({self.call.type})" if self.call is not None else "the root"
                head += f"\n  The first to read it is `{self.reader.name}` in {who}."
            return head + (f"\n\n{self.window}" if self.window else "")
        lines = [f"The first non-finite value comes from `{self.equation.name}` in `{self.path or 'the root'}`{at}.",
                 f"  output   {self.output}"]
        lines += [f"  input {i}  {s}" for i, s in enumerate(self.inputs)]
        return self._ending(lines)

    def _backward_str(self) -> str:
        at = f" at scan step {', '.join(map(str, self.step))}" if self.step else ""
        if self.equation is None and self.path.startswith("args"):
            return (f"The gradient with respect to `{self.path}` is {self.output}, though every cotangent sent to it "
                    "is finite: adding them up overflowed.")
        if self.equation is None:
            if self.masked:
                return (f"No non-finite gradient: every gradient is finite. A non-finite cotangent comes from the "
                        f"loss itself, its gradient with respect to the model's output `{self.path}`. "
                        f"{self._masked()}\n  gradient of `grad_of` with respect to `{self.path}`  {self.output}")
            return (f"The first non-finite gradient comes from the loss itself: the gradient of `grad_of` with "
                    f"respect to the model's output `{self.path}` is {self.output}")
        rule = f" (its `{self.backward}`)" if self.backward else ""
        where = f"`{self.path}`" if self.path else "the root"
        origin = (f"the backward pass of `{self.equation.name}` in {where}{at}: its derivative rule{rule} sent a "
                  f"non-finite cotangent to input {self.input_index}")
        head = (f"No non-finite gradient: every gradient is finite. A non-finite cotangent comes from {origin}. "
                f"{self._masked()}" if self.masked else f"The first non-finite gradient comes from {origin}.")
        lines = [head, f"  cotangent sent to input {self.input_index}  {self.output}"]
        lines += [f"  cotangent in {i}  {s}" for i, s in enumerate(self.cotangents)]
        lines += [f"  input {i} (forward)  {s}" for i, s in enumerate(self.inputs)]
        if any(s.nonfinite for s in self.cotangents):
            lines.append("  The cotangent that came in is not finite, though every reader of the output sent a "
                         "finite one: adding them up overflowed.")
        if any(s.nonfinite for s in self.inputs):
            lines.append("  Its forward inputs already hold non-finite values: the forward pass went wrong first "
                         "(`first_nonfinite` without `grad_of` finds where).")
        return self._ending(lines)

    def _masked(self) -> str:
        """Where the non-finite cotangent of a `masked` result died."""
        if self.masked_by is None:
            return "It is masked before it reaches the gradients."
        at = f" at scan step {', '.join(map(str, self.masked_step))}" if self.masked_step else ""
        call = self.masked_call
        where = f"`{call.path}` ({call.type})" if call is not None else "the root"
        return (f"It is masked before it reaches the gradients: the backward pass of `{self.masked_by.name}` in "
                f"{where}{at} received it and sent only finite cotangents.")

    def _ending(self, lines: list[str]) -> str:
        """``lines``, then the inputs of the call the equation ran in and the printed MoX around it."""
        if self.call is not None:
            lines.append(f"  inputs of `{self.call.path}` ({self.call.type}):")
            lines += [f"    {i}  {s}" for i, s in enumerate(self.call_inputs)]
        if self.window:
            lines += ["", self.window]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))
