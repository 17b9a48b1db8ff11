"""A MoX used as a replacement is its own computation.

`yax.sub(pattern, rep, mox)` with ``rep`` a root MoX of ``Block().apply`` or a
call node cut from another MoX puts in the equations ``rep`` holds, never a
re-trace of its module's type: here each replacement is traced while the
block computes something else than its code says (a helper monkeypatched, a
Hugging Face ``ACT2FN`` entry patched, which no field of the module records),
and the rewritten model must compute the edited block with the model's own
weights, as a hand-written model (or the model run under the same patch)
does. Its variables are placed like a module's: kept from the model's where
names and shapes match, new ones initialised by the module type's own
``init`` only where that makes exactly the leaves the MoX reads, refused
otherwise. A refused rewrite leaves the MoX and the parameters as they were.
"""

import contextlib
import dataclasses
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import thirdparty as tp

import yax
import yax.internal

pytestmark = pytest.mark.core
KEY = jax.random.key(0)
X = jax.random.normal(jax.random.key(1), (3, 4))


def act(h):
    """The blocks' activation, hard-coded in their code; the tests patch it while tracing a replacement."""
    return jax.nn.gelu(h)


def sigmoid(h):
    """`jax.nn.sigmoid` looked up when called, so yax marks it as an `activation` node."""
    return jax.nn.sigmoid(h)


@contextlib.contextmanager
def patched(fn):
    """``act`` is ``fn`` inside the block (a monkeypatch, as users patch a helper)."""
    module = sys.modules[__name__]
    old = module.act
    module.act = fn
    try:
        yield
    finally:
        module.act = old


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(4, name="out")(act(nn.Dense(8, name="hidden")(x)))


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = Block(name="block_0")(x)
        x = Block(name="block_1")(x)
        return nn.Dense(2, name="head")(x)


def by_hand(params, x, f):
    """`Model` with ``f`` as the blocks' activation, written out."""
    p = params["params"]
    for b in ("block_0", "block_1"):
        q = p[b]
        x = x + f(x @ q["hidden"]["kernel"] + q["hidden"]["bias"]) @ q["out"]["kernel"] + q["out"]["bias"]
    return x @ p["head"]["kernel"] + p["head"]["bias"]


def model():
    m = Model()
    params = m.init(KEY, X)
    return m, params, yax.make_mox(m.apply)(params, X)


def primitives(mox):
    return {n.name for n in mox.walk() if isinstance(n, yax.Equation)}


def snapshot(mox, params):
    return str(mox), jax.tree_util.tree_map(lambda a: np.asarray(a).copy(), params)


def unchanged(before, mox, params):
    text, leaves = before
    assert str(mox) == text
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, leaves, params))


def same_arrays(a, b):
    return all(x is y for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


def test_a_root_mox_of_apply_computes_what_it_was_traced_with():
    m, params, mox = model()
    with patched(sigmoid):
        rep = yax.make_mox(Block().apply)({"params": params["params"]["block_0"]}, X)
    assert "logistic" in primitives(rep)
    before, rep_text = snapshot(mox, params), str(rep)
    new, p2 = yax.sub('//module_call[@type="Block"]', rep, mox, params=params)
    assert "logistic" in primitives(new) and "tanh" not in primitives(new)  # gelu's tanh is gone
    np.testing.assert_allclose(yax.eval_mox(new, p2, X), by_hand(params, X, jax.nn.sigmoid), rtol=1e-6, atol=1e-6)
    assert same_arrays(p2, params)  # every variable kept: the model's own weights, names and shapes alike
    # without `params=`: nothing to add, nothing to drop
    new = yax.sub('//module_call[@type="Block"]', rep, mox)
    np.testing.assert_allclose(yax.eval_mox(new, params, X), by_hand(params, X, jax.nn.sigmoid), rtol=1e-6, atol=1e-6)
    unchanged(before, mox, params)
    assert str(rep) == rep_text
    np.testing.assert_allclose(yax.eval_mox(mox, params, X), by_hand(params, X, jax.nn.gelu), rtol=1e-6, atol=1e-6)


def test_a_cut_call_node_computes_what_it_computed_where_it_was_cut():
    m, params, mox = model()
    with patched(sigmoid):
        other = yax.make_mox(m.apply)(params, X)
    cut = yax.query('//module_call[@name="block_0"]', other)[0]
    before = snapshot(mox, params)
    # both blocks become the cut one's computation, each reading its own weights (those at its scope)
    new, p2 = yax.sub('//module_call[@type="Block"]', cut, mox, params=params)
    assert [n.path for n in yax.query('//activation', new)] == ["Model/block_0/sigmoid", "Model/block_1/sigmoid"]
    np.testing.assert_allclose(yax.eval_mox(new, p2, X), by_hand(params, X, jax.nn.sigmoid), rtol=1e-6, atol=1e-6)
    assert same_arrays(p2, params)
    unchanged(before, mox, params)
    # a node cut from the MoX being rewritten reads its variables there too
    own_block = yax.query('//module_call[@name="block_1"]', mox)[0]
    same = yax.sub('//module_call[@name="block_0"]', own_block, mox)
    np.testing.assert_allclose(yax.eval_mox(same, params, X), m.apply(params, X), rtol=1e-6, atol=1e-6)


def test_a_field_edit_is_kept_too():
    """An activation given as a module field was already honoured by rebuilding the module; it still is."""

    class Fielded(nn.Module):
        f: object = jax.nn.gelu

        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(self.f(nn.Dense(8)(x)))

    class Outer(nn.Module):
        @nn.compact
        def __call__(self, x):
            return Fielded(name="inner")(x)

    o = Outer()
    params = o.init(KEY, X)
    mox = yax.make_mox(o.apply)(params, X)
    rep = yax.make_mox(Fielded(f=jnp.sin).apply)({"params": params["params"]["inner"]}, X)
    new = yax.sub('//module_call[@type="Fielded"]', rep, mox)
    want = Fielded(f=jnp.sin).apply({"params": params["params"]["inner"]}, X)
    np.testing.assert_allclose(yax.eval_mox(new, params, X), want, rtol=1e-6, atol=1e-6)


class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.Dense(16, name="wi")(nn.LayerNorm(name="norm")(x))
        return x + nn.Dense(8, name="wo")(act(h)), None


class Stack(nn.Module):
    """Layers as large codebases stack them: ``nn.scan(nn.remat(layer))``, variables stacked per layer."""

    @nn.compact
    def __call__(self, x):
        layers = nn.scan(nn.remat(Layer), variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        x, _ = layers(name="layers")(x, None)
        return nn.Dense(2, name="head")(x)


def test_a_call_cut_from_a_scanned_stack_reads_each_layers_weights():
    m, x = Stack(), jax.random.normal(jax.random.key(2), (2, 8))
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    with patched(sigmoid):
        other = yax.make_mox(m.apply)(params, x)
        want = m.apply(params, x)
    cut = yax.query('//module_call[@type="Layer"]', other)[0]
    before = snapshot(mox, params)
    new, p2 = yax.sub('//module_call[@type="Layer"]', cut, mox, params=params)
    assert "logistic" in primitives(new)
    np.testing.assert_allclose(yax.eval_mox(new, p2, x), want, rtol=1e-5, atol=1e-6)
    assert same_arrays(p2, params)
    assert np.abs(m.apply(params, x) - want).max() > 0.1  # the edit matters
    unchanged(before, mox, params)


class Cell(nn.Module):
    """A recurrent cell whose activation is hard-coded (through the helper)."""

    @nn.compact
    def __call__(self, h, x):
        h = act(nn.Dense(4, name="ih")(x) + nn.Dense(4, name="hh")(h))
        return h, h


class Recurrent(nn.Module):
    """The cell scanned over time, its variables broadcast to every step (`variable_broadcast`)."""

    @nn.compact
    def __call__(self, xs):
        cell = nn.scan(Cell, variable_broadcast="params", split_rngs={"params": False}, in_axes=0, out_axes=0)
        return cell(name="cell")(jnp.zeros((xs.shape[1], 4)), xs)[1]


def test_a_recurrent_cell_cut_from_a_patched_model():
    m, xs = Recurrent(), jax.random.normal(jax.random.key(3), (5, 2, 3))
    params = m.init(KEY, xs)
    mox = yax.make_mox(m.apply)(params, xs)
    with patched(sigmoid):
        other = yax.make_mox(m.apply)(params, xs)
        want = m.apply(params, xs)
        want_grad = jax.grad(lambda p: jnp.sum(m.apply(p, xs) ** 2))(params)
    cut = yax.query('//module_call[@type="Cell"]', other)[0]
    before = snapshot(mox, params)
    new, p2 = yax.sub('//module_call[@type="Cell"]', cut, mox, params=params)
    np.testing.assert_allclose(yax.eval_mox(new, p2, xs), want, rtol=1e-6, atol=1e-6)
    assert same_arrays(p2, params)
    got_grad = jax.grad(lambda p: jnp.sum(yax.eval_mox(new, p, xs) ** 2))(params)
    for u, v in zip(jax.tree_util.tree_leaves(got_grad), jax.tree_util.tree_leaves(want_grad), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
    # new variables have no place in a scan that broadcasts them: said, not garbled
    with pytest.raises(yax.errors.BroadcastNewVariables) as e:
        yax.sub('//module_call[@name="ih"]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    assert e.value.new == ["params/lora_a", "params/lora_b"] and e.value.node.name == "ih"
    unchanged(before, mox, params)


# -- code nobody here wrote: Hugging Face layers whose activation comes from a table (`ACT2FN`) ---------------

@pytest.mark.parametrize("name, pattern", [
    ("vit-module", '//module_call[@type="FlaxViTLayer"]'),
    ("bert-module", '//module_call[@type="FlaxBertLayer" or @type="FlaxBertPredictionHeadTransform"]'),
    ("resnet-wrapper", '//module_call[@type="FlaxResNetBasicLayer" or @type="FlaxResNetEmbeddings"]'),
])
@pytest.mark.slow
def test_third_party_layers_cut_from_a_patched_model(name, pattern):
    """Every layer reading the patched activation is replaced by its counterpart cut from the model
    traced under the patch (a decider picks it by path): the result is the patched model, with the
    model's own weights (ResNet's `batch_stats` too, in the bare `params=` layout of the wrapper)."""
    c = tp.case(name)
    mox = yax.make_mox(c.fn)(*c.args, **c.kwargs)
    other = yax.make_mox(c.swapped)(*c.args, **c.kwargs)
    cuts = {n.path: n for n in yax.query(pattern, other)}
    assert len(cuts) >= 2
    new, p2 = yax.sub(pattern, lambda path, node: cuts[path], mox, params=c.args[0])
    want = logits(c.swapped(*c.args, **c.kwargs))
    np.testing.assert_allclose(logits(yax.eval_mox(new, p2, *c.args[1:], **c.kwargs)), want, rtol=1e-5, atol=1e-7)
    assert np.abs(logits(c.fn(*c.args, **c.kwargs)) - want).max() > 1e-4  # the edit matters (tiny random weights)
    assert same_arrays(p2, c.args[0])


def logits(out):
    return np.asarray(jax.tree_util.tree_leaves(out)[0])


def test_a_root_mox_of_a_third_party_layers_apply():
    """`yax.make_mox(FlaxViTLayer(config).apply)(layer_variables, h)` traced with the activation
    patched, put in for both layers of the model."""
    from transformers.models.vit import modeling_flax_vit

    c = tp.case("vit-module")
    mox = yax.make_mox(c.fn)(*c.args, **c.kwargs)
    node = yax.query('//module_call[@type="FlaxViTLayer"]', mox)[0]
    h = jnp.zeros(node.inputs[0].shape, node.inputs[0].dtype)
    layer = modeling_flax_vit.FlaxViTLayer(tp._hf("vit").config, dtype=jnp.float32)
    with tp._act2fn("vit"):
        rep = yax.make_mox(layer.apply)({"params": c.args[0]["params"]["vit"]["encoder"]["layer"]["0"]}, h,
                                        deterministic=True)
    new, p2 = yax.sub('//module_call[@type="FlaxViTLayer"]', rep, mox, params=c.args[0])
    np.testing.assert_allclose(logits(yax.eval_mox(new, p2, *c.args[1:], **c.kwargs)),
                               logits(c.swapped(*c.args, **c.kwargs)), rtol=1e-5, atol=1e-7)
    assert same_arrays(p2, c.args[0])


# -- nnx ------------------------------------------------------------------------------------------------------

def nnx_model():
    from flax import nnx

    class NBlock(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(4, 8, rngs=rngs)
            self.out = nnx.Linear(8, 4, rngs=rngs)

        def __call__(self, x):
            return x + self.out(act(self.hidden(x)))

    class NModel(nnx.Module):
        def __init__(self, rngs):
            self.block = NBlock(rngs)
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.head(self.block(x))

    return NModel(nnx.Rngs(0))


def nnx_by_hand(state, x, f):
    from flax import nnx

    s = nnx.to_pure_dict(state)
    b, h = s["block"], s["head"]
    x = x + f(x @ b["hidden"]["kernel"] + b["hidden"]["bias"]) @ b["out"]["kernel"] + b["out"]["bias"]
    return x @ h["kernel"] + h["bias"]


def test_nnx_a_root_mox_and_a_cut_node_read_the_blocks_own_variables():
    from flax import nnx

    m = nnx_model()
    _, state = nnx.split(m)
    mox = yax.make_mox(m)(X)
    with patched(sigmoid):
        rep = yax.make_mox(m.block)(X)
        cut = yax.query('//module_call[@path="NModel/block"]', yax.make_mox(m)(X))[0]
    want = nnx_by_hand(state, X, jax.nn.sigmoid)
    before = snapshot(mox, state)
    for r in (rep, cut):
        new, s2 = yax.sub('//module_call[@path="NModel/block"]', r, mox, params=state)
        assert "logistic" in primitives(new)
        np.testing.assert_allclose(yax.eval_mox(new, s2, X)[0], want, rtol=1e-6, atol=1e-6)
        assert same_arrays(s2, state)
        # no nnx model computes the MoX's edit, so none is claimed: as after a function replacement
        assert new.graphdef is None
    unchanged(before, mox, state)


@pytest.mark.parametrize("remat", [False, True])
def test_nnx_a_call_cut_from_a_scanned_stack(remat):
    """`nnx.scan` over layers stacked by `nnx.vmap` (each step under `nnx.remat` too): the block is
    traced with its activation set to relu, then set back; each layer reads its own slice."""
    from flax import nnx
    from nnx_models import IDS, ScanTransformer

    m = ScanTransformer(remat=remat, rngs=nnx.Rngs(0))
    _, state = nnx.split(m)
    mox = yax.make_mox(m)(IDS)
    m.blocks.act = nnx.relu
    try:
        other = yax.make_mox(m)(IDS)
        want = m(IDS)
    finally:
        m.blocks.act = nnx.gelu
    new, s2 = yax.sub('//module_call[@type="Block"]', yax.query('//module_call[@type="Block"]', other)[0], mox,
                      params=state)
    np.testing.assert_allclose(yax.eval_mox(new, s2, IDS)[0], want, rtol=1e-5, atol=1e-6)
    assert np.abs(m(IDS) - want).max() > 0.1
    assert same_arrays(s2, state)


# -- new variables -----------------------------------------------------------------------------------------

RANK = 2


class Adapter(nn.Module):
    """The earlier prototype's LoRA layout: the adapted layer as a submodule `Dense_0`."""

    features: int

    @nn.compact
    def __call__(self, x):
        a = self.param("a", nn.initializers.normal(0.1), (x.shape[-1], RANK))
        b = self.param("b", nn.initializers.zeros, (RANK, self.features))
        return nn.Dense(self.features)(act(x)) + x @ a @ b


def test_new_variables_take_the_module_types_own_init_or_are_refused():
    global RANK
    m, params, mox = model()
    pattern = '//module_call[@name="hidden"]'
    with patched(jnp.tanh):
        rep = yax.make_mox(Adapter(8).apply)(Adapter(8).init(KEY, X), X)
    new, p2 = yax.sub(pattern, rep, mox, params=params, key=KEY)
    adapted = p2["params"]["block_0"]["hidden"]
    assert adapted["Dense_0"]["kernel"] is params["params"]["block_0"]["hidden"]["kernel"]  # kept
    np.testing.assert_array_equal(adapted["b"], 0)  # Adapter's own init: `b` starts at zero
    assert adapted["a"].shape == (4, 2) and np.abs(adapted["a"]).max() > 0
    assert "tanh" in primitives(yax.query(pattern, new)[0])  # still the traced computation

    def hidden_by_hand(q):
        return lambda h: jnp.tanh(h) @ q["Dense_0"]["kernel"] + q["Dense_0"]["bias"] + h @ q["a"] @ q["b"]

    x = X
    for b in ("block_0", "block_1"):
        q = p2["params"][b]
        x = x + jax.nn.gelu(hidden_by_hand(q["hidden"])(x)) @ q["out"]["kernel"] + q["out"]["bias"]
    want = x @ params["params"]["head"]["kernel"] + params["params"]["head"]["bias"]
    np.testing.assert_allclose(yax.eval_mox(new, p2, X), want, rtol=1e-5, atol=1e-6)

    # traced while the adapter's rank was 3: its own init (rank 2 now) cannot give `a` and `b` values
    RANK = 3
    try:
        rep3 = yax.make_mox(Adapter(8).apply)(Adapter(8).init(KEY, X), X)
    finally:
        RANK = 2
    before = snapshot(mox, params)
    with pytest.raises(yax.errors.MoxNoValues) as e:
        yax.sub(pattern, rep3, mox, params=params, key=KEY)
    assert "`params/a` f32[4,2] where the MoX reads f32[4,3]" in str(e.value)
    assert "at `Model/block_0/hidden`" in str(e.value) and "keep=" in str(e.value)
    unchanged(before, mox, params)


# -- refusals: what cannot be given, said ----------------------------------------------------------------

def test_what_a_mox_replacement_cannot_be_is_refused_and_nothing_changes():
    m, params, mox = model()
    before = snapshot(mox, params)
    target = '//module_call[@name="block_0"]'
    block = {"params": params["params"]["block_0"]}

    # traced on other input shapes: its equations compute those shapes
    with pytest.raises(yax.errors.TracedOnOtherInputs) as e:
        yax.sub(target, yax.make_mox(Block().apply)(block, jnp.ones((5, 4))), mox)
    assert (e.value.index, e.value.found) == (0, "f32[5,4]")

    # a bound module holds its variables as constants: they are not the model's
    with pytest.raises(yax.errors.MoxReadsUnnamed) as e:
        yax.sub(target, yax.make_mox(Block().bind(block))(X), mox)
    assert "`module.bind(variables)`" in e.value.what

    # a call whose updated statistics leave it besides its result
    class Normed(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            return x + nn.BatchNorm(use_running_average=not train)(x)

    v = Normed().init(KEY, X)
    train = yax.make_mox(Normed().apply)(v, X, train=True, mutable=["batch_stats"])
    with pytest.raises(yax.errors.MoxSideResults):
        yax.sub(target, train, mox, params=params)

    # a call node that belongs to no MoX yax knows: nothing says which inputs are its variables
    stray = dataclasses.replace(yax.query(target, mox)[0], name="stray")
    with pytest.raises(yax.errors.MoxCutFromUnknown) as e:
        yax.sub(target, stray, mox)
    assert e.value.call is stray
    unchanged(before, mox, params)


def test_nnx_a_mox_cannot_add_variables_to_the_state():
    from flax import nnx

    m = nnx_model()
    _, state = nnx.split(m)
    mox = yax.make_mox(m)(X)

    class Wider(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(4, 8, rngs=rngs)
            self.out = nnx.Linear(8, 4, rngs=rngs)
            self.gate = nnx.Param(jnp.ones((4,)))

        def __call__(self, x):
            return x + self.out(act(self.hidden(x))) * self.gate

    before = snapshot(mox, state)
    with pytest.raises(yax.errors.MoxNoPlace) as e:
        yax.sub('//module_call[@path="NModel/block"]', yax.make_mox(Wider(nnx.Rngs(1)))(X), mox, params=state)
    assert e.value.leaf == "gate" and e.value.node.path == "NModel/block"
    assert yax.internal.misfit(yax.make_mox(Wider(nnx.Rngs(1)))(X), yax.query('//module_call[@path="NModel/block"]',
                                                                                mox)[0], mox) is not None
    unchanged(before, mox, state)
