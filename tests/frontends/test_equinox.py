"""The Equinox frontend (yax/frontends/equinox.py): Equinox models traced,
queried, evaluated, differentiated, rewritten (LoRA returned as an Equinox
model), captured and compared, checked against calling the models
themselves: an `eqx.nn.MLP`, a small Transformer of `eqx.nn.MultiheadAttention`
and `eqx.nn.LayerNorm`, and a model whose layers are stacked with
`eqx.filter_vmap` and run with `jax.lax.scan` over `eqx.partition`ed arrays."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax

pytestmark = pytest.mark.core

KEY = jax.random.key(0)


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, dim: int, heads: int, key):
        k1, k2 = jax.random.split(key)
        self.norm1, self.norm2 = eqx.nn.LayerNorm(dim), eqx.nn.LayerNorm(dim)
        self.attn = eqx.nn.MultiheadAttention(heads, dim, key=k1)
        self.mlp = eqx.nn.MLP(dim, dim, 2 * dim, 1, activation=jax.nn.gelu, key=k2)

    def __call__(self, x):  # x: [seq, dim]
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class Transformer(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list
    head: eqx.nn.Linear

    def __init__(self, vocab: int = 11, dim: int = 8, heads: int = 2, depth: int = 2, key=KEY):
        keys = jax.random.split(key, depth + 2)
        self.embed = eqx.nn.Embedding(vocab, dim, key=keys[0])
        self.blocks = [Block(dim, heads, k) for k in keys[1:-1]]
        self.head = eqx.nn.Linear(dim, vocab, key=keys[-1])

    def __call__(self, ids):
        x = jax.vmap(self.embed)(ids)
        for b in self.blocks:
            x = b(x)
        return jax.vmap(self.head)(x)


class Layer(eqx.Module):
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, dim: int, key):
        k1, k2 = jax.random.split(key)
        self.up, self.down = eqx.nn.Linear(dim, 2 * dim, key=k1), eqx.nn.Linear(2 * dim, dim, key=k2)

    def __call__(self, x):
        return x + self.down(jax.nn.relu(self.up(x)))


class Scanned(eqx.Module):
    """Layers stacked the way Equinox users scan them: `eqx.filter_vmap` of the
    constructor, then `jax.lax.scan` over the `eqx.partition`ed arrays."""

    layers: Layer
    out: eqx.nn.Linear

    def __init__(self, dim: int = 6, depth: int = 3, key=KEY):
        k1, k2 = jax.random.split(key)
        self.layers = eqx.filter_vmap(lambda k: Layer(dim, k))(jax.random.split(k1, depth))
        self.out = eqx.nn.Linear(dim, 2, key=k2)

    def __call__(self, x):
        params, static = eqx.partition(self.layers, eqx.is_array)

        def step(h, p):
            return eqx.combine(p, static)(h), None

        h, _ = jax.lax.scan(step, x, params)
        return self.out(h)


def mlp():
    return eqx.nn.MLP(4, 3, 16, 2, key=KEY), jnp.linspace(-1, 1, 4)


def transformer():
    return Transformer(), jnp.array([1, 5, 2, 9, 3])


def scanned():
    return Scanned(), jnp.linspace(-1, 1, 6)


MODELS = {"mlp": mlp, "transformer": transformer, "scanned": scanned}


def close(a, b, tol=1e-5):
    return jax.tree_util.tree_all(jax.tree_util.tree_map(lambda x, y: np.allclose(x, y, rtol=tol, atol=tol), a, b))


def loss(out):
    return (out.astype(jnp.float32) ** 2).sum()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_eval_jit_and_grad_equal_calling_the_model(name):
    model, x = MODELS[name]()
    mox = yax.make_mox(model)(x)
    assert mox.frontend == "equinox"
    np.testing.assert_allclose(yax.eval_mox(mox, model, x), model(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(eqx.filter_jit(yax.to_function(mox))(model, x), model(x), rtol=1e-5, atol=1e-6)
    mine = eqx.filter_grad(lambda m: loss(yax.eval_mox(mox, m, x)))(model)
    theirs = eqx.filter_grad(lambda m: loss(m(x)))(model)
    assert close(mine, theirs)


def test_mlp_paths_from_attribute_names_and_query():
    model, x = mlp()
    mox = yax.make_mox(model)(x)
    assert [n.path for n in yax.query('//module_call[@type="Linear"]', mox)] == [
        "MLP/layers[0]", "MLP/layers[1]", "MLP/layers[2]"]
    assert [n.scope for n in yax.query('//module_call[@type="Linear"]', mox)] == [
        ("layers", "0"), ("layers", "1"), ("layers", "2")]
    assert [n.name for n in yax.query("//activation", mox)] == ["relu", "relu"]
    first = yax.query('//module_call[@path="MLP/layers[0]"]', mox)[0]
    assert first.attrs["in_features"] == 4 and first.attrs["out_features"] == 16 and first.info.num_params == 80
    text = yax.summary(mox)
    assert "layers[1]" in text and " 403 " in text  # 80 + 272 + 51 parameters
    assert "module_call[path=MLP/layers[2] type=Linear in_features=16 out_features=3" in str(mox)


def test_transformer_attention_and_layer_norm_are_nodes():
    model, ids = transformer()
    mox = yax.make_mox(model)(ids)
    paths = [n.path for n in mox.modules()]
    for p in ("Transformer/embed", "Transformer/blocks[0]/norm1", "Transformer/blocks[0]/attn",
              "Transformer/blocks[0]/attn/query_proj", "Transformer/blocks[1]/mlp/layers[1]", "Transformer/head"):
        assert p in paths, p
    assert len(yax.query('//module_call[@type="MultiheadAttention"]', mox)) == 2
    assert len(yax.query('//*[@name="gelu"]', mox)) >= 2


def test_scanned_layers_take_the_path_of_their_stack():
    model, x = scanned()
    mox = yax.make_mox(model)(x)
    ups = yax.query('//module_call[@path="Scanned/layers/up"]', mox)
    assert len(ups) == 1 and ups[0].scope == ("layers", "up")  # one node, inside the scan body
    assert yax.query('//scan//module_call[@type="Layer"]', mox)[0].path == "Scanned/layers"
    # capture gives every step's value, stacked
    out, values = yax.capture('//module_call[@path="Scanned/layers/up"]', mox, model, x)
    assert values["Scanned/layers/up"].shape == (3, 12)
    h = x
    for i in range(3):
        layer = jax.tree_util.tree_map(lambda a: a[i] if eqx.is_array(a) else a, model.layers)
        np.testing.assert_allclose(values["Scanned/layers/up"][i], layer.up(h), rtol=1e-5, atol=1e-6)
        h = layer(h)


class Shapes(eqx.Module):
    """Layers whose shapes cannot tell where a module made inside the trace
    came from: ``first`` runs under `jax.checkpoint` (rebuilt inside it, of
    the shape of one layer of either stack), ``a`` and ``b`` are two stacks of
    such layers, each scanned."""

    first: eqx.nn.Linear
    a: eqx.nn.Linear
    b: eqx.nn.Linear

    def __init__(self, dim: int = 3, key=KEY):
        k0, k1, k2 = jax.random.split(key, 3)
        self.first = eqx.nn.Linear(dim, dim, use_bias=False, key=k0)
        stack = eqx.filter_vmap(lambda k: eqx.nn.Linear(dim, dim, use_bias=False, key=k))
        self.a, self.b = stack(jax.random.split(k1, 2)), stack(jax.random.split(k2, 2))

    def __call__(self, x):
        x = jax.checkpoint(lambda layer, h: layer(h))(self.first, x)
        for stack in (self.a, self.b):
            params, static = eqx.partition(stack, eqx.is_array)
            x, _ = jax.lax.scan(lambda h, p: (eqx.combine(p, static)(h), None), x, params)
        return x


@pytest.mark.parametrize("jitted", [False, True], ids=["model", "jitted-function"])
def test_a_module_rebuilt_inside_the_trace_is_named_by_the_arrays_it_reads(jitted):
    model, x = Shapes(), jnp.linspace(-1.0, 1.0, 3)
    if jitted:  # the model an argument of a jitted function: its arrays reach the calls through `jit`
        mox = yax.make_mox(jax.jit(lambda m, h: m(h)))(model, x)
        assert mox.frontend == "jax"
    else:
        mox = yax.make_mox(model)(x)
    assert [(n.path, n.info.scope) for n in mox.modules()] == [
        ("Shapes", ()), ("Shapes/first", ("first",)), ("Shapes/a", ("a",)), ("Shapes/b", ("b",))]
    # each call's values are its own layer's, written by hand
    _, values = yax.capture('//module_call[@type="Linear"]', mox, model, x)
    h = model.first.weight @ x
    np.testing.assert_allclose(values["Shapes/first"], h, rtol=1e-6)
    for name in ("a", "b"):
        w = getattr(model, name).weight
        steps = []
        for i in range(2):
            h = w[i] @ h
            steps.append(h)
        np.testing.assert_allclose(values[f"Shapes/{name}"], np.stack(steps), rtol=1e-6)
    if jitted:
        return  # a function taking the model holds no variables to rewrite (`ParamsDoNotFit`)
    # a rewrite of one of them changes that one's arrays in the model it returns
    _, adapted = yax.sub('//module_call[@path="Shapes/first"]', yax.LoRA(rank=1), mox, params=model)
    assert type(adapted.first).__name__ == "LoRALinear" and type(adapted.a) is eqx.nn.Linear


@pytest.mark.parametrize("name", MODELS)
def test_sub_with_a_function(name):
    model, x = MODELS[name]()
    mox = yax.make_mox(model)(x)
    act = "gelu" if name == "transformer" else "relu"
    new = yax.sub(f'//activation[@name="{act}"]', jax.nn.silu, mox)
    assert str(mox) != str(new)
    if name == "mlp":
        want = eqx.tree_at(lambda m: m.activation, model, jax.nn.silu)(x)
    elif name == "scanned":
        want = _scanned_with(model, jax.nn.silu)(x)
    else:
        want = _transformer_with(model, jax.nn.silu)(x)
    np.testing.assert_allclose(yax.eval_mox(new, model, x), want, rtol=1e-5, atol=1e-6)


def _scanned_with(model, act):
    class L(Layer):
        def __call__(self, x):
            return x + self.down(act(self.up(x)))

    layers = L.__new__(L)
    object.__setattr__(layers, "up", model.layers.up)
    object.__setattr__(layers, "down", model.layers.down)
    return eqx.tree_at(lambda m: m.layers, model, layers)


def _transformer_with(model, act):
    return eqx.tree_at(lambda m: [b.mlp.activation for b in m.blocks], model, [act] * len(model.blocks))


def test_sub_with_a_module_returns_an_equinox_model():
    """An Equinox module put in place of another: leaves of the same path,
    shape and dtype keep the model's values (``weight``), the others come
    with it (Equinox modules are initialised when built; ``keep={}`` takes all
    its own); the model comes back as an Equinox model computing what the MoX
    computes."""
    model, x = mlp()
    mox = yax.make_mox(model)(x)
    other = eqx.nn.Linear(16, 16, use_bias=False, key=jax.random.key(5))
    new, new_model = yax.sub('//module_call[@path="MLP/layers[1]"]', other, mox, params=model)
    assert isinstance(new_model, eqx.nn.MLP) and new_model.layers[1].bias is None
    assert new_model.layers[1].weight is model.layers[1].weight  # kept
    want = eqx.tree_at(lambda m: m.layers[1], model, eqx.tree_at(lambda lin: lin.weight, other, model.layers[1].weight))
    np.testing.assert_allclose(yax.eval_mox(new, new_model, x), want(x), rtol=1e-6)
    np.testing.assert_allclose(new_model(x), want(x), rtol=1e-6)
    assert yax.query('//module_call[@path="MLP/layers[1]"]', new)[0].attrs["use_bias"] is False
    own, own_model = yax.sub('//module_call[@path="MLP/layers[1]"]', other, mox, params=model, keep={})
    want = eqx.tree_at(lambda m: m.layers[1], model, other)
    np.testing.assert_allclose(yax.eval_mox(own, own_model, x), want(x), rtol=1e-6)
    np.testing.assert_allclose(own_model(x), want(x), rtol=1e-6)
    np.testing.assert_allclose(yax.eval_mox(mox, model, x), model(x), rtol=1e-6)  # the inputs are untouched
    # a module of other shapes replacing a layer called inside `jax.vmap` is mapped like it
    model, ids = transformer()
    mox = yax.make_mox(model)(ids)
    head = eqx.nn.Linear(8, 11, key=jax.random.key(6))
    new, new_model = yax.sub('//module_call[@path="Transformer/head"]', head, mox, params=model, keep={})
    want = eqx.tree_at(lambda m: m.head, model, head)
    np.testing.assert_allclose(yax.eval_mox(new, new_model, ids), want(ids), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_model(ids), want(ids), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, pattern", [
    ("mlp", '//module_call[@type="Linear"]'),
    ("transformer", '//module_call[@type="MultiheadAttention"]/module_call[@name="query_proj" or @name="value_proj"]'),
    ("scanned", '//module_call[@type="Linear"]'),
])
def test_lora_trains_merges_and_is_an_equinox_model(name, pattern):
    model, x = MODELS[name]()
    mox = yax.make_mox(model)(x)
    new, adapted = yax.sub(pattern, yax.LoRA(rank=2), mox, params=model)
    n = len(yax.query(pattern, mox))
    assert len(yax.query('//module_call[@type="LoRALinear"]', new)) == n
    assert isinstance(adapted, type(model))
    np.testing.assert_allclose(yax.eval_mox(new, adapted, x), model(x), rtol=1e-6, atol=1e-6)  # starts equal
    np.testing.assert_allclose(adapted(x), model(x), rtol=1e-6, atol=1e-6)
    # train only the adapters: the loss goes down, and the MoX computes what the Equinox model computes
    mask = yax.lora_mask(eqx.filter(adapted, eqx.is_array))
    assert sum(jax.tree_util.tree_leaves(mask)) == 2 * n

    @eqx.filter_jit
    def step(m):
        g = eqx.filter_grad(lambda m: loss(yax.eval_mox(new, m, x)))(m)
        g = jax.tree_util.tree_map(lambda gi, k: gi * k, eqx.filter(g, eqx.is_array), mask)
        # a step small enough for any draw of `lora_a` (0.05 diverged for some keys on the transformer)
        return eqx.apply_updates(m, jax.tree_util.tree_map(lambda gi: -0.01 * gi, g))

    trained = adapted
    for _ in range(5):
        trained = step(trained)
    assert loss(trained(x)) < loss(model(x))
    np.testing.assert_allclose(yax.eval_mox(new, trained, x), trained(x), rtol=1e-5, atol=1e-5)
    merged, merged_model = yax.merge_lora(new, trained)
    assert not yax.query('//module_call[@type="LoRALinear"]', merged)
    assert isinstance(merged_model, type(model))
    np.testing.assert_allclose(yax.eval_mox(merged, merged_model, x), trained(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(merged_model(x), trained(x), rtol=1e-5, atol=1e-5)


def test_lora_refuses_layers_it_does_not_know():
    model, ids = transformer()
    mox = yax.make_mox(model)(ids)
    with pytest.raises(yax.errors.CannotAdapt) as e:
        yax.sub('//module_call[@type="LayerNorm"]', yax.LoRA(rank=2), mox, params=model)
    assert "`eqx.nn.Linear`" in e.value.knows and e.value.found == "is a `LayerNorm`"


def test_capture_patch_and_first_nonfinite():
    model, x = mlp()
    mox = yax.make_mox(model)(x)
    out, values = yax.capture('//module_call[@type="Linear"]', mox, model, x)
    np.testing.assert_allclose(values["MLP/layers[0]"], model.layers[0](x), rtol=1e-6)
    np.testing.assert_allclose(out, model(x), rtol=1e-6)
    zeroed = yax.patch('//module_call[@path="MLP/layers[1]"]', mox)({"MLP/layers[1]": jnp.zeros(16)}, model, x)
    np.testing.assert_allclose(zeroed, model.layers[2](jnp.zeros(16)), rtol=1e-6)
    assert yax.first_nonfinite(mox, model, x) is None
    broken = eqx.tree_at(lambda m: m.layers[1].weight, model, model.layers[1].weight.at[0, 0].set(jnp.nan))
    found = yax.first_nonfinite(mox, broken, x)
    assert found is not None and found.call.path == "MLP/layers[1]"


def test_compare_names_the_first_divergence():
    model, x = mlp()
    mox = yax.make_mox(model)(x)
    new = yax.sub('(//activation[@name="relu"])[2]', jax.nn.gelu, mox)
    c = yax.compare(mox, new, model, x)
    assert not c.allclose and c.first_divergence.startswith("MLP/relu")
    same = yax.compare(mox, yax.sub('//module_call[@type="Linear"]', yax.LoRA(rank=2), mox, params=model)[0],
                       model, x, new_params=yax.sub('//module_call[@type="Linear"]', yax.LoRA(rank=2), mox,
                                                    params=model)[1])
    assert same.allclose


def test_the_hooks_are_undone():
    model, x = mlp()
    before = eqx.nn.Linear.__call__
    yax.make_mox(model)(x)
    assert eqx.nn.Linear.__call__ is before
    with pytest.raises(yax.YaxTraceError):
        yax.make_mox(lambda m, x: m(x) + jnp.ones(7))(model, x)
    assert eqx.nn.Linear.__call__ is before


def test_explorer_rows_and_copy_as_code_that_runs():
    pytest.importorskip("anywidget")
    from yax_widget import Explorer

    model, x = mlp()
    ex = Explorer(model, x)
    assert [r[3] for r in ex._tree["rows"]][:3] == ["MLP", "layers[0]", "relu"]
    ex.add_replacement("LoRA", yax.LoRA(rank=2))
    ex.substitute('//module_call[@path="MLP/layers[0]"]', "LoRA")
    assert ex.comparison.allclose  # LoRA starts equal
    code = ex.code()
    assert "mox = yax.make_mox(model)(x)" in code and "params = model" in code
    ns = {"model": model, "x": x}
    exec(code, ns)  # noqa: S102 - the script the user would paste
    np.testing.assert_allclose(yax.eval_mox(ns["mox"], ns["params"], x), yax.eval_mox(ex.mox, ex.params, x),
                               rtol=1e-6)
    assert isinstance(ns["params"], eqx.nn.MLP)
