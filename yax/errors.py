"""The yax error catalogue.

Every error yax raises on purpose derives from :class:`YaxError`. Each class
says when it happens and how to fix it; messages are full sentences naming
what was expected, what was found, where (a module path such as
``Model/Block_3/Dense_0``) and what to try.
"""

from __future__ import annotations

import collections
from typing import Any


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
    node it replaces (which key, expected vs found shape and dtype), or when
    ``grad_of`` does not return a real scalar (`LossNotScalar`).
    """


class YaxXMLError(YaxError):
    """A document given to `load_xml` is malformed, too large, or unsafe, or
    `dump_xml` could not write to the file object it was given.

    yax documents never declare a DTD or entities; such input is refused
    before parsing (billion-laughs and external-entity attacks).
    """


class YaxRenderError(YaxError):
    """Graphviz failed to render a graph or took longer than allowed."""


class YaxCheckError(YaxError):
    """A MoX breaks one of its invariants (`yax.check_mox`): a value read before
    anything binds it or bound twice, an equation whose output types are not
    what its primitive computes, a call whose inputs or outputs disagree with its
    parameters, results or signature, a node at the wrong path, or a root that
    disagrees with its signature.

    The message names the node and shows the printed IR around it, the node
    marked ``>>>``. A MoX from `make_mox` or a yax rewrite always passes, so
    this error from one of them (under ``YAX_ENABLE_CHECKS=1``) is a bug in
    yax; for a tree built or changed by hand, fix the node shown.
    """

    def __init__(self, problem: str, window: str = "", hint: bool = True):
        self.problem, self.window = problem, window
        if not hint:
            super().__init__(problem)
            return
        shown = f"\n{window}\n" if window else " "
        super().__init__(
            f"The MoX is not well formed: {problem}{shown}If it came from `yax.make_mox` or a yax rewrite, this is "
            "a bug in yax: please report it with the model and the call. If it was built or changed by hand, fix "
            "the node shown (`>>>`).")


class YaxDependencyError(YaxError, ImportError):
    """An optional dependency is missing: a package from one of yax's extras,
    or a program such as Graphviz's ``dot``. The message says how to get it."""


# -- recurring messages: helpers, and error classes that format their own (Flax's style) -------

def arg_name(keypath: tuple[Any, ...]) -> str:
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


class NeedsParams(YaxRewriteError):
    """A rewrite that must return new variables was given none (``params=``)."""


class NotTraceable(YaxRewriteError):
    """A replacement failed while being traced on the node's input types (``inputs``); ``how``
    says how it was called."""

    def __init__(self, what: str, node: object, inputs: str, error: BaseException, how: str):
        self.what, self.node, self.error = what, node, error
        super().__init__(
            f"The replacement `{what}` for {where(node)} could not be traced on the node's inputs ({inputs}): "
            f"{type(error).__name__}: {error}\n{how}")


class DoesNotFit(YaxRewriteError):
    """A replacement's output ``i`` has another type than the node's."""

    def __init__(self, what: str, node: object, i: int, found: str, expected: str, hint: str = ""):
        self.what, self.node, self.index, self.found, self.expected = what, node, i, found, expected
        super().__init__(
            f"The replacement `{what}` for {where(node)} does not fit: its output {i} is {found} but the "
            f"node's is {expected}. {hint}".rstrip())


class WrongCount(YaxRewriteError):
    """A replacement takes (``side="inputs"``) or returns (``side="outputs"``) ``n`` arrays
    where the node has ``m`` (of ``types``)."""

    def __init__(self, what: str, node: object, side: str, n: int, m: int, types: str):
        self.what, self.node, self.side, self.found, self.expected = what, node, side, n, m
        verb, noun, has = ("takes", "array inputs", "has") if side == "inputs" else ("returns", "arrays", "returns")
        super().__init__(
            f"The replacement `{what}` for {where(node)} {verb} {n} {noun}, but the node {has} {m} ({types}).")


class TracedOnOtherInputs(YaxRewriteError):
    """A MoX or equation replacement was traced on inputs of other shapes or dtypes than the node's."""

    def __init__(self, what: str, node: object, i: int, found: str, expected: str):
        self.what, self.node, self.index, self.found, self.expected = what, node, i, found, expected
        super().__init__(
            f"The replacement `{what}` for {where(node)} was traced on other inputs: its input {i} is {found} but "
            f"the node's is {expected}. A MoX computes exactly what it was traced on. Try tracing it again on "
            "arrays of the node's input shapes, or pass the function or module itself (`yax.module_of(node)` "
            "rebuilds a call node's module from its fields, without what its trace changed).")


class NothingMatched(YaxError):
    """A pattern selected no node, so the function given it has nothing to work on. One
    message for every such function: `NothingToRewrite` (`sub`) and `NothingToCapture`
    (`capture`, `patch`, `first_nonfinite`) say what each would have done.

    Args:
      pattern: the XPath (or node list) given.
      explained: `yax.explain`'s account of where an XPath stopped matching (or "").
      tool: the function's name, such as ``"sub"``.
      consequence: what would happen, such as ``"would change nothing"``.
      hint: what to try besides `yax.query`.
      nodes: the nodes the function works on (``"node"``, ``"call or equation"``).
    """

    def __init__(self, pattern: object, explained: str, tool: str, consequence: str, hint: str,
                 nodes: str = "node"):
        self.pattern, self.explained, self.tool = pattern, explained, tool
        what = f"The pattern `{pattern}`" if isinstance(pattern, str) else "The pattern (an empty list of nodes)"
        how = f" How each step of it matched:\n{explained}\n" if explained else " "
        super().__init__(f"{what} matched no {nodes}, so `{tool}` {consequence}.{how}Try `yax.query` to see what "
                         f"matches{hint}")


class NothingToRewrite(NothingMatched, YaxRewriteError):
    """`sub`'s pattern matched nothing."""

    def __init__(self, pattern: object, explained: str = ""):
        super().__init__(pattern, explained, "sub", "would change nothing",
                         ", or pass `must_match=False` to accept a rewrite that changes nothing.")


class LossNotScalar(YaxCaptureError):
    """``grad_of`` of `capture` or `first_nonfinite` (``tool``) returned something other
    than a real floating scalar, so there is no single gradient to take."""

    def __init__(self, tool: str, found: str):
        super().__init__(
            f"`{tool}` differentiates `grad_of(out)`, which must return a real floating scalar (shape `()`), "
            f"but it returned {found}. Reduce it to one number, e.g. `grad_of=lambda out: jnp.mean(out ** 2)`, "
            "or take the sum of a per-example loss."
        )


class NothingToCapture(NothingMatched, YaxCaptureError):
    """The pattern of `capture`, `patch` or `first_nonfinite` (``tool``) selected no call or equation."""

    def __init__(self, pattern: object, explained: str, tool: str):
        super().__init__(pattern, explained, tool, "would have no values to work on",
                         ", e.g. `//module_call[@type=\"Dense\"]`, `//activation` or `//dot_general`.",
                         "call or equation")


class PartlyMatchedModule(YaxRewriteError):
    """A module that is one value of the model (an nnx object, an Equinox field) is
    called ``calls`` times but the pattern matched ``matched`` of its calls: replacing
    it changes every call, so all must be matched. ``system`` names the module system."""

    def __init__(self, path: str, calls: int, matched: int, system: str, what: str):
        self.path, self.calls, self.matched = path, calls, matched
        super().__init__(
            f"The module at `{path}` is called {calls} times, but the pattern matched {matched} of its calls. "
            f"An {system} module is {what}, so replacing it changes every call; match them all "
            f"(`//module_call[@path=\"{path}\"]`).")

    @staticmethod
    def check(root: Any, sites: list[Any], system: str, what: str) -> None:
        """Raise unless every call of each replaced module (by its ``scope``) is among ``sites``."""
        matched = collections.Counter(s.node.scope for s in sites)
        calls = collections.Counter(n.scope for n in root.modules()
                                    if n.kind == "module_call" and n.scope in matched)
        for s in sites:
            if calls[s.node.scope] != matched[s.node.scope]:
                raise PartlyMatchedModule(s.node.path, calls[s.node.scope], matched[s.node.scope], system, what)


class SharedVariables(YaxRewriteError):
    """Two calls of one module (sharing its variables) were given replacements with different variables."""

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__(
            f"Two calls of the module at `{scope}` were given replacements with different variables; calls of "
            "one module share its variables, so give them the same one.")


class Dangling(YaxRewriteError):
    """A splice left a node reading a value nothing computes; ``window`` is the
    printed IR around it (`yax._print.window`)."""

    def __init__(self, where_: str, window: str = ""):
        self.where, self.window = where_, window
        shown = f"\n{window}\n" if window else " "
        super().__init__(
            f"After the rewrite, {where_} would read a value that no longer exists:{shown}Most likely it is a "
            "variable of a replaced module that this call shares (another method of the module, or another call "
            "of it). Replace all calls of that module together, or keep variables with the same names and "
            "shapes.")


def unexpected(what: str, e: BaseException, error: type[YaxError]) -> YaxError:
    """``what`` (such as ``"`yax.sub`"``) failed for a reason yax did not
    foresee: a bug of yax's, reported as ``error`` (raise it ``from e``)."""
    return error(
        f"{what} failed unexpectedly: {type(e).__name__}: {e}. This is a bug in yax, not a mistake in the call; "
        "the chained error above says where it happened. Please report it with the model and the call that "
        "failed."
    )


class OutOfMemory(YaxEvalError):
    """A program yax compiled to look at every value of a model (`first_nonfinite`'s
    search) did not fit in the device's memory: XLA reported ``RESOURCE_EXHAUSTED``
    (chained as ``__cause__``). Run the model on fewer rows (a smaller batch), or bring
    out fewer values: `capture` with a query selecting the layers you suspect."""

    def __init__(self, tool: str, e: BaseException, backward: bool = False):
        what = "every value of the model and every cotangent of its backward pass" if backward else \
            "every value of the model"
        said = str(e).strip().split("\n")[0][:300].rstrip(".")
        super().__init__(
            f"`{tool}` ran out of device memory: its program, which flags {what}, did not fit (XLA: {said}). "
            f"Try a batch with fewer rows (`x[:1]`: one example, or fewer tokens), or look at fewer values at "
            f"a time: `yax.capture(query, mox, *args)` with a query selecting the layers you suspect, such as "
            f"`'//module_call[@name=\"Block_3\"]'`, then `jnp.isfinite` of what it returns.")

    @staticmethod
    def caused_by(e: BaseException) -> bool:
        """Whether ``e`` is XLA saying that a program did not fit in the device's memory."""
        return isinstance(e, RuntimeError) and "RESOURCE_EXHAUSTED" in str(e)[:500]


class DeciderMutated(YaxRewriteError):
    """A decider passed to `sub` changed the node it was asked about (put back
    before this is raised); ``changed`` names what it changed."""

    def __init__(self, decider: str, node: object, changed: list[str]):
        self.decider, self.node, self.changed = decider, node, changed
        what = _listed(changed)
        super().__init__(
            f"The decider `{decider}` changed {where(node)} while deciding ({what}); MoX nodes are immutable, so "
            "the change was undone. A decider must leave the node as it is and return its replacement (a "
            "function, a module, a MoX), or the node itself to keep it; to change a node, return a new one built "
            "with `dataclasses.replace(node, ...)`.")


class InsideCustomRule(YaxRewriteError):
    """A node selected for `sub` is only part of the computation a custom
    derivative rule (``rule``, a ``custom_jvp_call``/``custom_vjp_call``
    equation) was written for; ``holder`` is the call node holding the rule,
    named when it is an activation or function (for a module it would be
    much more than the rule)."""

    def __init__(self, node: object, rule: object, holder: object = None):
        self.node, self.rule, self.holder = node, rule, holder
        name = getattr(rule, "name", "custom_jvp_call")
        at = getattr(rule, "path", "")
        instead = f"the `{name}` equation (`//{name}[@path=\"{at}\"]`)"
        if getattr(holder, "kind", None) in ("activation", "function"):
            instead += (f" or {where(holder)} that holds it "
                        f"(`//{getattr(holder, 'kind', '*')}[@path=\"{getattr(holder, 'path', '')}\"]`)")
        super().__init__(
            f"{where(node).capitalize()} is part of the computation of the `{name}` at `{at or 'the root'}`, whose "
            "derivative is given by a custom rule written for that whole computation. Replacing only this part "
            "would keep the old rule around the new computation, and `jax.grad` through the result would be "
            f"wrong. Try replacing the whole rule: select {instead}.")


def _listed(names: list[str], most: int = 4) -> str:
    """```a`, `b` …``: the first ``most`` names, and an ellipsis for the rest."""
    return ", ".join(f"`{n}`" for n in names[:most]) + (" …" if len(names) > most else "")


def _call_of(call: object) -> str:
    return f"`{getattr(call, 'type', '?')}` call at `{getattr(call, 'path', '') or 'the root'}`"


class MoxSideResults(YaxRewriteError):
    """A call used as a replacement computes values that leave it other than as its results."""

    def __init__(self, call: object, types: str):
        self.call = call
        super().__init__(
            f"The MoX replacement (the {_call_of(call)}) computes values that leave it other than as its results "
            f"({types}): updated variables (batch statistics, an nnx module's state) or values the model it comes "
            "from reads elsewhere. A replacement gives only its results to the model. Try tracing it without "
            "updating its variables (evaluation mode, no `mutable=`), or pass the module itself.")


class MoxReadsUnnamed(YaxRewriteError):
    """A call used as a replacement reads values yax cannot name as its module's variables."""

    def __init__(self, call: object, types: str, what: str):
        self.call = call
        super().__init__(
            f"The MoX replacement (the {_call_of(call)}) reads {types}, {what}. yax can give a replacement only "
            "its inputs and its module's variables. Try tracing the module's `apply` with its variables as the "
            "first argument (`yax.make_mox(Block().apply)(variables, x)`), or pass the module itself.")


class MoxCutFromUnknown(YaxRewriteError):
    """A call node used as a replacement lives in no MoX yax knows of."""

    def __init__(self, call: object):
        self.call = call
        super().__init__(
            f"The {_call_of(call)}, used as a replacement, is not part of any MoX that `make_mox` or `sub` made "
            "and that still exists, so yax cannot tell which of that MoX's inputs are the variables it reads. "
            "Try keeping the MoX you cut it from (assign it to a name) and cutting the node again, or passing "
            "the root MoX of the module's `apply` instead.")


class MoxNoValues(YaxRewriteError):
    """A MoX replacement reads variables the model does not have, and there is nothing to give them values."""

    def __init__(self, what: str, node: object, why: str):
        self.what, self.node = what, node
        super().__init__(
            f"The replacement `{what}` for {where(node)} reads variables the model does not have there, and a "
            f"MoX holds no values for its variables: {why}. Try tracing it from a module whose variables have the "
            "replaced module's names and shapes, saying which old variable each new one takes with "
            "`keep={\"params/new/kernel\": \"params/kernel\"}`, or passing the module itself, whose new "
            "variables yax initialises with `key=`.")


class MoxNoPlace(YaxRewriteError):
    """A MoX replacement on a model whose state a MoX cannot extend (nnx) reads a
    variable the replaced node does not have."""

    def __init__(self, what: str, node: object, leaf: str, why: str):
        self.what, self.node, self.leaf = what, node, leaf
        super().__init__(
            f"The replacement `{what}` for {where(node)} reads the variable `{leaf}`, {why}. On this model "
            "a MoX replacement reads the replaced module's own variables (its state has no place for new ones, "
            "and a MoX holds no values). Try tracing it from a module with the same variables, or pass the "
            "module itself, whose variables yax adds to the state.")


class BroadcastNewVariables(YaxRewriteError):
    """A replacement adds variables to a module whose variables a scan broadcasts to every step."""

    def __init__(self, what: str, node: object, new: list[str]):
        self.what, self.node, self.new = what, node, new
        shown = _listed(new)
        super().__init__(
            f"The replacement `{what}` for {where(node)} has variables the model does not have there ({shown}), "
            "but the node runs inside a scan that gives every step the same variables (`nn.scan(..., "
            "variable_broadcast=...)`, as a recurrent cell's): yax keeps a module's variables there but cannot "
            "add new ones yet. Try a replacement with the same variables (names and shapes), or replace the "
            "module that runs the scan.")


class WeightsDoNotFit(YaxInputError):
    """`load_weights` found that the weights in a file do not fit ``like``: keys of ``like``
    missing from the file (``missing``), keys in the file that ``like`` lacks (``extra``), or
    leaves of another shape or dtype (``mismatched``: ``(key, expected, found)`` types such as
    ``f32[4,8]``). Every problem is listed at once; nothing is loaded."""

    def __init__(self, path: str, missing: list[str], extra: list[str], mismatched: list[tuple[str, str, str]]):
        self.path, self.missing, self.extra, self.mismatched = path, missing, extra, mismatched
        parts = []
        if missing:
            parts.append(f"{len(missing)} of `like`'s keys missing from the file: "
                         + ", ".join(f"`{k}`" for k in missing))
        if extra:
            parts.append(f"{_count(len(extra), 'key')} in the file that `like` lacks: "
                         + ", ".join(f"`{k}`" for k in extra))
        if mismatched:
            parts.append(f"{_count(len(mismatched), 'leaf', 'leaves')} of another type: " + ", ".join(
                f"`{k}` is {found} in the file but {expected} in `like`" for k, expected, found in mismatched))
        listed = "".join(f"\n  - {p}" for p in parts)
        super().__init__(
            f"The weights in `{path}` do not fit `like`:{listed}\nNothing was loaded. Try loading with `like=` the "
            "parameters of the model these weights were saved from (`jax.eval_shape` of its `init` gives them "
            "without computing any), or, if they were saved from a rewritten model, rewrite the model the same "
            "way first (a LoRA rewrite adds `lora_a`/`lora_b`).")


def _count(n: int, one: str, many: str = "") -> str:
    """``1 key``, ``2 keys``; ``many`` where the plural is not ``one`` + "s"."""
    return f"{n} {one if n == 1 else many or one + 's'}"
