"""`yax.Reference` and `compare` against it, on ports nobody here wrote (tests/ports.py):
Hugging Face's PyTorch GPT-2, BERT, Llama and ResNet recorded with forward hooks
and compared with their Flax classes holding the same weights. A faithful port is
allclose at every matched boundary and weight; a planted port bug is found first
at the module where it starts. The oracle on generated models is
tests/oracle/test_reference_oracle.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from ports import RESNET_NAMES, port

import yax
from yax.errors import YaxInputError

EPS = float(np.finfo(np.float32).eps)

#: family -> (calls matched, calls only in the model, modules only in the reference, weights matched)
FAITHFUL = {"gpt2": (27, 15, 3, 29), "bert": (46, 13, 3, 44), "llama": (28, 16, 3, 21), "resnet": (29, 11, 11, 32)}


@pytest.mark.parametrize("family", list(FAITHFUL))
def test_a_faithful_port_is_allclose_at_every_matched_boundary_and_weight(family):
    p = port(family)
    c = yax.compare(p.reference, p.mox, p.params, *p.inputs, names=RESNET_NAMES if family == "resnet" else None)
    m = c.matching
    assert (len(m.calls), len(m.only_model), len(m.only_reference), len(m.weights)) == FAITHFUL[family], m
    assert c.allclose and c.first_divergence is None and not c.unavailable, c
    assert all(s.allclose for s in c.boundaries.values()) and all(s.allclose for s in c.weights.values())
    assert max(s.rel for s in c.boundaries.values()) < 32 * EPS  # the faithful differ by rounding only
    assert not m.only_model_weights, m.only_model_weights
    # the model's output against the PyTorch model's logits, measured by hand
    (name, s), = c.outputs.items()
    x, y = (np.asarray(a, np.float64) for a in c.arrays[name])
    assert s.max_abs == pytest.approx(float(np.max(np.abs(x - y))), rel=1e-6, abs=1e-12)
    assert np.array_equal(c.arrays[name][0], p.reference.outputs[""][0].astype(np.float32))


def test_the_matching_reads_pytorch_names_in_the_flax_layout():
    c = yax.compare(port("gpt2").reference, (p := port("gpt2")).mox, p.params, *p.inputs)
    m = c.matching
    assert m.calls["FlaxGPT2LMHeadModule/transformer/h/1/attn/c_attn"] == "transformer.h.1.attn.c_attn"
    assert m.only_reference == ("transformer.drop", "transformer.h.0.mlp.act", "transformer.h.1.mlp.act")
    assert m.weights["transformer/h/0/attn/c_attn/kernel"] == "transformer.h.0.attn.c_attn.weight"
    assert m.weights["transformer/wte/embedding"] == "transformer.wte.weight"
    # GPT-2's Conv1D stores (in, out) and FlaxConv1D (out, in): said, and compared transposed; the
    # square c_proj (32, 32) is read as the other kernels are
    assert "(out, in) ↔ (in, out)" in m.layouts["transformer/h/0/attn/c_attn/kernel"]
    assert "square" in m.layouts["transformer/h/0/attn/c_proj/kernel"]
    # position embeddings: (1, 8, 32) in PyTorch against (2, 8, 32): broadcast, and said
    assert "broadcast along axes (0,)" in m.layouts["FlaxGPT2LMHeadModule/transformer/wpe"]
    assert "matched with torch GPT2LMHeadModel: 27 calls" in repr(c)


def test_a_square_kernel_left_untransposed_by_a_port_is_found():
    p = port("gpt2")
    bad = jax.tree_util.tree_map(lambda a: a, p.params)
    w = bad["transformer"]["h"]["1"]["attn"]["c_proj"]["kernel"]
    bad["transformer"]["h"]["1"]["attn"]["c_proj"]["kernel"] = w.T  # the port forgot the transpose
    c = yax.compare(p.reference, p.mox, bad, *p.inputs)
    assert [k for k, s in c.weights.items() if not s.allclose] == ["transformer/h/1/attn/c_proj/kernel"]
    assert c.first_divergence == "FlaxGPT2LMHeadModule/transformer/h/1/attn/c_proj"


@pytest.mark.parametrize("family, bug, where, names", [
    ("gpt2", "layernorm_eps", "FlaxGPT2LMHeadModule/transformer/h/0/ln_1", None),
    # GPT-2's activation is `mlp.act` in PyTorch and named by its function in Flax: mapped by a pattern
    ("gpt2", "gelu_erf", "FlaxGPT2LMHeadModule/transformer/h/0/mlp/gelu", [(r"mlp\.act$", "mlp.gelu")]),
    ("bert", "layernorm_eps", "FlaxBertForMaskedLMModule/bert/embeddings/LayerNorm", None),
    ("bert", "gelu_tanh", "FlaxBertForMaskedLMModule/bert/encoder/layer/0/intermediate", None),
    # RoPE is applied inside the attention, between its projections: q/k/v agree, o_proj does not
    ("llama", "rope_interleaved", "FlaxLlamaForCausalLMModule/model/layers/0/self_attn/o_proj", None),
])
def test_a_planted_port_bug_is_found_first_where_it_starts(family, bug, where, names):
    p = port(family, bug)
    c = yax.compare(p.reference, p.mox, p.params, *p.inputs, names=names)
    assert c.first_divergence == where, c
    assert not c.allclose
    keys = list(c.boundaries)
    assert all(c.boundaries[k].allclose for k in keys[:keys.index(where)]), c  # agreed before it
    assert c.boundaries[where].rel > 100 * EPS
    assert all(s.allclose for s in c.weights.values())  # the weights were ported right
    assert where in c.verdict and "↔" in c.label(where)


def test_rope_bug_leaves_the_projections_before_it_allclose():
    p = port("llama", "rope_interleaved")
    c = yax.compare(p.reference, p.mox, p.params, *p.inputs)
    attn = "FlaxLlamaForCausalLMModule/model/layers/0/self_attn/"
    assert all(c.boundaries[attn + n].allclose for n in ("q_proj", "k_proj", "v_proj"))


def test_a_resnet_is_compared_across_nchw_and_nhwc():
    p = port("resnet")
    c = yax.compare(p.mox, p.reference, p.params, *p.inputs, names=RESNET_NAMES)  # either order
    lay = c.matching.layouts
    conv = "FlaxResNetForImageClassificationModule/resnet/embedder/embedder/convolution"
    # (2, 8, 8, 8) fits as stored and transposed: read as the other convolutions' outputs are
    assert "NCHW ↔ NHWC" in lay[conv] and c.boundaries[conv].allclose
    assert "(out, in, H, W) ↔ (H, W, in, out)" in lay["params/resnet/embedder/embedder/convolution/kernel"]
    assert c.matching.weights["batch_stats/resnet/embedder/embedder/normalization/mean"] == \
        "resnet.embedder.embedder.normalization.running_mean"
    # recorded channels last already (another JAX implementation): compared as stored, nothing said
    nhwc = yax.Reference({"resnet.embedder.embedder.convolution": np.transpose(
        p.reference.outputs["resnet.embedder.embedder.convolution"][0], (0, 2, 3, 1))})
    c = yax.compare(nhwc, p.mox, p.params, *p.inputs)
    assert c.boundaries[conv].allclose and conv not in c.matching.layouts


def test_a_reference_travels_through_a_file_exactly(tmp_path):
    ref = port("gpt2").reference
    bf = yax.Reference({"a": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16) / 3,
                        "b#2": (np.ones(2), np.zeros((1,), np.int32))}, inputs={"a": np.ones(3)},
                       weights={"w": np.eye(2)}, source="mixed")
    for r in (ref, bf):
        for suffix in ("npz", "safetensors"):
            path = tmp_path / f"r.{suffix}"
            r.save(path)
            back = yax.Reference.load(path)
            assert back.source == r.source and list(back.outputs) == list(r.outputs)
            for part in ("outputs", "inputs"):
                for k, v in getattr(r, part).items():
                    w = getattr(back, part)[k]
                    assert [a.dtype for a in w] == [a.dtype for a in v]
                    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(v, w)), (k, suffix)
            assert {k: v.tobytes() for k, v in back.weights.items()} == {k: v.tobytes() for k, v in r.weights.items()}


def test_a_plain_file_of_arrays_is_a_reference_keyed_by_module(tmp_path):
    from safetensors.numpy import save_file

    p = port("gpt2")
    save_file({k: v[0] for k, v in p.reference.outputs.items() if k.startswith("transformer.h.0.attn.c_")},
              str(tmp_path / "mine.safetensors"))
    ref = yax.Reference.load(tmp_path / "mine.safetensors")
    c = yax.compare(ref, p.mox, p.params, *p.inputs)
    assert sorted(c.matching.calls.values()) == ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj"]
    assert c.outputs == {} and c.weights is None and c.allclose


def test_names_as_a_dict_a_function_and_patterns():
    p = port("gpt2")
    key = "FlaxGPT2LMHeadModule/transformer/h/0/mlp/gelu_new"
    for names in ({"transformer.h.0.mlp.act": key}, lambda r: key if r == "transformer.h.0.mlp.act" else None,
                  [(r"^transformer\.h\.0\.mlp\.act$", key)], [(r"mlp\.act$", "mlp.gelu_new")]):
        c = yax.compare(p.reference, p.mox, p.params, *p.inputs, names=names)
        assert c.matching.calls[key] == "transformer.h.0.mlp.act" and c.boundaries[key].allclose
    with pytest.raises(yax.errors.CannotCompare) as e:
        yax.compare(p.reference, p.mox, p.params, *p.inputs, names={"transformer.h.0.mlp.act": "Flax/h/0/mlp/gelu"})
    assert (e.value.problem, e.value.found) == ("unmatched", ("transformer.h.0.mlp.act", "Flax/h/0/mlp/gelu"))
    with pytest.raises(yax.errors.WrongType) as e:
        yax.compare(p.reference, p.mox, p.params, *p.inputs, names=3)
    assert (e.value.argument, e.value.found) == ("names", "int")
    with pytest.raises(yax.errors.CannotCompare) as e:
        yax.compare(p.reference, p.mox, p.params, *p.inputs, grad_of=jnp.sum)
    assert (e.value.tool, e.value.problem, e.value.found) == ("compare", "options", ["grad_of"])


def test_outputs_that_do_not_pair_are_said_not_compared():
    p = port("gpt2")
    ref = yax.Reference({"transformer.h.0.attn.c_attn": np.zeros((2, 8, 95), np.float32)})
    c = yax.compare(ref, p.mox, p.params, *p.inputs)
    why = c.unavailable["FlaxGPT2LMHeadModule/transformer/h/0/attn/c_attn"]
    assert why == ("its outputs are float32[2, 8, 96] in the model but float32[2, 8, 95] in the reference's "
                   "`transformer.h.0.attn.c_attn`: no pair of equal shapes, nor of a known layout")
    assert not c.boundaries and c.first_divergence is None


def test_tolerances_follow_the_dtypes():
    bf, f32 = float(jnp.finfo(jnp.bfloat16).eps), float(jnp.finfo(jnp.float32).eps)
    assert yax.port_tolerances(jnp.float32) == (64 * f32, 64 * f32)
    assert yax.port_tolerances(jnp.float32, jnp.bfloat16) == (2 * bf, 2 * bf)
    assert yax.port_tolerances(jnp.float16)[0] == 2 * float(jnp.finfo(jnp.float16).eps)
    p = port("gpt2")
    key = "FlaxGPT2LMHeadModule/transformer/h/0/mlp/c_fc"
    v = p.reference.outputs["transformer.h.0.mlp.c_fc"][0]
    as_bf16 = yax.Reference({"transformer.h.0.mlp.c_fc": v.astype(ml_dtypes.bfloat16)})
    c = yax.compare(as_bf16, p.mox, p.params, *p.inputs)  # a bfloat16 run of the original: within its epsilon
    assert c.boundaries[key].allclose
    off = yax.Reference({"transformer.h.0.mlp.c_fc": (v * (1 + 2 ** -5)).astype(ml_dtypes.bfloat16)})
    assert not yax.compare(off, p.mox, p.params, *p.inputs).boundaries[key].allclose  # 3 % off is not
    assert not yax.compare(yax.Reference({"transformer.h.0.mlp.c_fc": v.astype(ml_dtypes.bfloat16)}), p.mox,
                           p.params, *p.inputs, rtol=0.0, atol=0.0).boundaries[key].allclose


def test_from_torch_records_every_call_and_removes_its_hooks():
    lin = torch.nn.Linear(3, 2)
    seq = torch.nn.Sequential(lin, torch.nn.ReLU())
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f = lin

        def forward(self, x):
            return self.f(self.f(torch.ones(2, 2) @ torch.ones(2, 3)) @ torch.ones(2, 3))

    ref = yax.Reference.from_torch(Twice(), torch.ones(1), with_inputs=True)
    assert list(ref.outputs) == ["f", "f#2", ""] and ref.inputs["f#2"][0].shape == (2, 3)
    assert not lin._forward_hooks
    x = torch.randn(4, 3)
    ref = yax.Reference.from_torch(seq, x)
    assert list(ref.outputs) == ["0", "1", ""] and set(ref.weights) == {"0.weight", "0.bias"}
    np.testing.assert_array_equal(ref.outputs["1"][0], seq(x).detach().numpy())
    with pytest.raises(yax.errors.WrongType) as e:
        yax.Reference.from_torch(lambda x: x, x)
    assert (e.value.argument, e.value.found) == ("module", "function")
    with pytest.raises(yax.errors.BadArgument) as e:
        ref.save("r.pt")
    assert isinstance(e.value, YaxInputError) and (e.value.argument, e.value.value) == ("path", "r.pt")
    with pytest.raises(AttributeError, match="read-only"):
        ref.source = "x"


def test_n_ways_each_model_against_the_first_aligned_by_call():
    import functools

    p, bug = port("gpt2"), port("gpt2", "layernorm_eps")
    erf = yax.sub('//activation[@name="gelu_new"]', functools.partial(jax.nn.gelu, approximate=False), p.mox)
    cs = yax.compare_all({"pytorch": p.reference, "flax": p.mox, "eps 1e-2": bug.mox, "erf gelu": erf},
                         p.params, *p.inputs)
    h = "FlaxGPT2LMHeadModule/transformer/h/"
    assert cs.names == ("pytorch", "flax", "eps 1e-2", "erf gelu")
    assert cs.first_divergence == {"flax": None, "eps 1e-2": h + "0/ln_1", "erf gelu": h + "0/mlp/c_proj"}
    assert not cs.allclose and cs.against_first["flax"].allclose
    table = cs.table()
    assert table[h + "0/ln_1"]["eps 1e-2"] > 1e-3 and table[h + "0/ln_1"]["flax"] < 32 * EPS
    assert h + "0/mlp/gelu_new" not in table  # PyTorch's `mlp.act` is not matched by name: no row
    # each is `compare` of the two, exactly
    alone = yax.compare(p.reference, bug.mox, p.params, *p.inputs)
    assert cs.against_first["eps 1e-2"].to_dict() == alone.to_dict()
    assert "eps 1e-2" in repr(cs) and "*" in repr(cs)
    # a MoX first; a model with its own parameters
    doubled = jax.tree_util.tree_map(lambda a: a * 2, p.params)
    cs = yax.compare_all([p.mox, (p.mox, doubled), p.reference], p.params, *p.inputs)
    assert cs.names == ("0", "1", "torch GPT2LMHeadModel")
    assert cs.first_divergence["1"] == "FlaxGPT2LMHeadModule/transformer/wte"
    assert cs.against_first["torch GPT2LMHeadModel"].allclose
    with pytest.raises(yax.errors.CannotCompare) as e:
        yax.compare_all([p.mox], p.params, *p.inputs)
    assert (e.value.tool, e.value.problem, e.value.found) == ("compare_all", "names", ["0"])
    with pytest.raises(yax.errors.CannotCompare) as e:
        yax.compare_all({"a": p.reference, "b": p.reference}, p.params, *p.inputs)
    assert (e.value.problem, e.value.found) == ("two references", ["a", "b"])


def test_a_scanned_stack_is_matched_step_by_step_with_numbered_modules():
    from models import KEY, ScannedTransformer

    m = ScannedTransformer()
    ids = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 7 + 3) % 100
    v = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(v, ids)
    out, values = yax.capture("//module_call", mox, v, ids)
    # another implementation with its layers unrolled: `layers.0.attn.query`, `layers.1.attn.query`, …
    recorded = {"": out}
    for k, val in values.items():
        rest = k.split("/", 1)[1] if "/" in k else ""
        if rest.startswith("layers"):
            for s in range(2):
                step = jax.tree_util.tree_map(lambda a, s=s: np.asarray(a)[s], val)
                recorded[rest.replace("layers", f"layers.{s}", 1).replace("/", ".")] = step
        elif rest:
            recorded[rest.replace("/", ".")] = val
    recorded["layers.1.wi"] = recorded["layers.1.wi"] + 0.5  # a port bug in the second layer's up-projection
    c = yax.compare(yax.Reference(recorded), mox, v, ids)
    wi = "ScannedTransformer/layers/wi"
    assert c.matching.calls[wi] == ("layers.0.wi", "layers.1.wi")
    assert c.stacks[wi] == (2,) and [s.allclose for s in c.steps[wi]] == [True, False]
    assert (c.first_divergence, c.first_divergence_step) == (wi, (1,))
    assert c.steps[wi][1].max_abs == pytest.approx(0.5, rel=1e-6)
    assert all(s.allclose for k, s in c.boundaries.items() if k != wi and not k.startswith("ScannedTransformer/layers"))
    # a step named by hand: `key@step`
    named = yax.compare(yax.Reference({"up0": recorded["layers.0.wi"], "up1": recorded["layers.1.wi"]}), mox, v, ids,
                        names={"up0": f"{wi}@0", "up1": f"{wi}@1"})
    assert named.matching.calls == {wi: ("up0", "up1")} and named.first_divergence_step == (1,)
    # one module for a scanned call of two steps: said, not compared at one step only
    one = yax.compare(yax.Reference({"up": recorded["layers.0.wi"]}), mox, v, ids, names={"up": wi})
    assert not one.boundaries and "name one module per step" in one.unavailable[wi]


def test_no_port_check_is_in_the_core_suite():
    """The core suite also runs with the oldest JAX, where PyTorch is not installed and these
    modules are not collected (tests/conftest.py): none of their tests may be marked core."""
    import ast
    import pathlib

    from conftest import TORCH_MODULES

    here = pathlib.Path(__file__).parent
    for name in TORCH_MODULES:
        (path,) = here.rglob(name)
        marks = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)
                 and n.attr == "core" and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"]
        assert not marks, path


def test_nnx_state_is_matched_with_the_reference_weights_and_two_references_are_refused():
    from flax import nnx

    lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(lin)
    pt = torch.nn.Linear(3, 2)
    with torch.no_grad():
        pt.weight.copy_(torch.tensor(np.asarray(lin.kernel.value).T))
        pt.bias.copy_(torch.tensor(np.asarray(lin.bias.value)))
    x = np.ones((4, 3), np.float32)
    ref = yax.Reference.from_torch(pt, torch.tensor(x))
    mox = yax.make_mox(lambda st, x: nnx.merge(graphdef, st)(x))(state, jnp.asarray(x))
    c = yax.compare(ref, mox, state, jnp.asarray(x))
    # the state's paths without nnx's `.value`, as the weights files name them
    assert c.matching.weights == {"kernel": "weight", "bias": "bias"} and c.allclose, c
    with pytest.raises(yax.errors.CannotCompare) as e:
        yax.compare(ref, ref, state, jnp.asarray(x))
    assert (e.value.tool, e.value.problem) == ("compare", "two references")
