"""The public functions: `capture` and `patch`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._eval import flatten_inputs, unflatten_outputs
from .._ir import Mox
from ..errors import LossNotAFunction, PatchDoesNotFit, WrongType, YaxCaptureError
from .hooks import fitted
from .programs import cached_plan, check_root, grads_of, program_for, values_of


def capture(pattern: Any, mox: Mox, *args: Any, with_inputs: bool = False, grad_of: Callable[[Any], Any] | None = None,
            **kwargs: Any) -> tuple[Any, ...]:
    """Run ``mox`` and bring out the values at the nodes ``pattern`` selects
    (and, with ``grad_of``, the gradient of a loss at each of them).

    Nothing is changed: ``out`` is what `eval_mox` returns. The program is
    jitted once per MoX and pattern (and kept while the MoX lives); `capture`
    is pure, so it also works under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

    Args:
      pattern: an XPath (``'//module_call[@type="Block"]'``, ``'//activation'``,
        ``'//dot_general'``), a node, or a list of nodes of ``mox``.
      mox: the root MoX.
      *args, **kwargs: the arguments, as for ``eval_mox(mox, *args, **kwargs)``.
      with_inputs: also give each node's inputs.
      grad_of: a function of the model's output (what `eval_mox` returns)
        returning a real scalar, the loss. Its gradient at every matched node
        comes out too, computed in the same program as the values (one
        forward and one backward pass, compiled once per function: pass the
        same function each time, not a new ``lambda``).

    Returns:
      ``(out, values)``. ``values`` maps each matched node's key to its output,
      in evaluation order: the key is the call's path (``GPT/Block_3``;
      ``path.method`` for a method other than ``__call__``), an equation's
      ``path:primitive``; a module called several times gives ``path``,
      ``path#2``, ``path#3``… in call order. A call's value is what the call
      returned (its pytree), an equation's its output (a tuple when it has
      several). Nodes inside a ``scan`` body (``nn.scan``, ``nnx.scan``) give
      their values of every step, stacked along a leading axis (one per
      enclosing scan). With ``with_inputs``, each value is ``(inputs, output)``,
      ``inputs`` being the tuple of arrays the node received (a call's traced
      arguments in order, an equation's operands).

      With ``grad_of``: ``(out, values, grads)``. ``grads`` has the keys and
      structure of ``values`` (without inputs): at each node, the cotangent of
      ``grad_of(out)`` with respect to the node's output, i.e. the gradient with
      respect to a zero added to that output; stacked per step inside scans,
      float0 zeros for integer outputs (as ``jax.grad(allow_int=True)``).

    Raises:
      YaxCaptureError: the pattern matches nothing (with `yax.explain`'s
        account), or a matched node runs inside a ``while`` loop, a ``cond``
        branch or a custom derivative rule, whose values cannot come out; or
        ``grad_of`` does not return a real scalar.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((3, 5))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> out, values = yax.capture('//module_call[@type="Dense"] | //activation', mox, p, x)
      >>> {k: v.shape for k, v in values.items()}
      {'Sequential/layers_0': (3, 4), 'Sequential/relu': (3, 4), 'Sequential/layers_2': (3, 2)}
      >>> float((values['Sequential/relu'] == 0).mean()) <= 1.0   # the fraction of dead units
      True
      >>> def loss(out): return jnp.mean(out ** 2)
      >>> out, values, grads = yax.capture('//activation', mox, p, x, grad_of=loss)
      >>> grads['Sequential/relu'].shape                       # d loss / d relu output
      (3, 4)
      >>> w = p["params"]["layers_2"]["kernel"]                 # by hand: d/dh mean((h @ w + b) ** 2)
      >>> bool(jnp.allclose(grads['Sequential/relu'], (2 * out / out.size) @ w.T))
      True
    """
    check_root(mox, "capture")
    if grad_of is not None and not callable(grad_of):
        raise LossNotAFunction("capture", grad_of)
    plan = cached_plan(pattern, mox, "capture")
    mode = "capture" if grad_of is None else "grad"
    prog = program_for(mox, pattern, plan, mode, bool(with_inputs), repl=grad_of)
    res = prog(flatten_inputs(mox, args, kwargs), {}, None)
    out, values = unflatten_outputs(mox, res[0]), values_of(plan, res[1], bool(with_inputs))
    return (out, values) if grad_of is None else (out, values, grads_of(plan, res[2]))


def patch(pattern: Any, mox: Mox, repl: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A function running ``mox`` with the outputs of the nodes ``pattern``
    selects replaced: activation patching, ablation, steering.

    The replacement values are an argument of the returned function, so a
    sweep over them (layers, positions, scales) compiles once. ``jax.vmap``
    over that argument runs the whole sweep as one call (one trace, one
    compile), and ``jax.grad`` goes through it; notebooks/inside.ipynb builds a
    layer × position heatmap this way.

    Args:
      pattern: an XPath, a node, or a list of nodes of ``mox`` (as for `capture`).
      mox: the root MoX.
      repl: ``None`` to replace outputs by given values; or a function
        ``repl(path, value)`` or ``repl(path, value, arg)`` returning the new
        output of each matched node (same structure, shapes and dtypes) from
        its key, its value and the ``arg`` given to the returned function. A
        node inside a scan body sees one step's value; a ``repl`` with a
        parameter named ``step`` also gets the step indices (a tuple of int32
        scalars, outermost scan first, ``()`` outside scans).

    Returns:
      ``patched(values, *args, **kwargs) -> out``. Without ``repl``, ``values``
      maps keys (as `capture` gives them) to new outputs: every key or some of
      them (each set of keys compiles once), stacked along the scan axes for
      nodes inside scans (as `capture` gives them); they are checked against
      the nodes' shapes and dtypes before anything runs. With ``repl``,
      ``values`` is any pytree, passed on as ``arg``.

    Raises:
      YaxCaptureError: as `capture`; and when a value does not fit its node
        (which key, expected and found) or names a key the pattern did not match.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((3, 5))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> ablate = yax.patch('//activation[@name="relu"]', mox)   # replace by given values
      >>> out = ablate({"Sequential/relu": jnp.zeros((3, 4))}, p, x)
      >>> bool(jnp.allclose(out, p["params"]["layers_2"]["bias"]))
      True
      >>> steer = yax.patch('//*[@path="Sequential/layers_0"]', mox, lambda path, h, v: h + v)
      >>> steer(jnp.zeros(4), p, x).shape                       # the vector is an argument
      (3, 2)
      >>> jax.vmap(lambda v: steer(v, p, x))(jnp.zeros((5, 4))).shape   # five vectors, one call
      (5, 3, 2)
    """
    check_root(mox, "patch")
    if repl is not None and not callable(repl):
        raise YaxCaptureError(
            f"`repl` must be `None` (values given to the returned function) or a function `repl(path, value)`, "
            f"but got a `{type(repl).__name__}`. To patch with arrays, pass them to the returned function."
        )
    plan = cached_plan(pattern, mox, "patch")
    prog = program_for(mox, pattern, plan, "arrays" if repl is None else "fn", repl=repl)
    by_key = {t.key: t for t in plan.targets.values()}

    def patched(values: Any, *args: Any, **kwargs: Any) -> Any:
        flat = flatten_inputs(mox, args, kwargs)
        if repl is not None:
            outs, _ = prog(flat, {}, values)
            return unflatten_outputs(mox, outs)
        if not isinstance(values, Mapping):
            raise WrongType("values", "a dict of new outputs by key (such as `yax.capture` returns)", values,
                            f"Pass `{{{next(iter(by_key))!r}: value}}`, or give `yax.patch` a function `repl(path, value)`.")
        unknown = [k for k in values if k not in by_key]
        if unknown:
            known = ", ".join(f"`{k}`" for k in list(by_key)[:8]) + (" …" if len(by_key) > 8 else "")
            raise PatchDoesNotFit(unknown[0], "key", known, unknown[0])
        patches = {k: fitted(by_key[k], v, "The patch gives", stacked=True) for k, v in values.items()}
        outs, _ = prog(flat, patches, None)
        return unflatten_outputs(mox, outs)

    patched.__name__ = patched.__qualname__ = f"patched_{mox.name or 'mox'}"
    return patched
