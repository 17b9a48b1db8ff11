"""Functional nnx code that merges a model and calls its parts from outside it
(``m.left(x) + m.right(x)``): each part is named by its attribute path in the model, as
``make_mox(model)`` names it, not by its class (two ``Tower``s both came out ``Tower``, and only a
positional query told them apart)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax

pytestmark = pytest.mark.core

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


class Tower(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.lin(x))


class TwoTower(nnx.Module):
    def __init__(self, rngs):
        self.left = Tower(rngs)
        self.right = Tower(rngs)
        self.blocks = nnx.List([Tower(rngs), Tower(rngs)])


MODEL = TwoTower(nnx.Rngs(0))
GRAPHDEF, STATE = nnx.split(MODEL)


def merged(state, x):  # the functional style: merge, then call the parts
    m = nnx.merge(GRAPHDEF, state)
    return m.left(x) + m.right(x) + m.blocks[1](x)


def passed(model, x):  # the model passed in, its parts called
    return model.left(x) + model.right(x) + model.blocks[1](x)


WANT = ["TwoTower/left", "TwoTower/left/lin", "TwoTower/right", "TwoTower/right/lin",
        "TwoTower/blocks/1", "TwoTower/blocks/1/lin"]


@pytest.mark.parametrize("fn,arg", [(merged, STATE), (passed, MODEL)], ids=["merged", "passed"])
def test_parts_called_from_outside_are_named_by_their_attribute_path(fn, arg):
    mox = yax.make_mox(fn)(arg, X)
    assert [n.path for n in yax.query("//module_call", mox)] == WANT, str(mox)
    assert len(yax.query('//module_call[@path="TwoTower/right"]', mox)) == 1
    np.testing.assert_allclose(yax.eval_mox(mox, arg, X), fn(arg, X), rtol=1e-6)

    # a rewrite by path changes that part only
    new = yax.sub('//module_call[@path="TwoTower/right"]//activation', jnp.tanh, mox)
    m = MODEL
    want = m.left(X) + jnp.tanh(m.right.lin(X)) + m.blocks[1](X)
    np.testing.assert_allclose(yax.eval_mox(new, arg, X), want, rtol=1e-6)


def test_a_part_shared_by_two_holders_keeps_its_class_name():
    """Held by two objects, a part has no one path: it is named by its class, as before."""
    shared = Tower(nnx.Rngs(1))

    class Pair(nnx.Module):
        def __init__(self):
            self.a = shared
            self.b = shared

    first, second = Pair(), Pair()  # the tower is in both
    mox = yax.make_mox(lambda x: first.a(x))(X)
    assert [n.path for n in yax.query("//module_call", mox)] == ["Tower", "Tower/lin"]
    np.testing.assert_allclose(yax.eval_mox(mox, X), shared(X), rtol=1e-6)
    del second
