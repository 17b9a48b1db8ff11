"""The frontend registry, and the recipe of docs/architecture.md ("how to add
a frontend") followed for a toy module system that knows nothing of Flax:
registering it is all it takes for tracing, queries, evaluation, printing
and rewrites to work on its models."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
import yax.frontends as frontends
from yax.errors import CannotAdapt
from yax.frontends import Variables
from yax.internal import (
    ADAPTERS,
    Adapters,
    CallInfo,
    Frontend,
    Kind,
    ModuleInfo,
    marked_call,
    recorder,
    register,
    register_adapters,
)

pytestmark = pytest.mark.core


class Layer:
    """A toy module: a name and a weight matrix, called on an array."""

    def __init__(self, name, w):
        self.name, self.w = name, w

    def __call__(self, x):
        return jnp.tanh(x @ self.w)


class Chain:
    def __init__(self, name, *layers):
        self.name, self.layers = name, layers

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _marking(cls):
    original = cls.__call__

    def call(self, *args):
        rec = recorder()
        if rec is None:
            return original(self, *args)
        parent = rec.parent_path()
        path = f"{parent}/{self.name}" if parent else self.name
        attrs = {"width": int(self.w.shape[1])} if hasattr(self, "w") else {}
        info = CallInfo(kind=Kind.MODULE_CALL, path=path, name=self.name, module=self,
                        info=ModuleInfo(type=cls, method="__call__", attrs=attrs, frontend="toy"))
        return marked_call(info, lambda *a: original(self, *a), args, {})

    return original, call


class ToyFrontend(Frontend):
    """Step 1-3 of the recipe: a name and an order, what it accepts, its hooks."""

    name = "toy"
    order = 30

    def accepts(self, fn):
        return isinstance(fn, Chain)

    @contextlib.contextmanager
    def _patched(self, rec):
        undo = []
        try:
            for cls in (Layer, Chain):
                original, call = _marking(cls)
                undo.append((cls, original))
                cls.__call__ = call
            yield
        finally:
            for cls, original in undo:
                cls.__call__ = original

    def hooks(self, rec):
        return self._patched(rec)

    def owns(self, x):  # its modules can replace others (a LoRA adapter, below): their weights are constants
        return isinstance(x, (Layer, Chain))

    def trace_replacement(self, module, avals, call, mapped=None):
        def called(*xs):
            a, k = call(xs)
            return module(*a, **k)

        return yax.make_mox(called)(*avals), (), 0

    def variables(self, mox, params):
        return _Constants() if mox.frontend == self.name else None


class _Constants(Variables):
    """The toy system's variables: none (its weights are constants of the traced program)."""

    def place(self, sites, key, keep=None):
        return {id(s.node): {} for s in sites}

    def finish(self, new, sites):
        return new


@pytest.fixture
def toy():
    f = ToyFrontend()
    register(f)
    try:
        yield f
    finally:
        frontends.registry().remove(f)


def _model():
    k1, k2 = jax.random.split(jax.random.key(0))
    return Chain("net", Layer("l1", jax.random.normal(k1, (4, 8))), Layer("l2", jax.random.normal(k2, (8, 2))))


def test_the_builtin_frontends_are_found_in_order():
    names = [f.name for f in frontends.registry()]
    assert names[:2] == ["nnx", "linen"] and names[-1] == "jax"
    assert frontends.for_target(lambda x: x).name == "jax"


def test_a_registered_frontend_traces_queries_evaluates_and_rewrites(toy):
    model, x = _model(), jnp.ones((3, 4))
    before = Layer.__call__
    mox = yax.make_mox(model)(x)
    assert Layer.__call__ is before and recorder() is None  # the hooks were undone
    assert mox.frontend == "toy"
    layers = yax.query('//module_call[@type="Layer"]', mox)
    assert [n.path for n in layers] == ["net/l1", "net/l2"] and [n.attrs["width"] for n in layers] == [8, 2]
    assert yax.query('//module_call[@width=2]', mox) == [layers[1]]
    np.testing.assert_allclose(yax.eval_mox(mox, x), model(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(yax.to_function(mox))(x), model(x), rtol=1e-6)
    assert "module_call[path=net/l2 type=Layer width=2]" in str(mox)
    new = yax.sub('//module_call[@name="l2"]', lambda h: jnp.sin(h[:, :2]), mox)
    l1 = model.layers[0](x)
    np.testing.assert_allclose(yax.eval_mox(new, x), jnp.sin(l1[:, :2]), rtol=1e-6)


def test_without_the_frontend_the_same_model_is_a_plain_function():
    model, x = _model(), jnp.ones((3, 4))
    mox = yax.make_mox(model)(x)
    assert mox.frontend == "jax" and list(mox.modules()) == []
    np.testing.assert_allclose(yax.eval_mox(mox, x), model(x), rtol=1e-6)


def test_a_module_system_adds_lora_by_registering_its_adapters(toy):
    """LoRA is a table a module system registers into (`yax.internal.register_adapters`), in its
    own code: no member of `Frontend` and no shared code changes."""
    model, x = _model(), jnp.ones((3, 4))
    mox = yax.make_mox(model)(x)
    with pytest.raises(CannotAdapt) as e:  # before: the toy system adapts no layer, and says so
        yax.sub('//module_call[@name="l1"]', yax.LoRA(rank=2), mox)
    assert "`toy`" in str(e.value)
    b = jnp.full((2, 8), 0.5)

    def make(node, spec):  # an adapter with a nonzero B, so that the test sees it is used
        w = next(layer.w for layer in model.layers if layer.name == node.name)
        a = jnp.ones((w.shape[0], spec.rank)) * 0.1
        return Layer(node.name, w + a @ b[:spec.rank, :w.shape[1]] * spec.alpha / spec.rank)

    register_adapters("toy", Adapters(kinds=("Layer",), make=make, merge=lambda mox, params: None))
    try:
        new = yax.sub('//module_call[@name="l1"]', yax.LoRA(rank=2, alpha=4.0), mox)
    finally:
        del ADAPTERS["toy"]
    w1 = model.layers[0].w
    want = model.layers[1](jnp.tanh(x @ (w1 + jnp.ones((4, 2)) * 0.1 @ b[:2] * 2.0)))
    np.testing.assert_allclose(yax.eval_mox(new, x), want, rtol=1e-6)
