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
    """A rewrite was refused; the original MoX and parameters are unchanged.

    The message says which node, which input or output, what was expected
    and what was found, and ends with "Nothing was changed." (added here,
    once, for every refusal).
    """

    def __init__(self, message: str = "", *args: object):
        message = message.rstrip()
        if not message.endswith("Nothing was changed."):
            message = f"{message} Nothing was changed." if message else "Nothing was changed."
        super().__init__(message, *args)


class YaxCaptureError(YaxError):
    """`capture`, `patch` or `first_nonfinite` was refused before anything ran.

    Raised when the pattern matches no node (the message shows `explain`'s
    account of where it stopped matching), when a matched node runs where its
    values cannot be brought out (inside a ``while`` loop, one branch of a
    ``cond``, or a custom derivative rule), or when a patch does not fit the
    node it replaces (which key, expected vs found shape and dtype).
    """


class YaxXMLError(YaxError):
    """A document given to `load_xml` is malformed, too large, or unsafe, or
    `dump_xml` could not write to the file object it was given.

    yax documents never declare a DTD or entities; such input is refused
    before parsing (billion-laughs and external-entity attacks).
    """


class YaxRenderError(YaxError):
    """Graphviz failed to render a graph or took longer than allowed."""


class YaxDependencyError(YaxError, ImportError):
    """An optional dependency is missing: a package from one of yax's extras,
    or a program such as Graphviz's ``dot``. The message says how to get it."""


# -- constructors of recurring messages ----------------------------------------------

def arg_name(keypath: tuple) -> str:
    """An argument as the user writes it: ``args[1]['params']``, ``kwargs['train']``
    (from a key path into ``(args, kwargs)``)."""
    import jax

    if not keypath:
        return "the arguments"
    head = getattr(keypath[0], "idx", None)
    rest = jax.tree_util.keystr(tuple(keypath[2:]))
    if head == 1 and len(keypath) > 1:
        return f"kwargs[{getattr(keypath[1], 'key', keypath[1])!r}]{rest}"
    if len(keypath) > 1:
        return f"args[{getattr(keypath[1], 'idx', keypath[1])}]{rest}"
    return "args" if head == 0 else "kwargs"


def where(node: object) -> str:
    """``the module_call `Dense_0` at `Model/Dense_0```: a node, for messages."""
    kind = getattr(node, "kind", None) or "equation"
    return f"the {kind} `{getattr(node, 'name', '?')}` at `{getattr(node, 'path', '') or 'the root'}`"


def not_traceable(what: str, node: object, inputs: str, e: BaseException, how: str) -> YaxRewriteError:
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} could not be traced on the node's inputs ({inputs}): "
        f"{type(e).__name__}: {e}\n{how}"
    )


def does_not_fit(what: str, node: object, i: int, found: str, expected: str, hint: str = "") -> YaxRewriteError:
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} does not fit: its output {i} is {found} but the "
        f"node's is {expected}. {hint}".rstrip()
    )


def wrong_count(what: str, node: object, verb: str, n: int, m: int, types: str) -> YaxRewriteError:
    """``verb`` is ``"takes … array inputs"`` or ``"returns … arrays"``."""
    noun = "array inputs" if verb == "takes" else "arrays"
    has = "has" if verb == "takes" else "returns"
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} {verb} {n} {noun}, but the node {has} {m} ({types})."
    )


def no_match(pattern: object, explained: str = "") -> YaxRewriteError:
    """`sub`'s pattern matched nothing; ``explained`` is `yax.explain`'s account
    of where an XPath stopped matching."""
    what = f"The pattern `{pattern}`" if isinstance(pattern, str) else "The pattern (an empty list of nodes)"
    how = f"How each step of it matched:\n{explained}\n" if explained else ""
    return YaxRewriteError(
        f"{what} matched no node, so `sub` would change nothing. {how}Try `yax.query` to see what "
        "matches, or pass `must_match=False` to accept a rewrite that changes nothing."
    )


def shared_variables(scope: str) -> YaxRewriteError:
    return YaxRewriteError(
        f"Two calls of the module at `{scope}` were given replacements with different variables; calls of "
        "one module share its variables, so give them the same one."
    )


def dangling(where_: str, window: str = "") -> YaxRewriteError:
    """A splice left a node reading a value nothing computes; ``window`` is the
    printed IR around it (`yax._print.window`)."""
    shown = f"\n{window}\n" if window else " "
    return YaxRewriteError(
        f"After the rewrite, {where_} would read a value that no longer exists:{shown}Most likely it is a "
        "variable of a replaced module that this call shares (another method of the module, or another call "
        "of it). Replace all calls of that module together, or keep variables with the same names and shapes."
    )


def nothing_matched(pattern: object, explained: str, what: str) -> YaxCaptureError:
    """``capture``'s or ``patch``'s pattern selected no node whose values exist;
    ``what`` is the function's name, ``explained`` `yax.explain`'s account."""
    shown = f"The pattern `{pattern}`" if isinstance(pattern, str) else "The pattern (an empty list of nodes)"
    how = f" How each step of it matched:\n{explained}\n" if explained else " "
    return YaxCaptureError(
        f"{shown} matched no call or equation, so `{what}` would have no values to work on.{how}Try `yax.query` "
        "to see what matches, e.g. `//module_call[@type=\"Dense\"]`, `//activation` or `//dot_general`."
    )


def unexpected(what: str, e: BaseException, error: type[YaxError]) -> YaxError:
    """``what`` (such as ``"`yax.sub`"``) failed for a reason yax did not
    foresee: a bug of yax's, reported as ``error`` (raise it ``from e``)."""
    return error(
        f"{what} failed unexpectedly: {type(e).__name__}: {e}. This is a bug in yax, not a mistake in the call; "
        "the chained error above says where it happened. Please report it with the model and the call that "
        "failed."
    )


def decider_mutated(decider: str, node: object, changed: list[str]) -> YaxRewriteError:
    """A decider passed to `sub` changed the node it was asked about (put back
    before this is raised); ``changed`` names what it changed."""
    what = ", ".join(f"`{c}`" for c in changed[:4]) + (" …" if len(changed) > 4 else "")
    return YaxRewriteError(
        f"The decider `{decider}` changed {where(node)} while deciding ({what}); MoX nodes are immutable, so "
        "the change was undone. A decider must leave the node as it is and return its replacement (a function, "
        "a module, a MoX), or the node itself to keep it; to change a node, return a new one built with "
        "`dataclasses.replace(node, ...)`."
    )


def inside_custom_rule(node: object, rule: object, holder: object = None) -> YaxRewriteError:
    """A node selected for `sub` is only part of the computation a custom
    derivative rule (``rule``, a ``custom_jvp_call``/``custom_vjp_call``
    equation) was written for; ``holder`` is the call node holding the rule,
    named when it is an activation or function (for a module it would be
    much more than the rule)."""
    name = getattr(rule, "name", "custom_jvp_call")
    at = getattr(rule, "path", "")
    instead = f"the `{name}` equation (`//{name}[@path=\"{at}\"]`)"
    if getattr(holder, "kind", None) in ("activation", "function"):
        instead += (f" or {where(holder)} that holds it "
                    f"(`//{getattr(holder, 'kind', '*')}[@path=\"{getattr(holder, 'path', '')}\"]`)")
    return YaxRewriteError(
        f"{where(node).capitalize()} is part of the computation of the `{name}` at `{at or 'the root'}`, whose "
        "derivative is given by a custom rule written for that whole computation. Replacing only this part "
        "would keep the old rule around the new computation, and `jax.grad` through the result would be "
        f"wrong. Try replacing the whole rule: select {instead}."
    )


def traced_on_other_inputs(what: str, node: object, i: int, found: str, expected: str) -> YaxRewriteError:
    """A MoX or equation replacement was traced on inputs of other shapes or dtypes than the node's."""
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} was traced on other inputs: its input {i} is {found} but "
        f"the node's is {expected}. A MoX computes exactly what it was traced on. Try tracing it again on "
        "arrays of the node's input shapes, or pass the function or module itself (`yax.module_of(node)` "
        "rebuilds a call node's module from its fields, without what its trace changed)."
    )


def _call_of(call: object) -> str:
    return f"`{getattr(call, 'type', '?')}` call at `{getattr(call, 'path', '') or 'the root'}`"


def mox_side_results(call: object, types: str) -> YaxRewriteError:
    """A call used as a replacement computes values that leave it other than as its results."""
    return YaxRewriteError(
        f"The MoX replacement (the {_call_of(call)}) computes values that leave it other than as its results "
        f"({types}): updated variables (batch statistics, an nnx module's state) or values the model it comes "
        "from reads elsewhere. A replacement gives only its results to the model. Try tracing it without "
        "updating its variables (evaluation mode, no `mutable=`), or pass the module itself."
    )


def mox_reads_unnamed(call: object, types: str, what: str) -> YaxRewriteError:
    """A call used as a replacement reads values yax cannot name as its module's variables."""
    return YaxRewriteError(
        f"The MoX replacement (the {_call_of(call)}) reads {types}, {what}. yax can give a replacement only "
        "its inputs and its module's variables. Try tracing the module's `apply` with its variables as the "
        "first argument (`yax.make_mox(Block().apply)(variables, x)`), or pass the module itself."
    )


def mox_cut_from_unknown(call: object) -> YaxRewriteError:
    """A call node used as a replacement lives in no MoX yax knows of."""
    return YaxRewriteError(
        f"The {_call_of(call)}, used as a replacement, is not part of any MoX that `make_mox` or `sub` made "
        "and that still exists, so yax cannot tell which of that MoX's inputs are the variables it reads. "
        "Try keeping the MoX you cut it from (assign it to a name) and cutting the node again, or passing the "
        "root MoX of the module's `apply` instead."
    )


def mox_no_values(what: str, node: object, why: str) -> YaxRewriteError:
    """A MoX replacement reads variables the model does not have, and there is nothing to give them values."""
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} reads variables the model does not have there, and a MoX "
        f"holds no values for its variables: {why}. Try tracing it from a module whose variables have the "
        "replaced module's names and shapes, saying which old variable each new one takes with "
        "`keep={\"params/new/kernel\": \"params/kernel\"}`, or passing the module itself, whose new variables "
        "yax initialises with `key=`."
    )


def mox_no_place(what: str, node: object, leaf: str, why: str) -> YaxRewriteError:
    """A MoX replacement on a model whose state a MoX cannot extend (nnx) reads a
    variable the replaced node does not have."""
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} reads the variable `{leaf}`, {why}. On this model "
        "a MoX replacement reads the replaced module's own variables (its state has no place for new ones, "
        "and a MoX holds no values). Try tracing it from a module with the same variables, or pass the "
        "module itself, whose variables yax adds to the state."
    )


def broadcast_new_variables(what: str, node: object, new: list[str]) -> YaxRewriteError:
    """A replacement adds variables to a module whose variables a scan broadcasts to every step."""
    shown = ", ".join(f"`{n}`" for n in new[:4]) + (" …" if len(new) > 4 else "")
    return YaxRewriteError(
        f"The replacement `{what}` for {where(node)} has variables the model does not have there ({shown}), but "
        "the node runs inside a scan that gives every step the same variables (`nn.scan(..., "
        "variable_broadcast=...)`, as a recurrent cell's): yax keeps a module's variables there but cannot add "
        "new ones yet. Try a replacement with the same variables (names and shapes), or replace the module that "
        "runs the scan."
    )
