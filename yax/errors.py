"""The yax error catalogue.

Every error yax raises on purpose derives from :class:`YaxError`. Each class
says when it happens and how to fix it; messages are full sentences naming
what was expected, what was found, where (a module path such as
``Model/Block_3/Dense_0``) and what to try.
"""

from __future__ import annotations


class YaxError(Exception):
    """Base class of every error raised by yax on purpose."""


class YaxTraceError(YaxError):
    """Tracing a function into a MoX failed.

    Raised when `make_mox` is given something it cannot trace (an unbound
    module with no variables, a non-callable) or when JAX itself fails while
    tracing; the JAX error is chained as ``__cause__``. Fix the function so
    ``jax.make_jaxpr`` accepts it, or pass arguments the way ``apply`` expects.
    """


class YaxInputError(YaxError):
    """Arguments given to `eval_mox` do not match those the MoX was traced with.

    The message names the argument by pytree path (``args[1]['params']``) and
    says how its structure, shape, dtype or static value differs. Trace again
    with `make_mox` for new shapes, as you would re-``jit`` a function.
    """


class YaxEvalError(YaxError):
    """Evaluating a MoX failed inside an equation or a module call.

    The message names the module path and the primitive that failed.
    """


class YaxQueryError(YaxError):
    """An XPath query is invalid or returned something yax cannot map back."""


class YaxRewriteError(YaxError):
    """A rewrite was refused; the original MoX and parameters are unchanged."""


class YaxXMLError(YaxError):
    """A document given to `load_xml` is malformed, too large, or unsafe.

    yax documents never declare a DTD or entities; such input is refused
    before parsing (billion-laughs and external-entity attacks).
    """


class YaxRenderError(YaxError):
    """Graphviz failed to render a graph or took longer than allowed."""


class YaxDependencyError(YaxError, ImportError):
    """An optional dependency is missing: a package from one of yax's extras,
    or a program such as Graphviz's ``dot``. The message says how to get it."""
