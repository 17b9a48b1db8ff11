"""MoX trees nested to any depth, built node by node (tracing is limited by Flax's and
JAX's own recursion; every function after tracing must take any depth)."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

import yax
from yax import Equation, Literal, Mox, Var
from yax.internal import Kind, ModuleInfo


class Layer(nn.Module):
    """The module type the nested calls claim (never called)."""

    features: int = 3


def nested_calls(depth: int, shape=(2, 3)) -> Mox:
    """A root whose module calls nest ``depth`` deep: each level calls the next and
    adds 1 to its result, the innermost computes ``sin``; so ``eval_mox(mox, x)``
    is ``sin(x) + depth``."""
    x = jnp.ones(shape, jnp.float32)
    root = yax.make_mox(lambda x: jnp.sin(x) + 1.0)(x)
    sin, add = root.children
    f32 = jnp.float32
    one = Literal(1.0, (), f32, weak_type=True)
    info = ModuleInfo(type=Layer, method="__call__", attrs={"features": 3}, defaults={"features": 3},
                      frontend="linen")
    # innermost first: level k reads its caller's `a` into its own `p`
    p, q = Var(shape, f32), Var(shape, f32)
    # equations run at the path of the call they are in (`yax.check_mox`)
    node_children: tuple = (Equation(sin.primitive, dict(sin.params), (p,), (q,), path="M" + "/m" * depth),)
    inner_in, inner_out = p, q
    for k in range(depth, 0, -1):
        path = "M" + "/m" * k
        a, b = Var(shape, f32), Var(shape, f32)  # the caller's vars passed in and bound to the result
        node = Mox(Kind.MODULE_CALL, children=node_children, inputs=(a,), outputs=(b,), invars=(inner_in,),
                   outvars=(inner_out,), path=path, name="m", info=info)
        r = Var(shape, f32)
        caller = path.rsplit("/", 1)[0] if k > 1 else ""  # the outermost call's caller is the root
        node_children = (node, Equation(add.primitive, dict(add.params), (b, one), (r,), path=caller))
        inner_in, inner_out = a, r
    return dataclasses.replace(root, children=node_children, inputs=(inner_in,), invars=(inner_in,),
                               outvars=(inner_out,), outputs=(inner_out,))


def nested_jits(depth: int, shape=(2, 3)) -> Mox:
    """A root whose equations nest ``depth`` deep: a `jit` holding a computation holding
    a `jit` …, the innermost computing ``sin`` (for printers and serialisers)."""
    x = jnp.ones(shape, jnp.float32)
    root = yax.make_mox(jax.jit(jnp.sin))(x)
    (jit,) = root.children
    sub = jit.params["jaxpr"]
    body = sub
    for _ in range(depth - 1):
        a, b = Var(shape, jnp.float32), Var(shape, jnp.float32)
        eqn = dataclasses.replace(jit, params={**jit.params, "jaxpr": body}, inputs=(a,), outputs=(b,), _jaxprs={})
        body = dataclasses.replace(sub, children=(eqn,), invars=(a,), outvars=(b,))
    return dataclasses.replace(root, children=(dataclasses.replace(jit, params={**jit.params, "jaxpr": body},
                                                                  _jaxprs={}),))
