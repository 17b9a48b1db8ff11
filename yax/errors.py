"""The yax error catalogue.

Every error yax raises on purpose derives from :class:`YaxError`. Each class
says when it happens and how to fix it; messages are full sentences naming
what was expected, what was found, where (a module path such as
``Model/Block_3/Dense_0``) and what to try.
"""

from __future__ import annotations

import collections
from typing import Any

DOCS = "docs/errors.md"
"""Where every error class has its section, anchored by its lowercased name (`pointer`)."""


class YaxError(Exception):
    """Base class of every error raised by yax on purpose.

    A specific class (one that names a recurring situation, such as `DoesNotFit`)
    ends its message with a pointer to its section of ``docs/errors.md``; the
    category classes below (`YaxInputError`, `YaxRewriteError`, …) do not, as they
    say only what kind of thing went wrong.

    Example::

        try:
            new = yax.sub(pattern, repl, mox)
        except yax.YaxError as e:  # anything yax refused on purpose
            print(e)
    """

    def __init__(self, message: object = "", *args: object):
        cls = documented(type(self))
        if isinstance(message, str) and cls is not None and cls.__name__ not in CATEGORIES:
            tail = f" {pointer(cls)}"
            if not message.endswith(tail):
                message = f"{message.rstrip()}{tail}" if message else tail.strip()
        super().__init__(message, *args)


def documented(cls: type) -> type | None:
    """The class of this catalogue that documents ``cls``: itself, or for a class defined
    elsewhere (the widget's `RequestError`) the nearest base defined here."""
    return next((c for c in cls.__mro__ if c.__module__ == __name__ and issubclass(c, YaxError)), None)


def pointer(cls: type) -> str:
    """``(docs/errors.md#doesnotfit)``: where an error class is documented."""
    return f"({DOCS}#{cls.__name__.lower()})"


def message(e: BaseException) -> str:
    """An error's message without its docs pointer: what a menu shows as the reason."""
    cls = documented(type(e))
    return str(e) if cls is None else str(e).removesuffix(f" {pointer(cls)}")


def said(e: BaseException) -> str:
    """An error's message without what yax adds to every one of its kind (the docs pointer, and
    "Nothing was changed."), to quote it inside another message."""
    return message(e).removesuffix(" Nothing was changed.")


class YaxTraceError(YaxError):
    """Tracing a function into a MoX failed.

    Raised when `make_mox` is given something it cannot trace (an unbound
    module with no variables, a non-callable) or when JAX itself fails while
    tracing; the JAX error is chained as ``__cause__``. Fix the function so
    ``jax.make_jaxpr`` accepts it, or pass arguments the way ``apply`` expects.

    Example::

        yax.make_mox(3)                                   # YaxTraceError: not a callable
        yax.make_mox(model.apply)(variables, x)           # trace the function apply would run
    """


class YaxInputError(YaxError):
    """Arguments given to `eval_mox` do not match those the MoX was traced with.

    The message names the argument by pytree path (``args[1]['params']``) and
    says how its structure, shape, dtype or static value differs. Trace again
    with `make_mox` for new shapes, as you would re-``jit`` a function.

    Example::

        yax.eval_mox(mox, variables, x_of_another_shape)  # a YaxInputError (here `InputsDiffer`)
        mox = yax.make_mox(model.apply)(variables, x_of_another_shape)
    """


class YaxEvalError(YaxError):
    """Evaluating a MoX failed inside an equation or a module call.

    The message names the module path and the primitive that failed.

    Example::

        yax.eval_mox(mox, variables, x)                   # YaxEvalError: names the path and primitive
    """


class YaxQueryError(YaxError):
    """An XPath query is invalid or returned something yax cannot map back.

    Example::

        yax.query("//module_call[", mox)                  # YaxQueryError: the XPath is invalid
        yax.query("//module_call[@type='Dense']", mox)
    """


class YaxRewriteError(YaxError):
    """A rewrite was refused; the original MoX and parameters are unchanged.

    The message says which node, which input or output, what was expected
    and what was found, and ends with "Nothing was changed." (added here,
    once, for every refusal).

    Example::

        yax.sub("//module_call[@name='Dense_0']", repl, mox)  # a YaxRewriteError: "... Nothing was changed."
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

    Example::

        yax.capture("//while//add", mox, x)  # YaxCaptureError: values inside a while loop cannot come out
        yax.capture("//while", mox, x)       # match a node outside it
    """


class YaxXMLError(YaxError):
    """A document given to `load_xml` is malformed, too large, or unsafe, or
    `dump_xml` could not write to the file object it was given.

    yax documents never declare a DTD or entities; such input is refused
    before parsing (billion-laughs and external-entity attacks).

    Example::

        yax.load_xml(42)                     # YaxXMLError: a file object, a path or bytes
        yax.load_xml(pathlib.Path("model.xml"))
    """


class YaxRenderError(YaxError):
    """Graphviz failed to render a graph or took longer than allowed.

    Example::

        yax.to_svg(mox, timeout=0.001)       # YaxRenderError: Graphviz took longer than allowed
    """


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

    Example::

        import os; os.environ["YAX_ENABLE_CHECKS"] = "1"
        yax.check_mox(hand_edited_mox)       # YaxCheckError: shows the IR around the faulty node (>>>)
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
    or a program such as Graphviz's ``dot``. The message says how to get it.

    Example::

        yax.save_weights(params, "w.safetensors")  # YaxDependencyError without safetensors
        # pip install safetensors
    """


CATEGORIES = frozenset(c.__name__ for c in (
    YaxError, YaxTraceError, YaxInputError, YaxEvalError, YaxQueryError, YaxRewriteError, YaxCaptureError,
    YaxXMLError, YaxRenderError, YaxCheckError, YaxDependencyError))
"""The category classes: what kind of thing went wrong (no docs pointer in their messages)."""


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


def where(node: object, start: bool = False) -> str:
    """``the module_call `Dense_0` at `Model/Dense_0```: a node, for messages; ``start``: starting a
    sentence (``The …``: only the first letter upper-cased, never the path, as ``str.capitalize`` would)."""
    kind = getattr(node, "kind", None) or "equation"
    return f"{'The' if start else 'the'} {kind} `{getattr(node, 'name', '?')}` at `{getattr(node, 'path', '') or 'the root'}`"


class NeedsParams(YaxRewriteError):
    """A rewrite (``tool``: `sub`, `merge_lora`, `mixed_precision`) that must return new
    variables, or read the old ones, was given none (``params=``).

    Example::

        yax.sub(q, Dense(8), mox)                          # NeedsParams: Dense has variables
        new, new_params = yax.sub(q, Dense(8), mox, params=variables, key=jax.random.key(0))
    """

    def __init__(self, message: str, tool: str = "sub"):
        self.tool = tool
        super().__init__(message)


class NotTraceable(YaxRewriteError):
    """A replacement failed while being traced on the node's input types (``inputs``); ``how``
    says how it was called.

    Example::

        yax.sub("//module_call[@name='Dense_0']", lambda x: x.reshape(7), mox)  # NotTraceable
        yax.sub("//module_call[@name='Dense_0']", lambda x: jnp.tanh(x), mox)
    """

    def __init__(self, what: str, node: object, inputs: str, error: BaseException, how: str):
        self.what, self.node, self.error = what, node, error
        super().__init__(
            f"The replacement `{what}` for {where(node)} could not be traced on the node's inputs ({inputs}): "
            f"{type(error).__name__}: {error}\n{how}")


class DoesNotFit(YaxRewriteError):
    """A replacement's output ``i`` (``index``) has another type (``found``) than the node's
    (``expected``); ``hint`` is what the message suggests (``cast=True``, mapping), or "".

    Example::

        yax.sub("//module_call[@name='Dense_0']", nn.Dense(8), mox, params=v, key=k)   # DoesNotFit: 8 vs 16 features
        yax.sub("//module_call[@name='Dense_0']", nn.Dense(16), mox, params=v, key=k)
    """

    def __init__(self, what: str, node: object, i: int, found: str, expected: str, hint: str = ""):
        self.what, self.node, self.index, self.found, self.expected = what, node, i, found, expected
        self.hint = hint
        super().__init__(
            f"The replacement `{what}` for {where(node)} does not fit: its output {i} is {found} but the "
            f"node's is {expected}. {hint}".rstrip())


class WrongCount(YaxRewriteError):
    """A replacement takes (``side="inputs"``) or returns (``side="outputs"``) ``n`` arrays
    where the node has ``m`` (of ``types``).

    Example::

        yax.sub("//add", lambda a: a, mox)            # WrongCount: `add` takes two arrays
        yax.sub("//add", lambda a, b: a - b, mox)
    """

    def __init__(self, what: str, node: object, side: str, n: int, m: int, types: str):
        self.what, self.node, self.side, self.found, self.expected = what, node, side, n, m
        verb, noun, has = ("takes", "array inputs", "has") if side == "inputs" else ("returns", "arrays", "returns")
        super().__init__(
            f"The replacement `{what}` for {where(node)} {verb} {n} {noun}, but the node {has} {m} ({types}).")


class TracedOnOtherInputs(YaxRewriteError):
    """A MoX or equation replacement was traced on inputs of other shapes or dtypes than the node's.

    Example::

        block = yax.make_mox(Block().apply)(bv, jnp.ones((5, 4)))
        yax.sub(target, block, mox)                    # TracedOnOtherInputs: traced on f32[5,4]
        yax.sub(target, yax.module_of(target), mox)    # or trace it on the node's input shapes
    """

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

    Example::

        yax.sub("//module_call[@type='Dens']", repl, mox)  # NothingToRewrite (a NothingMatched)
        yax.query("//module_call/@type", mox)             # see what there is
    """

    def __init__(self, pattern: object, explained: str, tool: str, consequence: str, hint: str,
                 nodes: str = "node"):
        self.pattern, self.explained, self.tool = pattern, explained, tool
        what = f"The pattern `{pattern}`" if isinstance(pattern, str) else "The pattern (an empty list of nodes)"
        how = f" How each step of it matched:\n{explained}\n" if explained else " "
        super().__init__(f"{what} matched no {nodes}, so `{tool}` {consequence}.{how}Try `yax.query` to see what "
                         f"matches{hint}")


class NothingToRewrite(NothingMatched, YaxRewriteError):
    """`sub`'s pattern matched nothing.

    Example::

        yax.sub("//module_call[@features=99]", jax.nn.relu, mox)  # NothingToRewrite, with yax.explain's account
        yax.sub("//module_call[@features=99]", jax.nn.relu, mox, must_match=False)  # returns mox unchanged
    """

    def __init__(self, pattern: object, explained: str = ""):
        super().__init__(pattern, explained, "sub", "would change nothing",
                         ", or pass `must_match=False` to accept a rewrite that changes nothing.")


class LossNotScalar(YaxCaptureError, YaxInputError):
    """``grad_of`` of `capture`, `first_nonfinite` or `compare` (``tool``) returned something
    other than a real floating scalar (``found``), so there is no single gradient to take.

    Example::

        yax.capture("//tanh", mox, p, x, grad_of=lambda out: out)            # LossNotScalar: f32[4,2]
        yax.capture("//tanh", mox, p, x, grad_of=lambda out: jnp.mean(out ** 2))
    """

    def __init__(self, tool: str, found: str):
        self.tool, self.found = tool, found
        super().__init__(
            f"`{tool}` differentiates `grad_of(out)`, which must return a real floating scalar (shape `()`), "
            f"but it returned {found}. Reduce it to one number, e.g. `grad_of=lambda out: jnp.mean(out ** 2)`, "
            "or take the sum of a per-example loss."
        )


class NothingToCapture(NothingMatched, YaxCaptureError):
    """The pattern of `capture`, `patch` or `first_nonfinite` (``tool``) selected no call or equation.

    Example::

        yax.capture("//module_call[@type='Dens']", mox, p, x)  # NothingToCapture
        yax.capture("//module_call[@type='Dense']", mox, p, x)
    """

    def __init__(self, pattern: object, explained: str, tool: str):
        super().__init__(pattern, explained, tool, "would have no values to work on",
                         ", e.g. `//module_call[@type=\"Dense\"]`, `//activation` or `//dot_general`.",
                         "call or equation")


class PartlyMatchedModule(YaxRewriteError):
    """A module that is one value of the model (an nnx object, an Equinox field) is
    called ``calls`` times but the pattern matched ``matched`` of its calls: replacing
    it changes every call, so all must be matched. ``system`` names the module system.

    Example::

        yax.sub(yax.query("//module_call[@type='Linear']", mox)[:1], nnx.Linear(5, 5, rngs=rngs), mox, params=state)
        # PartlyMatchedModule: the module is called 3 times; match all its calls
        yax.sub('//module_call[@path="Model/shared"]', nnx.Linear(5, 5, rngs=rngs), mox, params=state)
    """

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
    """Two calls of one module (sharing its variables) were given replacements with different variables.

    Example::

        yax.sub(q, lambda path, node: nn.Dense(8, name=path), mox, params=v, key=k)  # SharedVariables
        yax.sub(q, nn.Dense(8), mox, params=v, key=k)  # one replacement for every call of the shared module
    """

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__(
            f"Two calls of the module at `{scope}` were given replacements with different variables; calls of "
            "one module share its variables, so give them the same one.")


class Dangling(YaxRewriteError):
    """A splice left a node reading a value nothing computes; ``window`` is the
    printed IR around it (`yax._print.window`).

    Example::

        yax.sub('//module_call[@name="embed"][@method="__call__"]', lookup, mox, params=v)  # Dangling: attend reads it
        yax.sub('//module_call[@name="embed"]', NewEmbed(), mox, params=v, key=k)        # replace every call
    """

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
    out fewer values: `capture` with a query selecting the layers you suspect.

    Example::

        yax.first_nonfinite(mox, params, big_batch)        # OutOfMemory
        yax.first_nonfinite(mox, params, big_batch[:1])    # one example
    """

    def __init__(self, tool: str, e: BaseException, backward: bool = False):
        self.tool, self.backward = tool, backward
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
    before this is raised); ``changed`` names what it changed.

    Example::

        @yax.decider
        def bad(path, node):
            node.attrs["x"] = 1          # DeciderMutated: nodes are immutable
            return node
        @yax.decider
        def good(path, node):
            return dataclasses.replace(node, attrs={**node.attrs, "x": 1})
    """

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
    much more than the rule).

    Example::

        yax.sub("//max", lambda a, b: jnp.maximum(a, 0.1 * a), mox)    # InsideCustomRule: relu has a custom_jvp
        yax.sub('//activation[@path="Model/relu"]', lambda h: jnp.maximum(h, 0.1 * h), mox)
    """

    def __init__(self, node: object, rule: object, holder: object = None):
        self.node, self.rule, self.holder = node, rule, holder
        name = getattr(rule, "name", "custom_jvp_call")
        at = getattr(rule, "path", "")
        instead = f"the `{name}` equation (`//{name}[@path=\"{at}\"]`)"
        if getattr(holder, "kind", None) in ("activation", "function"):
            instead += (f" or {where(holder)} that holds it "
                        f"(`//{getattr(holder, 'kind', '*')}[@path=\"{getattr(holder, 'path', '')}\"]`)")
        super().__init__(
            f"{where(node, start=True)} is part of the computation of the `{name}` at `{at or 'the root'}`, whose "
            "derivative is given by a custom rule written for that whole computation. Replacing only this part "
            "would keep the old rule around the new computation, and `jax.grad` through the result would be "
            f"wrong. Try replacing the whole rule: select {instead}.")


def _listed(names: list[str], most: int = 4) -> str:
    """```a`, `b` …``: the first ``most`` names, and an ellipsis for the rest."""
    return ", ".join(f"`{n}`" for n in names[:most]) + (" …" if len(names) > most else "")


def _call_of(call: object) -> str:
    return f"`{getattr(call, 'type', '?')}` call at `{getattr(call, 'path', '') or 'the root'}`"


class MoxSideResults(YaxRewriteError):
    """A call used as a replacement computes values that leave it other than as its results.

    Example::

        train = yax.make_mox(lambda v, x: BN().apply(v, x, mutable=["batch_stats"]))(bv, x)
        yax.sub(target, train, mox, params=v)          # MoxSideResults
        yax.sub(target, BN(use_running_average=True), mox, params=v)
    """

    def __init__(self, call: object, types: str):
        self.call = call
        super().__init__(
            f"The MoX replacement (the {_call_of(call)}) computes values that leave it other than as its results "
            f"({types}): updated variables (batch statistics, an nnx module's state) or values the model it comes "
            "from reads elsewhere. A replacement gives only its results to the model. Try tracing it without "
            "updating its variables (evaluation mode, no `mutable=`), or pass the module itself.")


class MoxReadsUnnamed(YaxRewriteError):
    """A call used as a replacement reads values yax cannot name as its module's variables.

    Example::

        yax.sub(target, yax.make_mox(Block().bind(bv))(x), mox)   # MoxReadsUnnamed: bound variables are constants
        yax.sub(target, yax.make_mox(Block().apply)(bv, x), mox, params=v)
    """

    def __init__(self, call: object, types: str, what: str):
        self.call, self.types, self.what = call, types, what
        super().__init__(
            f"The MoX replacement (the {_call_of(call)}) reads {types}, {what}. yax can give a replacement only "
            "its inputs and its module's variables. Try tracing the module's `apply` with its variables as the "
            "first argument (`yax.make_mox(Block().apply)(variables, x)`), or pass the module itself.")


class MoxCutFromUnknown(YaxRewriteError):
    """A call node used as a replacement lives in no MoX yax knows of.

    Example::

        stray = yax.make_mox(Block().apply)(bv, x).calls[0]   # the MoX it came from is gone
        yax.sub(target, stray, mox)                            # MoxCutFromUnknown
        block = yax.make_mox(Block().apply)(bv, x); yax.sub(target, block.calls[0], mox)
    """

    def __init__(self, call: object):
        self.call = call
        super().__init__(
            f"The {_call_of(call)}, used as a replacement, is not part of any MoX that `make_mox` or `sub` made "
            "and that still exists, so yax cannot tell which of that MoX's inputs are the variables it reads. "
            "Try keeping the MoX you cut it from (assign it to a name) and cutting the node again, or passing "
            "the root MoX of the module's `apply` instead.")


class MoxNoValues(YaxRewriteError):
    """A MoX replacement reads variables the model does not have, and there is nothing to give them values.

    Example::

        yax.sub(pattern, yax.make_mox(Other().apply)(ov, x), mox, params=v)   # MoxNoValues
        yax.sub(pattern, Other(), mox, params=v, key=jax.random.key(0))       # the module: yax initialises it
    """

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
    variable the replaced node does not have.

    Example::

        yax.sub(q, yax.make_mox(Wider(nnx.Rngs(1)))(x), mox, params=state)   # MoxNoPlace: `gate` is new
        yax.sub(q, Wider(nnx.Rngs(1)), mox, params=state)                      # the module itself
    """

    def __init__(self, what: str, node: object, leaf: str, why: str):
        self.what, self.node, self.leaf = what, node, leaf
        super().__init__(
            f"The replacement `{what}` for {where(node)} reads the variable `{leaf}`, {why}. On this model "
            "a MoX replacement reads the replaced module's own variables (its state has no place for new ones, "
            "and a MoX holds no values). Try tracing it from a module with the same variables, or pass the "
            "module itself, whose variables yax adds to the state.")


class BroadcastNewVariables(YaxRewriteError):
    """A replacement adds variables to a module whose variables a scan broadcasts to every step.

    Example::

        yax.sub('//module_call[@name="ih"]', yax.LoRA(rank=2), rnn_mox, params=p, key=k)  # BroadcastNewVariables
        yax.sub('//module_call[@name="RNN"]', MyLoRARNN(), rnn_mox, params=p, key=k)       # replace the scanning module
    """

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
    ``f32[4,8]``). Every problem is listed at once; nothing is loaded.

    Example::

        yax.load_weights("w.safetensors", like=bf16_params)    # WeightsDoNotFit: f32 in the file
        yax.load_weights("w.safetensors", like=jax.eval_shape(model.init, key, x))
    """

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


# -- families of recurring messages (issue 42): one class each, with the fields tests match on --------

def _found(value: object) -> str:
    return type(value).__name__


class InputsDiffer(YaxInputError):
    """Arguments given to `eval_mox` (or the function of `to_function`, or `capture`)
    differ from those the MoX was traced with. ``argument`` names the argument as the
    user writes it (``args[1]``, ``args[0]['params']``); ``kind`` says how it differs:

    - ``"structure"``: the pytree differs; ``found`` says how (``expected`` is None);
    - ``"static"``: a static argument (baked in at trace time) has another value;
    - ``"not an array"``: an array was traced, something else was given (``found``: its type);
    - ``"type"``: an array of another shape or dtype (``expected``/``found``: ``f32[2,4]``).

    Example::

        mox = yax.make_mox(model.apply)(variables, jnp.ones((2, 4)))
        yax.eval_mox(mox, variables, jnp.ones((3, 4)))  # InputsDiffer: args[1], f32[2,4] vs f32[3,4]
        mox = yax.make_mox(model.apply)(variables, jnp.ones((3, 4)))  # trace again for the new shape
    """

    def __init__(self, argument: str, kind: str, expected: Any, found: Any):
        self.argument, self.kind, self.expected, self.found = argument, kind, expected, found
        if kind == "structure":
            text = (f"The arguments differ in structure from those the MoX was traced with: at `{argument}`, "
                    f"{found}. Pass the same pytree of arguments (same dict keys, same tuple lengths), or trace "
                    "again with `yax.make_mox`.")
        elif kind == "static":
            text = (f"Argument `{argument}` is static (baked in at trace time) and was {expected!r} when traced, "
                    f"but is {found!r} now. Trace again with `yax.make_mox` for the new value, or pass an array "
                    "to make it traced.")
        elif kind == "not an array":
            text = (f"Argument `{argument}` was an array of {expected} when traced, but is a `{found}` now. "
                    "Pass an array of that shape and dtype.")
        else:
            text = (f"Argument `{argument}` was traced as {expected} but is {found} now. Trace again with "
                    "`yax.make_mox` for new shapes or dtypes, or cast the argument.")
        super().__init__(text)


class BatchDoesNotFit(YaxInputError):
    """A batch given to the explorer (`Explorer.add_batch`, ``batches=``) differs from the
    example the model was traced with: ``kind`` is ``"structure"`` (``expected``/``found``:
    the pytree structures), ``"type"`` (an array of another shape or dtype) or ``"static"``
    (a value the model treats as fixed); ``argument`` names the argument (``args[1]``).

    Example::

        ex = Explorer(model, variables, jnp.ones((2, 8), jnp.int32))
        ex.add_batch("long", jnp.ones((2, 9), jnp.int32))  # BatchDoesNotFit: i32[2,9] vs i32[2,8]
        ex.add_batch("other", jnp.zeros((2, 8), jnp.int32))  # same shapes: fine
    """

    def __init__(self, batch: str, kind: str, expected: Any, found: Any, argument: str = ""):
        self.batch, self.kind, self.expected, self.found, self.argument = batch, kind, expected, found, argument
        if kind == "structure":
            text = (f"The batch `{batch}` is structured as `{found}`, but the model was traced with `{expected}`. "
                    "Give the same arguments as the example (after the parameters), with arrays of the same shapes.")
        elif kind == "static":
            text = (f"The batch `{batch}` gives `{found!r}` for `{argument}`, but the model was traced with "
                    f"`{expected!r}`, which it treats as fixed. Give the same value, or open another explorer.")
        else:
            text = (f"The batch `{batch}` gives {found} for `{argument}`, but the model was traced with {expected}. "
                    "Give arrays of the traced shapes and dtypes (cast with `.astype`), or open another explorer "
                    "for other shapes.")
        super().__init__(text)


class NotARootMox(YaxInputError):
    """A function that works on a whole model (``tool``: `eval_mox`, `capture`, `compare`,
    `to_function`, `Explorer`) was given something other than the root MoX `make_mox`
    returns: a node inside it, or another object (``found`` says what).

    Example::

        dense = yax.query("//module_call[@name='Dense_0']", mox)[0]
        yax.eval_mox(dense, variables, x)  # NotARootMox: a node, not the root
        yax.eval_mox(mox, variables, x)    # the whole MoX; rewrite nodes with `yax.sub`
    """

    def __init__(self, tool: str, found: str, hint: str = "", role: str = ""):
        self.tool, self.found, self.role = tool, found, role
        as_ = f" as `{role}`" if role else ""
        super().__init__(f"`{tool}` expected the root MoX returned by `yax.make_mox(fn)(...)`{as_}, but got {found}."
                         + (f" {hint}" if hint else ""))


class WrongType(YaxInputError):
    """An argument (``argument``, as the function names it) is of a type the function does
    not take: ``expected`` says what it takes, ``found`` is the type's name given.

    Example::

        explorer.query(3)              # WrongType: `xpath` must be an XPath string, but got a `int`
        explorer.query("//activation")
    """

    def __init__(self, argument: str, expected: str, value: object, hint: str = "", show: bool = False):
        self.argument, self.expected, self.found = argument, expected, _found(value)
        shown = f"`{str(value)[:40]}` (a `{self.found}`)" if show else f"a `{self.found}`"
        super().__init__(f"`{argument}` must be {expected}, but got {shown}." + (f" {hint}" if hint else ""))


class UnknownName(YaxInputError):
    """A name (``name``) that names no ``kind`` known here (a batch, a registered
    replacement, a state of the explorer's history); ``known`` lists the names there are.

    Example::

        explorer.add_batch("clean", x)
        explorer.use_batch("dirty")    # UnknownName: no batch named 'dirty' (known: 'clean')
    """

    def __init__(self, kind: str, name: object, known: list[str], hint: str = ""):
        self.kind, self.name, self.known = kind, name, list(known)
        listed = ", ".join(map(repr, self.known)) or "none"
        super().__init__(f"There is no {kind} named {str(name)[:40]!r} (known: {listed})."
                         + (f" {hint}" if hint else ""))


class LossNotAFunction(YaxCaptureError, YaxInputError):
    """``grad_of`` (of `capture`, `first_nonfinite` or the explorer: ``tool``) is not a function of
    the model's output; ``found`` is the type given. See `LossNotScalar` for one that returns
    something other than a scalar.

    Example::

        yax.capture("//activation", mox, variables, x, grad_of=0.5)  # LossNotAFunction
        yax.capture("//activation", mox, variables, x, grad_of=lambda out: jnp.mean(out ** 2))
    """

    def __init__(self, tool: str, value: object):
        self.tool, self.found = tool, _found(value)
        super().__init__(
            f"`grad_of` must be a function of the model's output returning a scalar loss, but got a "
            f"`{self.found}`. Pass e.g. `grad_of=lambda out: jnp.mean(out ** 2)`.")


class PatchDoesNotFit(YaxCaptureError):
    """A value given to `patch` (or a function's result) does not fit the node it replaces:
    ``kind`` is ``"structure"`` (``expected``/``found``: the trees), ``"type"`` (an array of
    another shape or dtype, ``index`` the output) or ``"key"`` (``key`` was not matched by
    the pattern; ``expected`` lists the keys it matched).

    Example::

        patched = yax.patch("//module_call[@name='Block_0']", mox)
        patched({"Model/Block_0": jnp.zeros((2, 8, 16))}, variables, x)  # PatchDoesNotFit: f32[2,8,32] there
        patched({"Model/Block_0": jnp.zeros((2, 8, 32))}, variables, x)
    """

    def __init__(self, key: str, kind: str, expected: Any, found: Any, what: str = "The patch gives",
                 index: int | None = None, note: str = ""):
        self.key, self.kind, self.expected, self.found, self.index = key, kind, expected, found, index
        if kind == "key":
            text = (f"The patch names `{key}`, which the pattern did not match (it matched {expected}). Use the "
                    "keys `yax.capture` gives for the same pattern.")
        elif kind == "structure":
            text = (f"{what} `{found}` for `{key}`, but the node's output is `{expected}`. Give a value of the "
                    "same structure, such as the one `yax.capture` returns for this key.")
        else:
            part = f" (output {index})" if index is not None else ""
            text = (f"{what} {found} for `{key}`{part}, but the node's output there is {expected}.{note} Give an "
                    "array of that shape and dtype (cast with `.astype`), such as the value `yax.capture` returns "
                    "for this key.")
        super().__init__(text)


class WrongNodeKind(YaxRewriteError):
    """A rewrite was pointed at a node of a kind it does not replace: ``tool`` (`sub`,
    `replace_modules`, an nnx or Equinox module replacement, a precision policy) replaces
    ``accepts``, and the pattern matched ``found`` (``node``, when it is a node).

    Example::

        yax.sub("//activation[@name='relu']", nnx.Linear(4, 4, rngs=rngs), mox)  # WrongNodeKind
        yax.sub("//activation[@name='relu']", jax.nn.gelu, mox)  # activations take functions
    """

    def __init__(self, tool: str, accepts: str, found: str, hint: str, node: object = None, pattern: str = ""):
        self.tool, self.accepts, self.found, self.node = tool, accepts, found, node
        matched = f"{pattern!r} matched" if pattern else "the pattern matched"
        super().__init__(f"{tool} {accepts}, but {matched} {found}. {hint}")


class ForeignModule(YaxRewriteError):
    """A replacement module belongs to another module system (``frontend``) than the model's
    (``system``), so its variables have no place in the model's variables.

    Example::

        yax.sub("//module_call[@name='fc1']", flax.linen.Dense(8), nnx_mox)  # ForeignModule
        yax.sub("//module_call[@name='fc1']", nnx.Linear(4, 8, rngs=rngs), nnx_mox, params=state)
    """

    def __init__(self, what: str, node: object, frontend: str, system: str, home: str, hint: str):
        self.what, self.node, self.frontend, self.system = what, node, frontend, system
        super().__init__(f"The replacement `{what}` for {where(node)} is a `{frontend}` module; its variables cannot "
                         f"live in {home}. {hint}")


class MixedReplacements(YaxRewriteError):
    """One `sub` gives a model of a module system whose state yax rebuilds (nnx, Equinox:
    ``system``) both module replacements and other kinds (functions, MoXes).

    Example::

        yax.sub(q, lambda path, node: nnx.Linear(4, 4, rngs=rngs) if "fc" in path else jax.nn.relu, mox, params=state)
        # MixedReplacements: do the modules and the functions in two `sub` calls
        new, state2 = yax.sub(fc, nnx.Linear(4, 4, rngs=rngs), mox, params=state)
        new = yax.sub("//activation", jax.nn.gelu, new)
    """

    def __init__(self, system: str, node: object, what: str = ""):
        self.system, self.node = system, node
        super().__init__(f"This `sub` mixes {system} module replacements with other kinds ({what}for "
                         f"{where(node)}); do them in two `sub` calls.")


class KeepsNothing(YaxRewriteError):
    """A module replacement keeps none of the replaced module's variables although some of
    its own have the same shapes: most likely they were renamed, and trained weights would be
    lost. ``alike`` lists the replacement's leaves that have an old leaf's shape.

    Example::

        yax.sub(q, LoRADense(8), mox, params=p, key=key)  # KeepsNothing: `base/kernel` fits `kernel`
        yax.sub(q, LoRADense(8), mox, params=p, key=key, keep={"params/base/kernel": "params/kernel"})
    """

    def __init__(self, what: str, node: object, alike: list[str], fate: str, hint: str):
        self.what, self.node, self.alike = what, node, list(alike)
        shown = f" ({_listed(self.alike)})" if self.alike else ""
        super().__init__(f"The replacement `{what}` for {where(node)} keeps none of its variables, so its trained "
                         f"weights would be {fate}, although the replacement has leaves of the same shapes{shown}. "
                         f"{hint}")


class CannotAdapt(YaxRewriteError):
    """`yax.LoRA` was pointed at a node it has no adapter for: ``knows`` says which layers it
    adapts, ``found`` what the node has or is.

    Example::

        yax.sub("//module_call[@type='Conv']", yax.LoRA(rank=4), mox, params=p, key=key)  # CannotAdapt
        yax.sub("//module_call[@type='Conv']", MyConvAdapter(rank=4), mox, params=p, key=key)
    """

    def __init__(self, node: object, knows: str, found: str, adapter: bool = True):
        self.node, self.knows, self.found = node, knows, found
        hint = (" Write an adapter for that layer (a module computing the layer plus a low-rank update) and pass it "
                "to `yax.sub`.") if adapter else ""
        super().__init__(f"`yax.LoRA` adapts {knows}, but {where(node)} {found}.{hint}")


class UnknownFields(YaxRewriteError):
    """`module_of(node, **changes)` was asked to change what the node's module class does not
    have: ``unknown`` lists the names, ``known`` those it has (``noun``: fields, or constructor
    arguments for nnx).

    Example::

        yax.module_of(dense, width=8)     # UnknownFields: `Dense` has no field `width`
        yax.module_of(dense, features=8)
    """

    def __init__(self, type_name: str, path: str, unknown: list[str], known: list[str], noun: str = "field"):
        self.type, self.path, self.unknown, self.known = type_name, path, list(unknown), list(known)
        super().__init__(f"`module_of` changes the {noun}s of the `{type_name}` at {path!r}, which has no {noun} "
                         f"{', '.join(f'`{k}`' for k in self.unknown)}. Its {noun}s: {', '.join(self.known)}.")


class CannotRebuild(YaxRewriteError):
    """`module_of` cannot rebuild the module of a call node: ``why`` says what stops it (a
    module system that builds no module from a call's fields, attributes that come out
    different when rebuilt from the constructor).

    Example::

        yax.module_of(node)                    # CannotRebuild: build it yourself instead
        yax.sub(q, MyBlock(width=8), mox)
    """

    def __init__(self, type_name: str, path: str, why: str, hint: str):
        self.type, self.path, self.why = type_name, path, why
        super().__init__(f"`module_of` cannot rebuild the `{type_name}` at {path!r}: {why}. {hint}")


class ParamsDoNotFit(YaxRewriteError):
    """The ``params`` given to a rewrite are not the variables the MoX was traced with: a
    leaf of another shape (``leaf``, ``expected``, ``found``), leaves missing, or another
    kind of object than the module system keeps its variables in.

    Example::

        new, new_params = yax.sub(q, Dense(8), mox, params=other_params)  # ParamsDoNotFit
        new, new_params = yax.sub(q, Dense(8), mox, params=variables)     # as traced
    """

    def __init__(self, problem: str, hint: str, leaf: str | None = None, expected: Any = None, found: Any = None):
        self.problem, self.leaf, self.expected, self.found = problem, leaf, expected, found
        super().__init__(f"{problem} {hint}")


class DeclaresDTD(YaxXMLError):
    """A document given to `load_xml` declares a DTD or entities (``<!DOCTYPE``, ``<!ENTITY``).
    yax documents never do; such input is refused before parsing, as entity expansion
    (billion laughs) and external entities are unsafe.

    Example::

        yax.load_xml(b'<!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>')  # DeclaresDTD
        yax.load_xml(yax.to_xml(mox).encode())                         # what dump_xml writes loads
    """

    def __init__(self) -> None:
        super().__init__(
            "The document declares a DTD or entities, which yax documents never contain; it was refused unparsed "
            "(entity expansion and external entities are unsafe).")


class DocumentTooLarge(YaxXMLError):
    """A document given to `load_xml` is larger than a limit: ``limit_name`` is ``"max_bytes"``
    (its size, ``size`` when known before reading) or ``"max_memory"`` (what it would take once
    parsed); ``limit`` is the limit. ``unread`` says whether it was refused before reading.

    Example::

        yax.load_xml(path, max_bytes=1_000)            # DocumentTooLarge for a larger file
        yax.load_xml(path, max_bytes=50_000_000)       # a larger limit, for a document you trust
    """

    def __init__(self, limit_name: str, limit: int, size: int | None = None, unread: bool = False):
        self.limit_name, self.limit, self.size, self.unread = limit_name, limit, size, unread
        if limit_name == "max_memory":
            text = (f"The document would take more than `max_memory` = {limit} bytes once parsed (about {size} bytes "
                    "for what was read so far); reading stopped there. Pass a larger `max_memory` if you trust it.")
        elif unread:
            text = (f"The document is {size} bytes, larger than the limit of {limit} bytes; it was refused unread. "
                    "Pass a larger `max_bytes` (and `max_memory`) if you trust it.")
        else:
            text = (f"The document is larger than the limit of {limit} bytes; reading stopped there. Pass a larger "
                    "`max_bytes` (and `max_memory`) if you trust it.")
        super().__init__(text)


class NotWellFormed(YaxXMLError):
    """A document given to `load_xml` is not well-formed XML; ``detail`` is the parser's
    account (message, line and column).

    Example::

        yax.load_xml(b"<mox><unclosed></mox>")   # NotWellFormed: mismatched tag, line 1, column 17
    """

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(f"The document is not well-formed XML: {detail}.")


class BadPolicy(YaxRewriteError):
    """A mixed-precision policy given to `mixed_precision` is not one yax reads: ``policy`` is
    what was given, ``part`` the part it could not read (or None when the whole is of the wrong
    type).

    Example::

        yax.mixed_precision(mox, {"//module_call": "compute=bf17"})      # BadPolicy: part 'compute=bf17'
        yax.mixed_precision(mox, {"//module_call": "compute=bfloat16"})
    """

    def __init__(self, policy: object, part: str | None, message: str):
        self.policy, self.part = policy, part
        super().__init__(message)


# -- more families (issue 42, point 6): traces, queries, time limits, dependencies, files, comparisons ----

class CouldNotTrace(YaxTraceError):
    """JAX failed while tracing the function given to `make_mox` (``function``: its name);
    ``error`` is what JAX or the function raised (also chained as ``__cause__``). With
    ``static``, the failure is JAX needing a concrete value (`jax.errors.ConcretizationTypeError`),
    and the message says how to make that argument static.

    Example::

        yax.make_mox(lambda x: x.reshape(7))(jnp.ones(3))       # CouldNotTrace: TypeError from reshape
        yax.make_mox(lambda x: x.reshape(3, 1))(jnp.ones(3))
    """

    def __init__(self, function: str, error: BaseException, static: bool = False):
        self.function, self.error, self.static = function, error, static
        hint = ("\nAn argument used as a Python value there (`int(...)`, a shape, an `if`) must be static: "
                "pass its position in `static_argnums=(i,)` or its name in `static_argnames=('name',)` "
                "to `make_mox` (or to `Explorer`/`%yax`), and give it as a NumPy array or Python value."
                if static else "")
        super().__init__(
            f"JAX could not trace `{function}`: {type(error).__name__}: {error}\n"
            "The function must be traceable by `jax.make_jaxpr` with these arguments; "
            "Python scalars are static (like `train=False`), arrays are traced." + hint)


class InvalidXPath(YaxQueryError):
    """An XPath given to `query` (or `sub`, `capture`, the explorer) is invalid or failed
    while being evaluated. ``xpath`` is the query, ``kind`` what went wrong:

    - ``"syntax"``: lxml could not compile it (``detail``: lxml's error);
    - ``"regex"``: a regular expression in an ``re:`` function is invalid;
    - ``"call"``: a function was called with the wrong arguments;
    - ``"evaluation"``: lxml could not evaluate it (an unknown function or variable);
    - ``"memory"``: it ran out of memory while being evaluated.

    ``hint`` is what the message suggests for a syntax or evaluation error (such as
    quoting a string value), or "".

    Example::

        yax.query("//module_call[", mox)                   # InvalidXPath: kind "syntax"
        yax.query("//module_call[@type='Dense']", mox)
    """

    def __init__(self, xpath: str, kind: str, detail: str = "", hint: str = ""):
        self.xpath, self.kind, self.detail, self.hint = xpath, kind, detail, hint
        q = xpath if len(xpath) <= 300 else xpath[:299] + "…"
        if kind == "regex":
            text = (f"A regular expression in the XPath `{q}` is invalid: {detail}. The `re:` functions take Python "
                    "regular expressions; escape a special character such as `(` as `\\(`.")
        elif kind == "call":
            text = (f"A function in the XPath `{q}` was called with the wrong arguments ({detail}). The EXSLT ones "
                    "are `re:test(string, pattern[, flags])`, `re:match(string, pattern[, flags])` and "
                    "`re:replace(string, pattern, flags, replacement)`.")
        elif kind == "memory":
            text = (f"The XPath `{q}` ran out of memory while being evaluated. Narrow it, e.g. "
                    'start from `//module_call[@type="Dense"]` rather than `//*`.')
        elif kind == "syntax":
            text = f"The XPath `{q}` is invalid: lxml reported {detail}. {hint}"
        else:
            text = f"The XPath `{q}` could not be evaluated: lxml reported {detail}. {hint}"
        super().__init__(text.rstrip())


class Timeout(YaxError):
    """Something yax runs in another process (``what``: an XPath query, Graphviz's layout)
    took longer than its limit, ``seconds``, and was stopped. `QueryTimeout` and
    `RenderTimeout` are the two kinds; catch this class for either.

    Example::

        yax.query(slow_xpath, mox, timeout=0.5)            # QueryTimeout (a Timeout)
        yax.to_svg(mox, timeout=0.001)                     # RenderTimeout (a Timeout)
    """

    def __init__(self, what: str, seconds: float, hint: str):
        self.what, self.seconds = what, seconds
        super().__init__(f"{what} took longer than {seconds:g} s and was stopped. {hint}")


class QueryTimeout(Timeout, YaxQueryError):
    """An XPath query (``xpath``) ran past its ``timeout`` (``seconds``); its process was
    stopped, and the next query starts a new one.

    Example::

        yax.query('//*[count(//*) > 1]', mox, timeout=0.5)  # QueryTimeout: every node searches the whole document
        yax.query('//module_call[@type="Dense"]', mox)
    """

    def __init__(self, xpath: str, seconds: float):
        self.xpath = xpath
        q = xpath if len(xpath) <= 300 else xpath[:299] + "…"
        super().__init__(
            f"The XPath `{q}`", seconds,
            "A regular expression that backtracks (`re:test(@path, \"(a+)+$\")`) or a predicate that searches "
            "the whole document for every node (`//*[count(//*) > 1]`) can run for hours. Simplify the query, "
            "or pass a larger `timeout` if it is only slow.")


class RenderTimeout(Timeout, YaxRenderError):
    """Graphviz's ``dot`` took longer than ``timeout`` (``seconds``) to lay out a graph
    (`to_svg`) and was stopped.

    Example::

        yax.to_svg(mox, equations=True, timeout=0.001)     # RenderTimeout
        yax.to_svg(mox, depth=1)                           # draw less of it
    """

    def __init__(self, seconds: float):
        super().__init__(
            "Graphviz's layout of the graph", seconds,
            "Draw less of it: pass `depth=1`, a `root` XPath selecting one module, or `equations=False`; or "
            "raise `timeout`.")


class MissingDependency(YaxDependencyError):
    """``needs`` (a yax function) needs ``package`` (a Python package or a program), which
    is not installed; ``install`` says how to get it.

    Example::

        yax.save_weights(params, "w.safetensors")  # MissingDependency: package "safetensors"
        # pip install safetensors
    """

    def __init__(self, needs: str, package: str, install: str, hint: str = "", missing: str = "is not installed"):
        self.needs, self.package, self.install = needs, package, install
        verb = "need" if " and " in needs else "needs"
        super().__init__(f"{needs} {verb} {package}, which {missing}. Install it with {install}."
                         + (f" {hint}" if hint else ""))


class CannotRead(YaxXMLError):
    """`load_xml` could not read its source: ``problem`` is ``"source"`` (not a file object,
    a path or bytes; ``detail``: its type), ``"open"`` or ``"read"`` (the file at ``path``;
    ``detail``: the system's reason), ``"chunk"`` (a file object's ``read`` returned something
    else than bytes or str) or ``"seek"`` (a document nested too deep for one reading, from a
    file object that cannot be read again).

    Example::

        yax.load_xml("<mox/>")                   # CannotRead: a str is a path; this one looks like XML text
        yax.load_xml(b"<mox/>")
    """

    def __init__(self, problem: str, detail: str = "", path: str | None = None, looks_like_xml: bool = False):
        self.problem, self.detail, self.path, self.looks_like_xml = problem, detail, path, looks_like_xml
        if problem == "source":
            text = (f"`load_xml` expected a file object, a path (`str` or `pathlib.Path`) or `bytes`, but got a "
                    f"`{detail}`. Open the file (`open(path, 'rb')`) or pass its contents as bytes.")
        elif problem == "open":
            hint = (" The string looks like XML text rather than a path: pass `text.encode()` or "
                    "`io.StringIO(text)`." if looks_like_xml else "")
            text = f"`load_xml` could not open the file `{path}`: {detail}.{hint}"
        elif problem == "read":
            text = f"`load_xml` could not read `{path}`: {detail}."
        elif problem == "chunk":
            text = f"The file object's `read` returned a `{detail}`, not bytes or str."
        else:
            text = ("The document is nested more than 2048 levels deep, which needs a second reading that this "
                    "file object cannot give (it cannot seek). Pass the path or the bytes instead.")
        super().__init__(text)


class CannotSaveLeaves(YaxInputError):
    """`save_weights` (``argument``: ``params``) or `load_weights` (``like``) was given a tree
    whose leaves cannot go to or come from a safetensors file: ``problem`` is ``"not arrays"``,
    ``"dtype"`` (a dtype safetensors cannot store), ``"same key"`` (two leaves whose paths
    joined with ``/`` are one key) or ``"reserved"`` (the key safetensors keeps for metadata);
    ``leaves`` lists them (as keys, or as paths for ``"same key"``).

    Example::

        yax.save_weights({"n": 3}, "w.safetensors")            # CannotSaveLeaves: `n` is not an array
        yax.save_weights({"n": jnp.asarray(3)}, "w.safetensors")
    """

    def __init__(self, argument: str, problem: str, leaves: list[str], text: str):
        self.argument, self.problem, self.leaves = argument, problem, list(leaves)
        super().__init__(text)


class BadWeightsFile(YaxInputError):
    """`load_weights` refused the file at ``path``: ``problem`` is ``"not safetensors"``
    (``detail``: the reader's error), ``"version"`` (yax weights of another format version),
    ``"key arrays"`` (its metadata's list of PRNG key arrays is not what `save_weights`
    writes; ``detail`` says what it is), ``"changed"`` (it changed while being read) or
    ``"unreadable"`` (the system could not read it; ``detail``: why). Nothing was loaded.

    Example::

        yax.load_weights("notes.txt", like=params)          # BadWeightsFile: not a safetensors file
        yax.load_weights("w.safetensors", like=params)      # one written by `yax.save_weights`
    """

    def __init__(self, path: str, problem: str, detail: str, text: str):
        self.path, self.problem, self.detail = path, problem, detail
        super().__init__(text)


class CannotCompare(YaxInputError):
    """`compare`, `compare_all` or the explorer's references (``tool``) were given models or
    options that cannot be compared: ``problem`` is ``"two references"`` (two references and
    no model), ``"options"`` (options for two MoXes given with a `Reference`), ``"names"``
    (fewer than two models, or names that repeat: ``found``), ``"reserved name"`` (a reference
    named like a state of the history: ``found``) or ``"unmatched"`` (the mapping of names
    sends the reference's ``found[0]`` to ``found[1]``, which matches no call of the model).

    Example::

        yax.compare(ref, ref, params, x)          # CannotCompare: two references, no model
        yax.compare(ref, mox, params, x)
    """

    def __init__(self, tool: str, problem: str, text: str, found: Any = None):
        self.tool, self.problem, self.found = tool, problem, found
        super().__init__(text)


class NnxCannotReplace(YaxRewriteError):
    """An nnx module cannot be put in for a call (`sub` with an nnx module, `replace_modules`):
    ``problem`` is ``"stacked"`` (the call runs inside `nnx.scan`/`nnx.vmap` over stacked
    layers), ``"not a module"`` (a factory returned something else: ``found``), ``"not held"``
    (no attribute of the model holds the module: something builds it on each call),
    ``"graphdef gone"`` (functions were put in before, so no nnx model computes the MoX),
    ``"updates"`` (the replacement updates its variable ``found[0]`` inside the transform ``found[1]``),
    ``"no method"`` (the replacement lacks the method the model calls: ``found``) or
    ``"keep"`` (`keep=` was given). ``node`` is the call (None when there is none).

    Example::

        new = yax.sub("//activation", jax.nn.gelu, mox, params=state)
        yax.sub(fc, nnx.Linear(4, 4, rngs=rngs), new, params=state)   # NnxCannotReplace: "graphdef gone"
        yax.sub(fc, nnx.Linear(4, 4, rngs=rngs), mox, params=state)   # modules first, then functions
    """

    def __init__(self, problem: str, text: str, node: object = None, found: Any = None):
        self.problem, self.node, self.found = problem, node, found
        super().__init__(text)


class PolicyNotApplied(YaxRewriteError):
    """`mixed_precision` could not apply its policy (``policy``) to the layer at ``path``:
    ``problem`` is ``"output"`` (the policy asks for ``expected`` outputs where the layers
    after it were traced with ``found``), ``"dtype"`` (the layer's own ``dtype`` could not be
    set: ``cause`` says why) or ``"rewrite"`` (rebuilding the layers was refused: ``cause``).

    Example::

        yax.mixed_precision(mox, {"//module_call": "compute=bfloat16,output=bfloat16"})  # PolicyNotApplied
        yax.mixed_precision(mox, {"//module_call": "compute=bfloat16"})
    """

    def __init__(self, problem: str, text: str, path: str | None = None, policy: object = None,
                 expected: Any = None, found: Any = None, cause: BaseException | None = None):
        self.problem, self.path, self.policy = problem, path, policy
        self.expected, self.found, self.cause = expected, found, cause
        super().__init__(text)


# -- more families (issue 42, point 6, continued): values out of range, selections, dtypes, maps, taps ----

class BadValue(YaxError):
    """An argument (``argument``) is of a type the function takes but has a value it does
    not: out of range, empty, too long. ``expected`` says what it takes, ``value`` is what
    was given. Catch this class for any; each kind is also of its function's category:
    `BadArgument` (`YaxInputError`), `BadQueryArgument` (`YaxQueryError`) and `BadLimit`
    (`YaxXMLError`).

    Example::

        yax.query("//activation", mox, timeout=0)          # BadQueryArgument (a BadValue)
        yax.query("//activation", mox, timeout=5)
    """

    def __init__(self, argument: str, expected: str, value: object, subject: str = ""):
        self.argument, self.expected, self.value = argument, expected, value
        super().__init__(f"{subject or f'`{argument}`'} must be {expected}, but got {value!r}.")


class BadArgument(BadValue, YaxInputError):
    """A value given to the explorer (``argument``: a batch's or a replacement's name) is
    not one it takes (``expected``); ``value`` is what was given.

    Example::

        explorer.add_replacement("", jax.nn.relu)         # BadArgument: a name must be a non-empty string
        explorer.add_replacement("ReLU", jax.nn.relu)
    """


class BadQueryArgument(BadValue, YaxQueryError):
    """An option of `query` (``argument``: ``timeout``) has a value it does not take
    (``expected``); ``value`` is what was given.

    Example::

        yax.query("//activation", mox, timeout=0)          # BadQueryArgument: a positive number of seconds
        yax.query("//activation", mox, timeout=5)
    """


class BadLimit(BadValue, YaxXMLError):
    """A limit given to `load_xml` (``argument``: ``max_bytes`` or ``max_memory``: a
    non-negative whole number of bytes) or `dump_xml`/`to_xml` (``indent``: a number of
    spaces from 0 to 64) is out of its range; ``value`` is what was given, ``expected``
    what is taken.

    Example::

        yax.load_xml(data, max_bytes=-1)         # BadLimit
        yax.load_xml(data, max_bytes=50_000_000)
    """

    def __init__(self, argument: str, value: object, expected: str = "a non-negative number of bytes"):
        super().__init__(argument, expected, value)


def _code(name: str) -> str:
    """A tool's name for a message: ``sub`` as code (`` `sub` ``), a phrase (``the ReLU replacement``) as is."""
    return f"`{name}`" if name.replace(".", "").replace("_", "").isalnum() else name


class NotInMox(YaxRewriteError, YaxCaptureError, YaxInputError):
    """A node given to yax (``node``) is not a node of the MoX that ``tool`` (`sub`,
    `capture`, `patch`, `compare`, the explorer) works on: it comes from another MoX, or
    from this one before a rewrite (`sub` returns a new MoX, with new nodes where it
    changed something). It is a `YaxRewriteError`, a `YaxCaptureError` and a
    `YaxInputError`, so code catching the category of any of these tools catches it.

    Example::

        old = yax.query("//activation", mox)[0]
        new = yax.sub(old, jax.nn.gelu, mox)
        yax.sub(old, jax.nn.relu, new)                     # NotInMox: `old` is a node of `mox`
        yax.sub("//activation", jax.nn.relu, new)          # query the MoX you rewrite
    """

    def __init__(self, node: object, tool: str, of: str = "this MoX", hint: str = "Query the MoX you work on."):
        self.node, self.tool = node, tool
        super().__init__(f"{where(node, start=True)} is not a node of {of}, so {_code(tool)} cannot use it. {hint}")


class NotNodes(YaxRewriteError, YaxCaptureError, YaxInputError):
    """An XPath (``xpath``) given to ``tool`` (`sub`, `capture`, the explorer's palette),
    which works on the nodes it selects, gives a number, a string or a boolean
    (``found``) instead; or a list of nodes given to it is empty (``found`` is ``[]``).
    Like `NotInMox`, it is a `YaxRewriteError`, a `YaxCaptureError` and a `YaxInputError`.

    Example::

        yax.sub("count(//activation)", jax.nn.gelu, mox)  # NotNodes: a float, not nodes
        yax.sub("//activation", jax.nn.gelu, mox)
    """

    def __init__(self, tool: str, xpath: str, found: object):
        self.tool, self.xpath, self.found = tool, xpath, found
        if isinstance(found, list):
            text = f"There are no nodes for {_code(tool)} to work on; give at least one."
        else:
            text = (f"The XPath `{xpath}` gives the {type(found).__name__} {found!r}, not nodes, so {_code(tool)} has "
                    "nothing to work on. Use a location path such as `//module_call[@type=\"Dense\"]`.")
        super().__init__(text)


class NotOneNode(YaxQueryError, YaxInputError):
    """An XPath (``xpath``) given where one node is needed (``tool``: `to_dot`'s ``root``,
    `Explorer.values`) selected ``count`` nodes of the kind it takes, none or several. Narrow
    the query until it selects exactly one.

    Example::

        yax.to_dot(mox, root='//module_call[@type="Block"]')        # NotOneNode: count 2
        yax.to_dot(mox, root='(//module_call[@type="Block"])[1]')
    """

    def __init__(self, tool: str, xpath: str, count: int):
        self.tool, self.xpath, self.count = tool, xpath, count
        if tool == "to_dot":
            what = f"{count} nodes" if count else "no module call"
            text = (f"`to_dot` expected `root` to select exactly one module call, but `{xpath}` selected {what}. "
                    'Narrow the query, e.g. `(//module_call[@type="Block"])[1]`.')
        else:
            text = (f"`{tool}` shows one node, but `{xpath}` selects {count}. Make the query select exactly one "
                    "call or equation.")
        super().__init__(text)


class ParamDtypeDiffers(YaxRewriteError):
    """The model holds a layer's parameters in a dtype (``held``) other than the one a layer
    built from a class would have, so a rewrite cannot keep them as they are: ``problem`` is

    - ``"keep"``: a replacement (``what``, for ``node``) declares the leaf ``path`` as
      ``declared``; keeping the model's values would change them, initialising it afresh
      would lose them (``given``: whether ``params=`` was passed);
    - ``"merge"``: `merge_lora` would rebuild the layer (``what``: its class) at ``path`` from
      its class, which has no field for the parameters' dtype (``declared`` is None).

    Example::

        yax.sub(dense, nn.Dense(3, param_dtype=jnp.bfloat16), mox, params=f32_params)  # ParamDtypeDiffers
        yax.sub(dense, nn.Dense(3), mox, params=f32_params)
    """

    def __init__(self, problem: str, what: str, path: str, held: Any, declared: Any = None,
                 node: object = None, given: bool = True):
        self.problem, self.what, self.path, self.node = problem, what, path, node
        self.held, self.declared = held, declared
        if problem == "merge":
            text = (f"`merge_lora` folds each adapter back into its layer rebuilt from the layer's class, but the "
                    f"`{what}` at {path!r} holds its parameters as {held} and its class has no field for their "
                    "dtype (`param_dtype`), so the rebuilt layer would compute in another dtype. Keep the adapted "
                    "model (it is exact), or fold by hand: weight + (lora_a @ lora_b) * alpha / rank.")
        else:
            text = (f"The replacement `{what}` for {where(node)} would keep the model's `{path}`, a {held} array, "
                    f"but declares it {declared}: keeping it would change its values"
                    + ("" if given else " (or, without `params=`, their type)") +
                    ", and initialising it afresh would throw the trained weights away. Give the replacement "
                    f"parameters of type {held} (`param_dtype=`), or convert the model's parameters first.")
        super().__init__(text)


NO_VALUES = ("Values, colouring, the NaN search and the comparison need concrete parameters: this explorer was "
             "opened with abstract ones (`jax.ShapeDtypeStruct`), which give the structure only; open it with "
             "the real weights to see numbers.")
"""What the explorer says for a model opened with abstract parameters (`AbstractParams`)."""


class AbstractParams(YaxInputError):
    """The explorer was opened with abstract parameters (`jax.ShapeDtypeStruct`: the
    structure only), so what needs numbers (``tool``: ``"values"`` for values, colouring,
    the NaN search and the comparison; ``"export"``) cannot run.

    Example::

        ex = Explorer(model, jax.eval_shape(model.init, key, x), x)
        ex.values("//activation")                          # AbstractParams
        ex = Explorer(model, model.init(key, x), x)        # the real weights
    """

    def __init__(self, tool: str):
        self.tool = tool
        super().__init__(
            "Export writes the model's parameters beside its program, but this explorer was opened with abstract "
            "ones (`jax.ShapeDtypeStruct`); open it with the real weights to export." if tool == "export"
            else NO_VALUES)


class Unmappable(YaxRewriteError):
    """A replacement module for a call that runs inside a mapping transform (``transform``:
    ``nn.vmap``, ``nnx.vmap``) cannot be mapped like the original: ``why`` says what yax
    found (variables stacked along another axis than 0, ``axis``; mapped axes of several
    sizes; variables it cannot find). ``node`` is the call.

    Example::

        yax.sub(heads, yax.LoRA(rank=2), mox, params=p, key=k)      # Unmappable: stacked along axis 1
        yax.sub(heads, lambda h: h * 0.5, mox)                      # a function of the node's inputs
    """

    def __init__(self, node: object, why: str, transform: str, axis: int | None = None):
        self.node, self.why, self.transform, self.axis = node, why, transform, axis
        super().__init__(
            f"{where(node, start=True)} runs inside `{transform}`, {why}. yax maps a replacement module like "
            "the original over one axis, with variables stacked along axis 0 or broadcast (one set for every "
            f"instance). Replace the module that calls the `{transform}`, or use a function of the node's inputs.")


class CannotComeOut(YaxCaptureError):
    """A pattern given to `capture`, `patch` or the explorer (``tool``) matched ``node``,
    which runs inside ``holder`` (the name of an equation such as ``while``, ``cond`` or a
    custom derivative rule, at ``holder_path``) whose values cannot be brought out: ``why``
    says why. Match a node outside it, or the equation itself.

    Example::

        yax.capture("//while//add", mox, x)   # CannotComeOut: holder "while"
        yax.capture("//while", mox, x)
    """

    def __init__(self, tool: str, pattern: Any, node: object, holder: str, holder_path: str, why: str):
        self.tool, self.pattern, self.node, self.holder, self.holder_path, self.why = (
            tool, pattern, node, holder, holder_path, why)
        shown = f"`{pattern}`" if isinstance(pattern, str) else "given"
        super().__init__(
            f"The pattern {shown} matched {where(node)}, which runs inside the `{holder}` in "
            f"`{holder_path or 'the root'}`: {why}. Match a node outside it, or the `{holder}` equation itself "
            f"(`//{holder}`), whose outputs `{tool}` can use.")


class BadArgnums(YaxCaptureError):
    """``argnums`` given to `first_nonfinite` does not name what it can differentiate:
    ``problem`` is ``"range"`` (``argnums`` holds ``found``, not an index of the ``count``
    positional arguments) or ``"not floating"`` (the MoX traced no floating array at those
    arguments, ``found``: a Python number is static).

    Example::

        yax.first_nonfinite(mox, params, x, grad_of=loss, argnums=2)   # BadArgnums: "range", 2 arguments
        yax.first_nonfinite(mox, params, x, grad_of=loss, argnums=0)
    """

    def __init__(self, problem: str, found: Any, count: int = 0):
        self.problem, self.found, self.count = problem, found, count
        if problem == "range":
            text = (f"`argnums` names positional arguments to differentiate, like `jax.grad`'s, but {found!r} is not "
                    f"one of the {count} given. Pass an index below {count} (0, the parameters, by default).")
        else:
            shown = ", ".join(f"`args[{n}]`" for n in found)
            text = (f"`first_nonfinite` takes the gradient with respect to {shown} (`argnums`), but the MoX traced "
                    "no floating array there (a Python number is static: baked in when traced), so there is no "
                    "gradient. Pass `argnums` naming the parameters, or trace with arrays (`jnp.asarray(1.0)`).")
        super().__init__(text)


class NotQueryable(YaxQueryError):
    """A function that queries (``tool``: `query`, `explain`, …) was given something other
    than a MoX or a `Document` from `load_xml` to run on; ``found`` is the type's name given
    (a node of a loaded document, say).

    Example::

        dense = yax.query('//module_call[@type="Dense"]', doc)
        yax.query("//*", dense[0])            # NotQueryable: an element, not the document
        yax.query("//*", doc)
    """

    def __init__(self, tool: str, value: object):
        self.tool, self.found = tool, _found(value)
        super().__init__(f"`{tool}` expected a MoX or a Document from `yax.load_xml`, but got a `{self.found}`.")
