"""Seeing inside a model: `capture` the values (and gradients) at matched nodes,
`patch` them, and find the `first_nonfinite` value or gradient.

One module a concern: `plan` (which nodes, where, their keys), `hooks`
(evaluation that watches or replaces values, inside jit/remat/scan bodies),
`programs` (jitted once per MoX, pattern and mode; the ``"grad"`` mode adds a
zero at each target and differentiates the loss with respect to it),
`functions` (`capture`, `patch`), `stats` (`ValueStats`, `NonFinite`),
`nonfinite` (the NaN search) and `backward` (its backward-pass twin).

All three evaluate the MoX with `_eval.run` and a `Hooks` subclass that looks
at (or replaces) values as calls and equations finish. Matched nodes may sit
inside nested computations; those on the way down are evaluated so that the
values come out:

* ``jit`` bodies are evaluated in place (XLA inlines them anyway);
* ``remat`` bodies run under ``jax.checkpoint`` with the same policy, the
  values leaving as extra outputs;
* ``scan`` bodies run under ``jax.lax.scan``, the values leaving as extra
  ``ys``, stacked along the scan axis (patches enter as extra ``xs``).

Everything else is bound as traced, so a program that captures nothing extra
is the original one. Loops of unknown length (``while``), branches
(``cond``) and custom derivative rules cannot give values out; a match inside
them is refused with the reason. The forward NaN search also looks inside
custom derivative rules; the backward one takes them (and ``cond``, ``while``)
as wholes, since JAX runs their rules, not their bodies' derivatives.

Programs are jitted once per MoX, pattern and mode, and kept while the MoX
lives (like `compare`'s): a sweep over patch values compiles once.
"""

from .functions import capture as capture
from .functions import patch as patch
from .nonfinite import first_nonfinite as first_nonfinite
from .plan import capturable_calls as capturable_calls
from .plan import capture_keys as capture_keys
from .plan import plan_of as plan_of
from .plan import results_of as results_of
from .programs import capture_programs as capture_programs
from .programs import watched as watched
from .stats import NonFinite as NonFinite
from .stats import ValueStats as ValueStats

__all__ = ["NonFinite", "ValueStats", "capturable_calls", "capture", "capture_keys", "capture_programs", "results_of",
           "first_nonfinite", "patch", "plan_of", "watched"]
