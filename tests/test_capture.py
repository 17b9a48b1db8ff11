"""yax.capture, yax.patch and yax.first_nonfinite, checked against the real
thing: flax's ``capture_intermediates`` and ``sow`` for linen, ``nnx.capture``
(the model's own method outputs) for nnx, layer-by-layer runs for scanned
stacks, hand-modified models for patching, and ``jax_debug_nans`` for NaNs."""

from __future__ import annotations

import collections
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from models import CASES, KEY, DecoderLayer, ScannedTransformer
from nnx_models import NNX_CASES

import yax
from yax.internal import capture_programs

pytestmark = pytest.mark.core

CALLS = "//module_call | //method_call"


def close(a, b, atol=1e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol), a, b)


@functools.cache
def traced(name):
    fn, args, kwargs = CASES[name]()
    return yax.make_mox(fn)(*args, **kwargs), fn, args, kwargs


def top(mox):
    """The path of the outermost module call (the model's name)."""
    return next(mox.modules()).path.split("/")[0]


def flax_keys(intermediates, root):
    """flax's ``intermediates`` collection by yax's keys: ``path`` (``path.method``), ``#k`` for the k-th call."""
    out = {}
    stack = [((), intermediates)]
    while stack:
        scope, d = stack.pop()
        for k, v in d.items():
            if not isinstance(v, tuple):
                stack.append(((*scope, k), v))
                continue
            if k == "setup":  # flax records `setup` (it returns nothing); yax does not
                continue
            base = "/".join((root, *scope)) + ("" if k == "__call__" else f".{k}")
            out.update({base if i == 0 else f"{base}#{i + 1}": x for i, x in enumerate(v)})
    return out


# -- capture against flax -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["mlp", "setup", "method", "two_methods", "cnn_eval", "transformer",
                                  "transformer_remat", "shared", "lifted", "pytree_io", "tied_nested"])
def test_capture_matches_flax_capture_intermediates(name):
    mox, fn, args, kwargs = traced(name)
    out, values = yax.capture(CALLS, mox, *args, **kwargs)
    # every method of every module, private helpers included (they are `method_call` nodes)
    ref, state = fn(*args, **kwargs, capture_intermediates=lambda mdl, method: True, mutable=["intermediates"])
    close(out, ref)
    want = flax_keys(state["intermediates"], top(mox))
    assert want and set(want) <= set(values)
    for k, v in want.items():
        close(values[k], v)
    # only what flax cannot see is extra: calls under nn.vmap, and modules applied with their own `.apply`
    assert set(values) - set(want) <= {"Lifted/VmapDense_0", "TiedNested/Dense_0"}


def test_capture_is_in_call_order_and_numbers_repeated_calls():
    mox, fn, args, kwargs = traced("shared")
    _, values = yax.capture('//*[@name="shared"] | //activation', mox, *args, **kwargs)
    assert list(values) == ["Shared/shared", "Shared/tanh", "Shared/shared#2", "Shared/tanh#2", "Shared/shared#3",
                            "Shared/tanh#3"]
    _, state = fn(*args, capture_intermediates=True, mutable=["intermediates"])
    close([values["Shared/shared"], values["Shared/shared#2"], values["Shared/shared#3"]],
          list(state["intermediates"]["shared"]["__call__"]))


def test_capture_matches_sow():
    mox, fn, args, kwargs = traced("sow")
    _, values = yax.capture('//module_call[@path="Intermediates/Dense_0"]', mox, *args, **kwargs)
    _, state = fn(*args, **kwargs)
    close(values["Intermediates/Dense_0"], state["intermediates"]["h"][0])


class ScanLayer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.gelu(nn.Dense(12, name="up")(nn.LayerNorm(name="norm")(x)))
        return x + nn.Dense(x.shape[-1], name="down")(h), None


class Scanned(nn.Module):
    """nn.scan(nn.remat(layer)) whose intermediates flax stacks too (``variable_axes`` has them)."""

    @nn.compact
    def __call__(self, x):
        stack = nn.scan(nn.remat(ScanLayer), variable_axes={"params": 0, "intermediates": 0},
                        split_rngs={"params": True}, length=3)
        x, _ = stack(name="layers")(x, None)
        return nn.Dense(2, name="head")(x)


def test_capture_inside_nn_scan_stacks_like_flax():
    m, x = Scanned(), jax.random.normal(KEY, (2, 5, 6))
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    out, values = yax.capture(CALLS + " | //activation", mox, params, x)
    ref, state = m.apply(params, x, capture_intermediates=True, mutable=["intermediates"])
    close(out, ref)
    want = flax_keys(state["intermediates"], "Scanned")
    assert values["Scanned/layers/up"].shape == (3, 2, 5, 12)  # one per step, along the scan axis
    assert {"Scanned/layers/up", "Scanned/layers/down", "Scanned/layers/norm", "Scanned/head"} <= set(want)
    for k, v in want.items():
        close(values[k], v)
    # and layer by layer, by hand
    layer, h = ScanLayer(), x
    for i in range(3):
        p = jax.tree_util.tree_map(lambda a, i=i: a[i], params["params"]["layers"])
        up = nn.Dense(12).apply({"params": p["up"]}, nn.LayerNorm().apply({"params": p["norm"]}, h))
        close(values["Scanned/layers/gelu"][i], nn.gelu(up))
        h, _ = layer.apply({"params": p}, h, None)
        close(values["Scanned/layers"][0][i], h)


@pytest.mark.parametrize("name", ["mlp", "transformer", "transformer_remat", "transformer_scan",
                                  "transformer_scan_remat", "shared", "sequential", "cnn_eval"])
def test_capture_matches_nnx_capture(name):
    model, args, kwargs = NNX_CASES[name]()
    mox = yax.make_mox(model)(*args, **kwargs)
    (out, _), values = yax.capture(CALLS, mox, nnx.state(model), *args, **kwargs)
    ref, inter = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(*args, **kwargs)
    close(out, ref)
    want = {}
    for kp, v in jax.tree_util.tree_leaves_with_path(inter):
        # dict keys and sequence indices; not the Variable's `.value` field (newer flax)
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in kp if not isinstance(k, jax.tree_util.GetAttrKey)]
        *scope, method, i = keys
        base = "/".join(map(str, (top(mox), *scope))) + ("" if method == "__call__" else f".{method}")
        want[base if i == 0 else f"{base}#{i + 1}"] = v
    assert want and set(want) <= set(values)
    for k, v in want.items():
        close(values[k], v)


def test_capture_stacks_nnx_scan_layers_like_running_them_one_by_one():
    model, args, _ = NNX_CASES["transformer_scan"]()
    mox = yax.make_mox(model)(*args)
    (out, _), values = yax.capture('//module_call[@path="ScanTransformer/blocks"]', mox, nnx.state(model), *args)
    graphdef, state = nnx.split(model.blocks)
    h = model.embed(*args)
    for i in range(3):
        block = nnx.merge(graphdef, jax.tree_util.tree_map(lambda a, i=i: a[i], state))
        h = block(h)
        close(values["ScanTransformer/blocks"][i], h)


def test_capture_with_inputs_and_equations():
    mox, fn, args, kwargs = traced("transformer")
    pattern = '//module_call[@path="Transformer/Block_1"] | //module_call[@path="Transformer/Block_0"]//dot_general'
    _, values = yax.capture(pattern, mox, *args, with_inputs=True, **kwargs)
    _, state = fn(*args, **kwargs, capture_intermediates=True, mutable=["intermediates"])
    inter = state["intermediates"]
    (x, mask), out = values["Transformer/Block_1"]  # the arrays the call received, in argument order
    close(x, inter["Block_0"]["__call__"][0])
    close(out, inter["Block_1"]["__call__"][0])
    assert mask.shape == (2, 1, 8, 8)  # the causal mask, the second argument
    dots = [k for k in values if k.startswith("Transformer/Block_0/")]
    assert "Transformer/Block_0/SelfAttention_0/query:dot_general" in dots
    (lhs, rhs), y = values["Transformer/Block_0/SelfAttention_0/query:dot_general"]
    close(y, lhs @ rhs, atol=1e-4)


def test_capture_thirdparty_scanned_remat_transformer_layer_by_layer():
    m, ids = ScannedTransformer(), jnp.arange(16).reshape(2, 8) % 100
    params = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(params, ids)
    out, values = yax.capture('//*[@path="ScannedTransformer/layers"] | //activation[@name="gelu"]', mox, params, ids)
    close(out, m.apply(params, ids))
    embed = nn.Embed(100, 32).apply({"params": params["params"]["embed"]}, ids)
    mask, h = nn.make_causal_mask(ids), embed
    layer = DecoderLayer(4, 8, 64)
    for i in range(2):
        p = jax.tree_util.tree_map(lambda a, i=i: a[i], params["params"]["layers"])
        h, _ = layer.apply({"params": p}, h, mask)
        close(values["ScannedTransformer/layers"][0][i], h, atol=1e-4)
    assert values["ScannedTransformer/layers/gelu"].shape == (2, 2, 8, 64)


# -- pure: jit, grad, vmap, one compilation ----------------------------------------------------

def test_capture_is_pure_jittable_and_differentiable():
    mox, fn, (params, x), kwargs = traced("mlp")
    pattern = '//module_call[@path="MLP/Dense_0"]'

    def hidden(p, x):
        return yax.capture(pattern, mox, p, x)[1]["MLP/Dense_0"]

    def by_hand(p, x):
        return nn.Dense(16).apply({"params": p["params"]["Dense_0"]}, x)

    close(jax.jit(hidden)(params, x), by_hand(params, x))
    close(jax.grad(lambda p: (hidden(p, x) ** 2).sum())(params), jax.grad(lambda p: (by_hand(p, x) ** 2).sum())(params))
    xs = jnp.stack([x, 2 * x])
    close(jax.vmap(hidden, in_axes=(None, 0))(params, xs), jax.vmap(by_hand, in_axes=(None, 0))(params, xs))


def test_capture_compiles_once_per_mox_and_pattern():
    mox, fn, (params, x), kwargs = traced("mlp")
    pattern = "//activation"
    for scale in (1.0, 2.0, 3.0):
        yax.capture(pattern, mox, params, scale * x)
    (prog,) = [p for k, p in capture_programs(mox).items() if k[0] == pattern]
    assert prog.traces == 1


def test_a_pattern_matching_nothing_is_refused_with_explain():
    mox, fn, args, kwargs = traced("mlp")
    with pytest.raises(yax.errors.NothingToCapture) as e:
        yax.capture('//module_call[@type="Dense"][@features=99]', mox, *args)
    assert e.value.tool == "capture" and "stops matching here" in e.value.explained
    with pytest.raises(yax.errors.NothingToCapture) as e:
        yax.patch("/", mox)  # the root alone is no call
    assert (e.value.tool, e.value.pattern) == ("patch", "/")


@pytest.mark.parametrize("pattern, holder", [("//while//add", "while"), ("//cond//mul", "cond"),
                                             ("//custom_jvp_call//tanh", "custom_jvp_call")])
def test_values_that_cannot_come_out_are_refused_with_the_reason(pattern, holder):
    mox, fn, args, kwargs = traced("control_flow")
    with pytest.raises(yax.errors.CannotComeOut) as e:
        yax.capture(pattern, mox, *args)
    assert (e.value.tool, e.value.pattern, e.value.holder) == ("capture", pattern, holder)


# -- patching -------------------------------------------------------------------------------

def test_patch_with_values_from_another_run_restores_that_run():
    mox, fn, (params, ids), kwargs = traced("transformer")
    clean, corrupt = ids, ids.at[:, 3].set(7)
    pattern = '//module_call[@path="Transformer/Block_0"]'
    _, cache = yax.capture(pattern, mox, params, clean, **kwargs)
    patched = yax.patch(pattern, mox)
    # Block_1 reads only Block_0's output and the mask: patching it whole gives the clean run.
    close(patched(cache, params, corrupt, **kwargs), fn(params, clean, **kwargs), atol=1e-5)
    # one position only, by hand: Block_0's output at position 3 replaced through an interceptor
    one = {k: v.at[:, :3].set(yax.capture(pattern, mox, params, corrupt, **kwargs)[1][k][:, :3]) for k, v in cache.items()}

    def swap(next_fun, args, kw, context):
        out = next_fun(*args, **kw)
        if context.module.path == ("Block_0",) and context.method_name == "__call__":
            out = out.at[:, 3:].set(cache["Transformer/Block_0"][:, 3:])
        return out

    with nn.intercept_methods(swap):
        want = fn(params, corrupt, **kwargs)
    close(patched(one, params, corrupt, **kwargs), want, atol=1e-5)


def test_patch_with_a_function_matches_a_hand_modified_model():
    mox, fn, (params, ids), kwargs = traced("transformer")
    steer = yax.patch('//module_call[@path="Transformer/Block_0"]', mox, lambda path, h, v: h + v)
    v = jax.random.normal(KEY, (32,))

    def add(next_fun, args, kw, context):
        out = next_fun(*args, **kw)
        return out + v if context.module.path == ("Block_0",) and context.method_name == "__call__" else out

    with nn.intercept_methods(add):
        want = fn(params, ids, **kwargs)
    close(steer(v, params, ids, **kwargs), want, atol=1e-5)
    ablate = yax.patch("//activation[@name='gelu']", mox, lambda path, h: jnp.zeros_like(h))  # two parameters
    assert ablate(None, params, ids, **kwargs).shape == (2, 8, 64)


def test_patch_nnx_and_inside_a_scan_with_the_step():
    model, args, _ = NNX_CASES["transformer_scan"]()
    mox = yax.make_mox(model)(*args)
    state = nnx.state(model)
    v = jax.random.normal(KEY, (32,))

    def at_step_1(path, h, v, step):
        (i,) = step
        return jnp.where(i == 1, h + v, h)

    (out, _) = yax.patch('//module_call[@path="ScanTransformer/blocks"]', mox, at_step_1)(v, state, *args)
    graphdef, blocks = nnx.split(model.blocks)
    h = model.embed(*args)
    for i in range(3):
        h = nnx.merge(graphdef, jax.tree_util.tree_map(lambda a, i=i: a[i], blocks))(h)
        h = h + v if i == 1 else h
    close(out, model.embed.attend(model.norm(h)), atol=1e-5)
    # arrays for a node in a scan are stacked along the scan axis, as capture gives them, and replace
    # its output at every step: here the last one gets `v` added
    _, values = yax.capture('//module_call[@path="ScanTransformer/blocks"]', mox, state, *args)
    stacked = values["ScanTransformer/blocks"].at[2].add(v)
    (out2, _) = yax.patch('//module_call[@path="ScanTransformer/blocks"]', mox)(
        {"ScanTransformer/blocks": stacked}, state, *args)
    h = model.embed(*args)
    for i in range(3):
        h = nnx.merge(graphdef, jax.tree_util.tree_map(lambda a, i=i: a[i], blocks))(h)
    close(out2, model.embed.attend(model.norm(h + v)), atol=1e-5)


def test_a_patch_sweep_compiles_once():
    mox, fn, (params, ids), kwargs = traced("transformer")
    pattern = '//module_call[@type="Block"]'
    _, cache = yax.capture(pattern, mox, params, ids, **kwargs)
    patched = yax.patch(pattern, mox)
    outs = [patched({k: v * s for k, v in cache.items()}, params, ids, **kwargs) for s in (0.5, 1.0, 2.0)]
    close(outs[1], fn(params, ids, **kwargs), atol=1e-5)
    steer = yax.patch(pattern, mox, lambda path, h, a: h * a)
    for s in (0.5, 1.0, 2.0):
        steer(jnp.float32(s), params, ids, **kwargs)
    progs = [p for k, p in capture_programs(mox).items() if k[0] == pattern and k[2] in ("arrays", "fn")]
    assert [p.traces for p in progs] == [1, 1]


def test_wrong_patches_are_refused_before_anything_runs():
    fn, (params, ids), kwargs = CASES["transformer"]()
    mox = yax.make_mox(fn)(params, ids, **kwargs)  # its own: no program of it has run
    patched = yax.patch('//module_call[@path="Transformer/Block_0"]', mox)
    with pytest.raises(yax.errors.PatchDoesNotFit) as e:
        patched({"Transformer/Block_0": jnp.zeros((2, 8, 16))}, params, ids, **kwargs)
    assert (e.value.key, e.value.kind, e.value.expected, e.value.found) == (
        "Transformer/Block_0", "type", "f32[2,8,32]", "f32[2,8,16]")
    with pytest.raises(yax.errors.PatchDoesNotFit) as e:
        patched({"Transformer/Block_0": jnp.zeros((2, 8, 32), jnp.bfloat16)}, params, ids, **kwargs)
    assert (e.value.expected, e.value.found) == ("f32[2,8,32]", "bf16[2,8,32]")
    with pytest.raises(yax.errors.PatchDoesNotFit) as e:
        patched({"Transformer/Block_1": jnp.zeros((2, 8, 32))}, params, ids, **kwargs)
    assert (e.value.key, e.value.kind) == ("Transformer/Block_1", "key")
    with pytest.raises(yax.errors.WrongType) as e:
        patched(jnp.zeros((2, 8, 32)), params, ids, **kwargs)
    assert (e.value.argument, e.value.found) == ("values", "ArrayImpl")
    assert [p.traces for p in capture_programs(mox).values()] == [0]
    scan_mox, _, (sp, sids), _ = traced("transformer_scan")
    with pytest.raises(yax.errors.PatchDoesNotFit) as e:
        yax.patch('//module_call[@path="Transformer/layers/Block_0"]', scan_mox)(
            {"Transformer/layers/Block_0": jnp.zeros((2, 8, 32))}, sp, sids)
    assert e.value.found == "f32[2,8,32]" and "inside a scan, so its values are stacked" in str(e.value)
    bad = yax.patch('//module_call[@path="Transformer/Block_0"]', mox, lambda path, h: h[..., :4])
    with pytest.raises(yax.errors.PatchDoesNotFit) as e:
        bad(None, params, ids, **kwargs)
    assert (e.value.key, e.value.found) == ("Transformer/Block_0", "f32[2,8,4]")


# -- the first non-finite value -----------------------------------------------------------------

class Log(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4)(x)
        return nn.Dense(2)(jnp.log(h))


class Step(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        scale = self.param("scale", nn.initializers.ones, ())
        h = jnp.tanh(nn.Dense(x.shape[-1])(x))
        return h + jnp.sqrt(scale * jnp.ones_like(h)), None


class ScanNaN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x, _ = nn.scan(Step, variable_axes={"params": 0}, split_rngs={"params": True}, length=4)(name="layers")(x, None)
        return nn.Dense(2)(x)


def test_first_nonfinite_agrees_with_jax_debug_nans():
    m, x = Log(), jnp.linspace(-1, 1, 6).reshape(2, 3)
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    found = yax.first_nonfinite(mox, params, x)
    with jax.debug_nans(True), pytest.raises(FloatingPointError) as e:
        m.apply(params, x)
    assert f"encountered in {found.equation.name}" in str(e.value)
    assert (found.equation.name, found.path, found.step, found.call.path) == ("log", "Log", (), "Log")
    assert found.inputs[0].min < 0 and found.output.nan > 0
    assert "The first non-finite value comes from `log` in `Log`" in str(found) and ">>>" in str(found)
    with jax.debug_nans(True):  # switched off while it runs: still an answer, not an exception
        assert yax.first_nonfinite(mox, params, x).equation is found.equation


def test_first_nonfinite_inside_a_scan_names_the_step():
    m, x = ScanNaN(), jnp.ones((2, 3))
    params = m.init(KEY, x)
    params["params"]["layers"]["scale"] = jnp.array([1.0, 1.0, -1.0, 1.0])
    mox = yax.make_mox(m.apply)(params, x)
    found = yax.first_nonfinite(mox, params, x)
    assert (found.equation.name, found.path, found.step) == ("sqrt", "ScanNaN/layers", (2,))
    assert found.inputs[0].max == -1.0 and found.output.nan == 6
    assert found.call_inputs[0].nonfinite == 0  # the layer received finite values at step 2
    with jax.debug_nans(True), pytest.raises(FloatingPointError, match="encountered in scan"):
        m.apply(params, x)  # jax_debug_nans stops at the scan as a whole


def test_first_nonfinite_nnx_scan_inf_arguments_and_none():
    model, args, _ = NNX_CASES["transformer_scan"]()
    mox = yax.make_mox(model)(*args)
    state = nnx.state(model)
    assert yax.first_nonfinite(mox, state, *args) is None
    # the second layer's fc1 kernel so large that its product overflows to Inf
    bad = jax.tree_util.tree_map_with_path(
        lambda kp, a: a.at[1].set(3e38) if "fc1" in jax.tree_util.keystr(kp) and "kernel" in
        jax.tree_util.keystr(kp) else a, state)
    found = yax.first_nonfinite(mox, bad, *args)
    assert found.path == "ScanTransformer/blocks/fc1" and found.step == (1,) and found.output.nonfinite > 0
    assert found.equation.name == "dot_general" and found.inputs[0].nonfinite == 0
    # an argument holding a NaN is named as the user wrote it
    mox2, fn, (params, x), _ = traced("mlp")
    got = yax.first_nonfinite(mox2, params, x.at[0, 0].set(jnp.nan))
    assert got.equation is None and got.path == "args[1]" and got.output.nan == 1


def test_first_nonfinite_compiles_once():
    m, x = Log(), jnp.linspace(-1, 1, 6).reshape(2, 3)
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    for s in (1.0, 2.0, 3.0):
        yax.first_nonfinite(mox, params, s * x)
    from yax._calls import kept  # the flagging program is kept with the MoX

    assert kept(mox, "nonfinite.search").traces == 1


# -- the recipes (notebooks/inside.ipynb shows them) ---------------------------------------------

def test_recipe_activation_patching_heatmap():
    _, fn, (params, _), kwargs = traced("transformer")
    clean = jnp.array([[5, 9, 13, 21, 33, 2, 8, 40]])
    corrupt = clean.at[0, 3].set(60)
    mox = yax.make_mox(fn)(params, clean, **kwargs)
    layers = ["Transformer/embed", "Transformer/Block_0", "Transformer/Block_1"]
    pattern = " | ".join(f'//module_call[@path="{p}"][@method="__call__"]' for p in layers)

    def logit_diff(logits):
        return logits[0, -1, 11] - logits[0, -1, 12]

    clean_out, clean_vals = yax.capture(pattern, mox, params, clean, **kwargs)
    lo, hi = logit_diff(fn(params, corrupt, **kwargs)), logit_diff(clean_out)

    def restore(path, h, a):  # the clean value at one layer and position, chosen by `a`
        hit = (a["layer"] == layers.index(path)) & (jnp.arange(h.shape[1]) == a["pos"])[None, :, None]
        return jnp.where(hit, a["clean"][path], h)

    patched = yax.patch(pattern, mox, restore)
    grid = np.zeros((len(layers), clean.shape[1]))
    for i in range(len(layers)):
        for pos in range(clean.shape[1]):
            out = patched({"clean": clean_vals, "layer": i, "pos": pos}, params, corrupt, **kwargs)
            grid[i, pos] = (logit_diff(out) - lo) / (hi - lo)
    np.testing.assert_allclose(grid[0, 3], 1.0, atol=1e-4)       # the corrupted token's embedding: all of it
    np.testing.assert_allclose(grid[0, :3], 0.0, atol=1e-4)      # earlier positions never saw it
    np.testing.assert_allclose(grid[-1, -1], 1.0, atol=1e-4)     # the last layer's last position: all of it
    np.testing.assert_allclose(grid[-1, :-1], 0.0, atol=1e-4)
    assert [p.traces for k, p in capture_programs(mox).items() if k[2] == "fn"] == [1]  # 24 runs, one compile


def test_recipe_dead_relu_fraction_per_layer():
    class ConvNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            for f in (8, 16, 16):
                x = nn.relu(nn.Conv(f, (3, 3))(x))
            return nn.Dense(10)(x.mean((1, 2)))

    m, x = ConvNet(), jax.random.normal(KEY, (4, 8, 8, 3))
    params = m.init(KEY, x)
    params["params"]["Conv_1"]["bias"] = params["params"]["Conv_1"]["bias"].at[:5].set(-100.0)  # 5 dead units
    mox = yax.make_mox(m.apply)(params, x)
    _, acts = yax.capture('//activation[@name="relu"]', mox, params, x)
    dead = {k: float((a == 0).all(axis=(0, 1, 2)).mean()) for k, a in acts.items()}
    assert list(dead) == ["ConvNet/relu", "ConvNet/relu#2", "ConvNet/relu#3"]
    assert dead["ConvNet/relu#2"] >= 5 / 16
    h = nn.relu(nn.Conv(8, (3, 3)).apply({"params": params["params"]["Conv_0"]}, x))
    h = nn.relu(nn.Conv(16, (3, 3)).apply({"params": params["params"]["Conv_1"]}, h))
    assert dead["ConvNet/relu#2"] == float((h == 0).all(axis=(0, 1, 2)).mean())


def test_capture_counts_by_key_mirror_compare_boundaries():
    mox, fn, args, kwargs = traced("transformer")
    _, values = yax.capture("//module_call | //activation", mox, *args, **kwargs)
    assert set(yax.internal.call_keys(mox)) - {k for k in yax.internal.call_keys(mox) if "." in k} <= set(values)
    assert collections.Counter(k.split("#")[0] for k in values)["Transformer/Block_0/SelfAttention_0/softmax"] == 1
