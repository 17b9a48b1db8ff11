"""yax.sub on linen models and functions, and the recipes users come for, each
checked against the real thing (a hand-modified model, apply); refusals change nothing."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DENSE_MLP, traced
from models import CNN, KEY, Shared, Transformer

import yax
import yax.internal

pytestmark = pytest.mark.core


def leaves_equal(a, b):
    return jax.tree_util.tree_all(jax.tree_util.tree_map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))


# -- functions and activations -------------------------------------------------------

@pytest.mark.parametrize("src, dst, fn", [("gelu", "relu", jax.nn.relu), ("relu", "gelu", jax.nn.gelu)])
def test_swap_activation_matches_hand_modified_model(src, dst, fn):
    ids = jnp.arange(16).reshape(2, 8) % 64
    acts = {"gelu": nn.gelu, "relu": nn.relu}
    model, hand = Transformer(act=acts[src]), Transformer(act=acts[dst])
    params = model.init(KEY, ids)
    mox = yax.make_mox(model.apply)(params, ids)
    new = yax.sub(f'//activation[@name="{src}"]', fn, mox)
    assert yax.query(f'count(//activation[@name="{dst}"])', new) == 2.0
    assert yax.query(f'count(//activation[@name="{src}"])', new) == 0.0
    np.testing.assert_allclose(yax.eval_mox(new, params, ids), hand.apply(params, ids), rtol=1e-6, atol=1e-6)
    # the original is untouched and still evaluates as before
    assert yax.query(f'count(//activation[@name="{src}"])', mox) == 2.0
    np.testing.assert_allclose(yax.eval_mox(mox, params, ids), model.apply(params, ids), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_rewritten_mox_under_jit_grad_vmap():
    mox, fn, (params, ids), kw = traced("transformer")
    new = yax.sub('//*[@name="gelu"]', jax.nn.relu, mox)
    hand = Transformer(act=nn.relu)
    f = jax.jit(lambda p, i: yax.eval_mox(new, p, i, **kw))
    np.testing.assert_allclose(f(params, ids), hand.apply(params, ids), rtol=1e-5, atol=1e-5)
    loss = lambda apply: lambda p: jnp.mean(apply(p) ** 2)  # noqa: E731
    g_new = jax.grad(loss(lambda p: yax.eval_mox(new, p, ids, **kw)))(params)
    g_hand = jax.grad(loss(lambda p: hand.apply(p, ids)))(params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_new, g_hand)
    batched = jax.vmap(lambda i: yax.eval_mox(new, params, i[None].repeat(2, 0), **kw))(ids)
    assert batched.shape == (2, 2, 8, 64)


def test_identity_equation_and_decider():
    mox, fn, (params, x), kw = traced("mlp")
    # an equation replaced by a function: every dot_general, by a decider that keeps the second one
    seen = []

    def decide(path, node):
        seen.append(path)
        return (lambda a, b: 2.0 * jnp.dot(a, b)) if path == "MLP/Dense_0" else node

    new = yax.sub("//dot_general", decide, mox)
    assert seen == ["MLP/Dense_0", "MLP/Dense_1"]
    (fn_node,) = [n for n in new.modules() if n.kind == "function"]
    assert fn_node.path == "MLP/Dense_0" and fn_node.name == "<lambda>"
    p = params["params"]
    h = jax.nn.relu(2.0 * x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    np.testing.assert_allclose(yax.eval_mox(new, params, x), h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"],
                               rtol=1e-6)


def test_remove_dropout_for_inference():
    mox, fn, (params, ids), kw = traced("transformer_dropout")
    new = yax.sub('//module_call[@type="Dropout"]', lambda x: x, mox)
    assert yax.query('count(//module_call[@type="Dropout"])', new) == 0.0
    want = Transformer(dropout=0.3).apply(params, ids, deterministic=True)
    np.testing.assert_allclose(yax.eval_mox(new, params, ids, **kw), want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(yax.eval_mox(mox, params, ids, **kw), want)  # dropout was on


@jax.custom_vjp
def sign_relu(x):
    """ReLU that saves one bit (the sign) per element for its backward pass."""
    return jnp.maximum(x, 0)


def _sr_fwd(x):
    return jnp.maximum(x, 0), x > 0


def _sr_bwd(mask, g):
    return (jnp.where(mask, g, 0),)


sign_relu.defvjp(_sr_fwd, _sr_bwd)


def test_custom_vjp_activation_keeps_gradients_flowing():
    mox, fn, (params, ids), kw = traced("transformer")
    new = yax.sub('//*[@name="gelu"]', sign_relu, mox)
    assert yax.query("count(//custom_vjp_call)", new) == 2.0
    hand = Transformer(act=nn.relu)
    g_new = jax.grad(lambda p: jnp.sum(yax.eval_mox(new, p, ids, **kw) ** 2))(params)
    g_hand = jax.grad(lambda p: jnp.sum(hand.apply(p, ids) ** 2))(params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g_new, g_hand)
    assert float(jnp.abs(g_new["params"]["Block_0"]["Dense_0"]["kernel"]).sum()) > 0


# -- modules and parameters ----------------------------------------------------------

def test_module_called_twice_shares_its_replacement():
    m, x = Shared(), jnp.linspace(-1, 1, 10).reshape(2, 5)
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    new, lp = yax.sub('//module_call[@name="shared"]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    calls = yax.query('//module_call[@type="LoRA"]', new)
    assert len(calls) == 3
    assert list(lp["params"]["shared"]) == ["bias", "kernel", "lora_a", "lora_b"]  # one set, not three
    lp["params"]["shared"]["lora_b"] = jnp.ones_like(lp["params"]["shared"]["lora_b"])
    p = lp["params"]["shared"]

    def hand(x):
        for _ in range(3):
            x = jnp.tanh(x @ p["kernel"] + p["bias"] + (x @ p["lora_a"]) @ p["lora_b"] * (4.0 / 2))
        return x

    np.testing.assert_allclose(yax.eval_mox(new, lp, x), hand(x), rtol=1e-5, atol=1e-6)
    # replacing one of the three calls: LoRA keeps `kernel`/`bias`, so the other two still read them
    one, lp1 = yax.sub('(//module_call[@name="shared"])[2]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    assert [n.type for n in yax.query('//module_call[@name="shared"]', one)] == ["Dense", "LoRA", "Dense"]
    np.testing.assert_allclose(yax.eval_mox(one, lp1, x), m.apply(params, x), atol=1e-6)


def test_replacing_a_module_with_new_variables_and_dropping_old_ones():
    mox, fn, (params, x), kw = traced("mlp")
    new, p2 = yax.sub('//module_call[@name="Dense_0"]', nn.Dense(16, use_bias=False), mox, params=params, key=KEY)
    assert set(p2["params"]["Dense_0"]) == {"kernel"}
    assert p2["params"]["Dense_0"]["kernel"] is params["params"]["Dense_0"]["kernel"]
    pp = params["params"]
    want = jax.nn.relu(x @ pp["Dense_0"]["kernel"]) @ pp["Dense_1"]["kernel"] + pp["Dense_1"]["bias"]
    np.testing.assert_allclose(yax.eval_mox(new, p2, x), want, rtol=1e-6)
    ident, p3 = yax.sub('//module_call[@name="Dense_1"]', lambda h: h[:, :8], mox, params=params)
    assert "Dense_1" not in p3["params"] and "Dense_1" in params["params"]
    np.testing.assert_allclose(yax.eval_mox(ident, p3, x), jax.nn.relu(x @ pp["Dense_0"]["kernel"] + pp["Dense_0"]["bias"])[:, :8],
                               rtol=1e-6)


def test_mixed_precision_by_query():
    m, x = CNN(), jax.random.normal(KEY, (2, 8, 8, 3))
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x, train=False)
    q = '//module_call[@type="Dense" or @type="Conv"]'
    new, p2 = yax.sub(q, lambda path, node: yax.module_of(node, dtype=jnp.bfloat16), mox, params=params, cast=True)
    assert leaves_equal(p2, params)  # same variables, float32 storage
    dots = yax.query('//module_call[@type="Dense" or @type="Conv"]//*[@primitive="dot_general" or '
                     '@primitive="conv_general_dilated"]', new)
    assert [str(e.outputs[0].dtype) for e in dots] == ["bfloat16", "bfloat16"]
    norm = yax.query('//module_call[@type="BatchNorm"]', new)[0]
    assert str(norm.outputs[0].dtype) == "float32"
    c = yax.compare(mox, new, params, x, train=False, rtol=1e-2, atol=1e-2)
    assert c.boundaries["CNN/Conv_0"].max_abs > 0 and c.boundaries["CNN/Conv_0"].cosine > 0.999
    assert 0 < c.outputs["out"].max_abs < 0.1 and c.outputs["out"].cosine > 0.999
    hand = CNN().apply(params, x, train=False)
    with pytest.raises(yax.errors.DoesNotFit) as e:
        yax.sub(q, lambda path, node: yax.module_of(node, dtype=jnp.bfloat16), mox, params=params)
    assert e.value.found.startswith("bf16[") and e.value.expected.startswith("f32[")
    assert e.value.hint.startswith("Pass `cast=True`")
    np.testing.assert_allclose(yax.eval_mox(new, p2, x, train=False), hand, atol=0.1)


def test_history_is_a_list_of_values():
    mox, fn, (params, ids), kw = traced("transformer")
    history = [mox]
    history.append(yax.sub('//*[@name="gelu"]', jax.nn.relu, history[-1]))
    history.append(yax.sub('//module_call[@type="Dropout"]', lambda x: x, history[-1]))
    history.append(yax.sub('//*[@name="relu"]', jax.nn.silu, history[-1]))
    texts = [str(h) for h in history]
    assert len(set(texts)) == 4 and str(mox) == texts[0]
    outs = [yax.eval_mox(h, params, ids, **kw) for h in history]
    np.testing.assert_allclose(outs[1], outs[2], atol=1e-6)  # dropout was off
    assert not np.allclose(outs[0], outs[1]) and not np.allclose(outs[2], outs[3])
    np.testing.assert_allclose(yax.eval_mox(history[0], params, ids, **kw), fn(params, ids, **kw), atol=1e-6)


# -- bad rewrites fail cleanly -------------------------------------------------------

def _snapshot(mox, params):
    return str(mox), yax.to_xml(mox), jax.tree_util.tree_map(np.asarray, params)


@pytest.mark.parametrize(
    "pattern, repl, kwargs, match",
    [
        ('//module_call[@name="Dense_0"]', nn.Dense(7), {"key": KEY},
         r"module_call `Dense_0` at `MLP/Dense_0` does not fit: its output 0 is f32\[2,7\] but the node's is f32\[2,16\]"),
        ('//module_call[@name="Dense_0"]', lambda a, b: a, {},
         r"could not be traced on the node's inputs \(f32\[2,4\]\)"),
        ('//module_call[@name="Dense_0"]', lambda a: (a, a), {}, "returns 2 arrays, but the node returns 1"),
        ('//module_call[@name="Dense_0"]', yax.LoRA(rank=2), {"params": None},
         "has variables the model does not have; pass `params=`"),
        ('//module_call[@name="Dense_0"]', yax.LoRA(rank=2), {"key": None}, "pass `key=`"),
        ("/mox", jax.nn.relu, {}, "the pattern matched a `root` node"),
        ('count(//module_call)', jax.nn.relu, {}, "gives the float 3.0, not nodes"),
        ("//[", jax.nn.relu, {}, "is invalid"),
        ('//module_call[@name="Dense_0"]', 42, {}, "must be a MoX, an Equation, a Flax module or a function"),
        ('//module_call[@name="Dense_0"]', lambda path, node: 1 / 0, {},
         r"The decider `<lambda>` raised ZeroDivisionError: division by zero when asked about the module_call "
         r"`Dense_0` at `MLP/Dense_0`"),
        ('//module_call[@name="Dense_0"]', yax.LoRA(rank=2), {"key": "abc"}, r"`key` must be a PRNG key.*'abc'"),
        ('//module_call[@name="Dense_0"]', yax.LoRA(rank=2), {"params": [1, 2, 3]}, r"`params` is a `list`"),
        ('//module_call[@name="Dense_0"]', yax.LoRA(rank=2), {"params": "missing Dense_1"},
         r"`params` lacks 2 of the variables the MoX was traced with \(first `\['params'\]\['Dense_1'\]"),
    ],
)
def test_bad_rewrites_raise_and_change_nothing(pattern, repl, kwargs, match):
    mox, fn, (params, x), kw = traced("mlp")
    before = _snapshot(mox, params)
    kwargs = {"params": params, **kwargs}
    if kwargs["params"] == "missing Dense_1":
        kwargs["params"] = {"params": {k: v for k, v in params["params"].items() if k != "Dense_1"}}
    with pytest.raises((yax.YaxRewriteError, yax.YaxQueryError), match=match):
        yax.sub(pattern, repl, mox, **kwargs)
    after = _snapshot(mox, params)
    assert before[:2] == after[:2] and leaves_equal(before[2], after[2])
    np.testing.assert_allclose(yax.eval_mox(mox, params, x), fn(params, x), rtol=1e-6)


def test_dropping_variables_a_shared_call_still_reads_is_refused():
    mox, fn, (params, ids), kw = traced("transformer")
    before = _snapshot(mox, params)
    # `embed` is called twice: __call__ (lookup) and attend (tied output). Replacing only the lookup by a
    # function drops `embedding`, which attend still reads.
    with pytest.raises(yax.errors.Dangling) as e:
        yax.sub('//module_call[@name="embed"][@method="__call__"]', lambda i: jnp.zeros((2, 8, 32)), mox,
                params=params)
    assert before[:2] == _snapshot(mox, params)[:2]
    # the message shows the printed IR around the node, that node's line marked (like check_jaxpr)
    marked = [line for line in str(e.value).splitlines() if line.startswith(">>> ")]
    assert len(marked) == 1 and "transpose" in marked[0]  # attend transposes the dropped embedding
    assert "the equation `transpose` at `Transformer/embed`" in str(e.value)
    assert yax.errors.message(e.value).endswith("Nothing was changed.")


@pytest.mark.slow
def test_variables_inside_scan_bodies_are_stacked_per_layer():
    mox, fn, (params, ids), kw = traced("transformer_scan")
    new, lp = yax.sub(DENSE_MLP, yax.LoRA(rank=2), mox, params=params, key=KEY)
    # the adapters sit beside each scanned kernel, one slice per layer, initialised per layer
    layers = 3
    lora_a = [x for kp, x in jax.tree_util.tree_flatten_with_path(lp)[0] if kp[-1].key == "lora_a"]
    assert lora_a and all(x.shape[0] == layers and x.ndim == 3 for x in lora_a)
    assert not np.allclose(lora_a[0][0], lora_a[0][1])  # split keys: the layers differ
    np.testing.assert_allclose(yax.eval_mox(new, lp, ids), fn(params, ids), rtol=1e-6, atol=1e-6)
    # trained adapters change the output, and merging them back gives the same function
    trained = jax.tree_util.tree_map_with_path(
        lambda kp, x: x + 0.1 if kp[-1].key == "lora_b" else x, lp)
    out = yax.eval_mox(new, trained, ids)
    assert not np.allclose(out, fn(params, ids), atol=1e-3)
    merged, mp = yax.merge_lora(new, trained)
    assert not yax.query('//module_call[@type="LoRA"]', merged)
    np.testing.assert_allclose(yax.eval_mox(merged, mp, ids), out, rtol=1e-4, atol=1e-5)
    assert jax.tree_util.tree_structure(mp) == jax.tree_util.tree_structure(params)
    np.testing.assert_allclose(jax.jit(yax.to_function(new))(lp, ids), fn(params, ids), rtol=1e-6, atol=1e-6)
    new = yax.sub('//*[@name="gelu"]', jax.nn.relu, mox)
    want = Transformer(scan=True, num_layers=3, act=nn.relu).apply(params, ids)
    np.testing.assert_allclose(yax.eval_mox(new, params, ids), want, rtol=1e-5, atol=1e-5)


class Ensemble(nn.Module):
    """Three Dense heads stacked by `nn.vmap` (`variable_axes`), averaged."""

    in_axes: int | None = None
    variable_axis: int = 0
    lora: bool = False  # the adapted model written by hand: `nn.vmap` of the adapter

    @nn.compact
    def __call__(self, x):
        cls, kw = (nn.Dense, {"features": 8})
        if self.lora:
            from yax.frontends.linen import LoRA  # the linen adapter `yax.LoRA` puts in

            cls, kw = LoRA, {"rank": 2, "base": functools.partial(nn.Dense, 8)}
        heads = nn.vmap(cls, variable_axes={"params": self.variable_axis}, split_rngs={"params": True},
                        in_axes=self.in_axes, out_axes=0, axis_size=3)(**kw, name="heads")
        return nn.Dense(2)(heads(x).mean(0))


@pytest.mark.parametrize("in_axes, shape", [(None, (4, 5)), (0, (3, 4, 5))])
def test_lora_on_modules_mapped_by_nn_vmap(in_axes, shape):
    """LoRA on heads stacked by `nn.vmap`: new leaves stacked per head and
    initialised with split keys, the heads' own leaves untouched; it starts
    equal, computes what `nn.vmap` of the adapter computes (each head with its
    own update), trains under jit/grad and merges back per head."""
    x = jnp.linspace(-1, 1, np.prod(shape)).reshape(shape)
    m = Ensemble(in_axes=in_axes)
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    np.testing.assert_allclose(yax.eval_mox(mox, params, x), m.apply(params, x), rtol=1e-5, atol=1e-7)  # float32, evaluated in another order
    assert yax.internal.misfit(yax.LoRA(rank=2), yax.query('//module_call[@name="heads"]', mox)[0], mox, params=params) is None
    new, lp = yax.sub('//module_call[@name="heads"]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    heads = lp["params"]["heads"]
    assert {k: v.shape for k, v in heads.items()} == {"kernel": (3, 5, 8), "bias": (3, 8), "lora_a": (3, 5, 2),
                                                      "lora_b": (3, 2, 8)}
    assert heads["kernel"] is params["params"]["heads"]["kernel"] and heads["bias"] is params["params"]["heads"]["bias"]
    assert not np.allclose(heads["lora_a"][0], heads["lora_a"][1]) and not np.any(heads["lora_b"])  # split keys
    # starts exactly equal to the model before the change (eager eval_mox and apply may differ by an ulp on older jax)
    np.testing.assert_array_equal(yax.eval_mox(new, lp, x), yax.eval_mox(mox, params, x))
    # a trained adapter: what `nn.vmap` of the adapter computes, each head changed by its own update
    b = jax.random.normal(jax.random.key(1), (3, 2, 8))
    trained = {"params": {**lp["params"], "heads": {**heads, "lora_b": b}}}
    hand = Ensemble(in_axes=in_axes, lora=True)
    out = yax.eval_mox(new, trained, x)
    np.testing.assert_allclose(out, hand.apply(trained, x), rtol=1e-5, atol=1e-6)
    kernels = heads["kernel"] + jnp.einsum("hir,hro->hio", heads["lora_a"], b) * 2.0  # alpha / rank = 4 / 2
    each = [(x if in_axes is None else x[h]) @ kernels[h] + heads["bias"][h] for h in range(3)]
    np.testing.assert_allclose(out, nn.Dense(2).apply({"params": params["params"]["Dense_0"]},
                                                      jnp.stack(each).mean(0)), rtol=1e-5, atol=1e-6)
    # jit and grad: each head's adapter gets its own gradient
    loss = lambda p: jnp.sum(yax.eval_mox(new, p, x) ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.jit(loss)(trained), jnp.sum(out ** 2), rtol=1e-5)
    g = jax.grad(loss)(trained)["params"]["heads"]["lora_b"]
    assert g.shape == (3, 2, 8) and all(np.any(g[h]) for h in range(3))
    # merged back per head: the original model with merged kernels
    merged, mp = yax.merge_lora(new, trained)
    assert not yax.query('//module_call[@type="LoRA"]', merged)
    assert jax.tree_util.tree_structure(mp) == jax.tree_util.tree_structure(params)
    np.testing.assert_allclose(mp["params"]["heads"]["kernel"], kernels, rtol=1e-6)
    np.testing.assert_allclose(yax.eval_mox(merged, mp, x), out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.apply(mp, x), out, rtol=1e-5, atol=1e-6)


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(8)(x))


class _ScannedHeads(nn.Module):
    """Two scanned layers, each three `nn.vmap`-stacked blocks holding a Dense."""

    @nn.compact
    def __call__(self, x):
        def layer(mdl, h, _):
            heads = nn.vmap(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                            out_axes=0, axis_size=3)(name="heads")
            return heads(h).mean(0)[..., :5], None

        x, _ = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)(self, x, None)
        return x


def test_lora_inside_nn_vmap_inside_nn_scan():
    """A Dense inside blocks stacked by `nn.vmap`, inside `nn.scan` layers:
    new leaves stacked per layer, then per block; starts equal; merges back."""
    x = jnp.linspace(-1, 1, 20).reshape(4, 5)
    m = _ScannedHeads()
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    new, lp = yax.sub('//module_call[@type="Dense"]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    (dense,) = jax.tree_util.tree_leaves(lp, is_leaf=lambda d: isinstance(d, dict) and "lora_a" in d)[:1]
    assert dense["lora_a"].shape == (2, 3, 5, 2) and dense["kernel"].shape == (2, 3, 5, 8)
    np.testing.assert_array_equal(yax.eval_mox(new, lp, x), m.apply(params, x))
    trained = jax.tree_util.tree_map_with_path(
        lambda kp, v: v + 0.1 if "lora_b" in jax.tree_util.keystr(kp) else v, lp)
    out = yax.eval_mox(new, trained, x)
    assert not np.allclose(out, m.apply(params, x))
    merged, mp = yax.merge_lora(new, trained)
    np.testing.assert_allclose(m.apply(mp, x), out, rtol=1e-5, atol=1e-6)


def test_modules_mapped_by_nn_vmap_functions_and_refusals():
    """A function replaces the whole mapped call (it sees the mapped axis);
    what yax cannot map like the original (variables stacked along another
    axis) is refused by `sub` and `misfit` alike, changing nothing."""
    x = jnp.linspace(-1, 1, 20).reshape(4, 5)
    m = Ensemble()
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    zeroed = yax.sub('//module_call[@name="heads"]', lambda h: jnp.zeros((3, 4, 8)), mox)
    np.testing.assert_allclose(yax.eval_mox(zeroed, params, x), nn.Dense(2).apply(
        {"params": params["params"]["Dense_0"]}, jnp.zeros((4, 8))), rtol=1e-6)
    with pytest.raises(yax.errors.DoesNotFit) as e:
        yax.sub('//module_call[@name="heads"]', lambda h: jnp.zeros((4, 8)), mox)
    assert (e.value.found, e.value.expected) == ("f32[4,8]", "f32[3,4,8]")
    assert e.value.hint.startswith("The node's output has one axis more") and "`jax.vmap`" in e.value.hint

    m = Ensemble(variable_axis=1)
    params = m.init(KEY, x)
    assert params["params"]["heads"]["kernel"].shape == (5, 3, 8)
    mox = yax.make_mox(m.apply)(params, x)
    before = str(mox), jax.tree_util.tree_map(np.asarray, params)
    node = yax.query('//module_call[@name="heads"]', mox)[0]
    with pytest.raises(yax.errors.Unmappable) as e:
        yax.sub(node, yax.LoRA(rank=2), mox, params=params, key=KEY)
    assert (e.value.node, e.value.transform, e.value.axis) == (node, "nn.vmap", 1)
    assert "stacked along axis 1" in yax.internal.misfit(yax.LoRA(rank=2), node, mox, params=params)
    assert str(mox) == before[0] and leaves_equal(params, before[1])


def test_nodes_from_another_mox_are_refused():
    mox, *_ = traced("mlp")
    other, *_ = traced("mlp")
    with pytest.raises(yax.errors.NotInMox) as e:
        yax.sub(other.calls[0].calls[0], jax.nn.relu, mox)
    assert e.value.node is other.calls[0].calls[0] and e.value.tool == "sub"


def test_new_variables_are_what_init_gives_with_one_compile_per_shape():
    """Each new variable is the replacement's own ``init`` (key folded with the
    layer's index, inputs of the shapes the layer saw), and equal layers share
    one compiled initialiser: two shapes of MLP Dense, two XLA compiles, and
    nothing else compiles (folding keys and making inputs included)."""
    import jax.monitoring

    from yax.frontends import linen

    compiles, counting = [], [False]
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: counting[0] and name.endswith("backend_compile_duration") and compiles.append(name))
    mox, fn, (params, ids), kw = traced("transformer")
    linen._inits.clear()  # initialisers other tests compiled
    jax.clear_caches()
    key, other = jax.random.key(3), jax.random.key(7)
    counting[0] = True
    new, lp = yax.sub(DENSE_MLP, yax.LoRA(rank=2), mox, params=params, key=key)
    counting[0] = False
    nodes = yax.query('//module_call[@type="LoRA"]', new)
    assert len(nodes) > 2 and len(compiles) == 2
    for i, n in enumerate(nodes):
        layer = n.module_type(rank=2, base=n.attrs["base"])  # the linen adapter `yax.LoRA` put there
        want = layer.init(jax.random.fold_in(key, i), *(jnp.zeros(v.shape, v.dtype) for v in n.inputs))
        got = lp["params"]
        for k in n.scope:
            got = got[k]
        for leaf in ("lora_a", "lora_b"):
            np.testing.assert_array_equal(got[leaf], want["params"][leaf])
    # another key compiles nothing
    counting[0] = True
    yax.sub(DENSE_MLP, yax.LoRA(rank=2), mox, params=params, key=other)
    counting[0] = False
    assert len(compiles) == 2


def test_a_decider_is_named_path_node_or_marked_and_a_two_argument_function_is_told_which_rule_it_missed():
    """The prototype's ``sub(fn, mox)`` with ``fn(path, expr)`` (re.sub style): marked with
    `yax.decider` it decides per match; unmarked, it is a replacement, and the refusal says that a
    decider's parameters are named ``path, node`` or that it is marked with `yax.decider`."""
    x = jnp.linspace(-2, 2, 6)
    mox = yax.make_mox(lambda x: jnp.tanh(jax.nn.relu(x) + jax.nn.relu(-x)))(x)

    def choose(path, expr):  # gelu for the first relu, keep the second
        return jax.nn.gelu if expr is yax.query("//activation", mox)[0] else expr

    new = yax.sub("//activation", yax.decider(choose), mox)
    assert [n.name for n in new.modules()] == ["gelu", "relu"]
    np.testing.assert_allclose(yax.eval_mox(new, x), jnp.tanh(jax.nn.gelu(x) + jax.nn.relu(-x)), rtol=1e-6)
    # the naming rule still works, and agrees
    named = yax.sub("//activation", lambda path, node: choose(path, node), mox)
    assert [n.name for n in named.modules()] == ["gelu", "relu"]
    assert yax.internal.is_decider(yax.decider(choose)) and not yax.internal.is_decider(choose)
    with pytest.raises(yax.YaxRewriteError, match=r"(?s)`choose\(path, expr\)` takes two arguments.*"
                       r"must be named `path, node` \(these are `path, expr`\).*`yax.decider\(choose\)`"):
        yax.sub("//activation", choose, mox)
    with pytest.raises(yax.errors.WrongType) as e:
        yax.decider(3)
    assert (e.value.argument, e.value.found) == ("fn", "int")


@pytest.mark.parametrize("frontend", ["linen", "nnx"])
def test_a_replacement_closing_over_an_array_inside_a_remat_body(frontend):
    """A remat body is an open jaxpr and holds no constants: an array a replacement closes
    over goes into it as an input (the oracle found `eval_mox` refusing what `sub` accepted)."""
    mask = jnp.array([1.0, 0.0, 2.0])

    def swapped(h):  # the replacement, and the hand-written model's block
        return jnp.tanh(h) * mask

    if frontend == "linen":
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                return nn.remat(nn.Dense)(3, name="d")(x).sum()

        net = Net()
        params = net.init(KEY, jnp.ones((2, 3)))
        mox = yax.make_mox(net.apply)(params, jnp.ones((2, 3)))
        args = lambda x: (params, x)  # noqa: E731
        w, b = params["params"]["d"]["kernel"], params["params"]["d"]["bias"]
    else:
        from flax import nnx

        class Net(nnx.Module):
            def __init__(self, rngs):
                self.d = nnx.Linear(3, 3, rngs=rngs)

            def __call__(self, x):
                return nnx.remat(lambda m, x: m(x))(self.d, x).sum()

        net = Net(nnx.Rngs(0))
        mox = yax.make_mox(net)(jnp.ones((2, 3)))
        state = nnx.state(net)
        args = lambda x: (state, x)  # noqa: E731
        w, b = net.d.kernel[...], net.d.bias[...]
    assert yax.query("//remat2//dot_general", mox), mox
    new = yax.sub("//remat2//dot_general", lambda a, k: swapped(a @ k), mox)

    def hand(x):
        return (swapped(x @ w) + b).sum()

    def run(m, x):  # nnx's MoX returns (output, state after the call)
        out = yax.eval_mox(m, *args(x))
        return out[0] if frontend == "nnx" else out

    x = jnp.arange(6.0).reshape(2, 3) / 5
    np.testing.assert_allclose(run(new, x), hand(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda x: run(new, x))(x), hand(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: run(new, x))(x), jax.grad(hand)(x), rtol=1e-6)
    np.testing.assert_allclose(run(mox, x), ((x @ w) + b).sum(), rtol=1e-6)  # the original untouched
