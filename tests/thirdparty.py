"""A zoo of models nobody here wrote: Hugging Face `transformers` 4.x Flax classes
built from tiny configs (2 layers, width 32, vocabulary 100, 8 tokens) with
random weights (``_do_init=True``, seed 0; nothing is downloaded), and a
Transformer stacked the way large JAX codebases stack it (``nn.scan(nn.remat(
layer))``, `models.ScannedTransformer`).

Each model is called the two ways users call it:

- ``wrapper``: the Hugging Face object with ``params=`` (the bare parameter
  dict, no ``"params"`` key), e.g. ``lambda params, ids: model(input_ids=ids,
  params=params).logits``;
- ``module``: ``model.module.apply({"params": params}, *inputs,
  deterministic=True)`` with the module's own positional arguments.

``case(name)`` builds a `Case`: ``fn(*args, **kwargs)`` is the original, with
the parameters first in ``args``; ``swapped`` is the same call with the
activation ``row.act`` patched by hand to ``jax.nn.<row.swap>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import transformers
from models import KEY, ScannedTransformer

IDS = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 7 + 3) % 100
DEC = (IDS[:, ::-1] + 5) % 100  # decoder inputs of the encoder-decoder
ONES = jnp.ones_like(IDS)
POS = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
PIXELS = jax.random.normal(jax.random.key(1), (2, 3, 16, 16))  # NCHW, as the wrappers take them
NHWC = PIXELS.transpose(0, 2, 3, 1)  # as their modules take them

LAYERS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
TEXT = dict(LAYERS, vocab_size=100, max_position_embeddings=16)


def _qv(q: str, v: str, type: str = "Dense") -> str:
    return f'//module_call[@type="{type}"][@name="{q}" or @name="{v}"]'


@dataclasses.dataclass(frozen=True)
class Row:
    """One zoo model: how to build and call it, and where its parts are."""

    model: str  # a transformers Flax class ("" for `models.ScannedTransformer`)
    config: dict  # its config's arguments
    module_inputs: tuple  # the positional arguments of ``model.module.__call__``
    wrapper_inputs: dict = dataclasses.field(default_factory=lambda: {"input_ids": IDS})  # keywords of the wrapper
    qv: str = _qv("query", "value")  # the attention's q/v projections (of a CNN: its convolutions)
    act: str = "gelu"  # the activation's node name, its key in the model's `ACT2FN` table
    swap: str = "relu"  # the activation the swap test puts in its place (a `jax.nn` name)
    lora: str | None = None  # LoRA's targets where they are not `qv`
    init: dict = dataclasses.field(default_factory=dict)  # more arguments of the model class


ZOO: dict[str, Row] = {
    "bert": Row("FlaxBertForMaskedLM", TEXT, (IDS, ONES, 0 * IDS, POS, None)),
    "bert_remat": Row("FlaxBertForMaskedLM", TEXT, (IDS, ONES, 0 * IDS, POS, None),  # each layer under nn.remat
                      init={"gradient_checkpointing": True}),
    "gpt2": Row("FlaxGPT2LMHeadModel", dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16),
                (IDS, ONES, POS), qv='//module_call[@type="FlaxConv1D"][@name="c_attn"]', act="gelu_new"),  # tied embeddings; q, k and v in one FlaxConv1D (a transposed kernel)
    "bart": Row("FlaxBartForConditionalGeneration",
                dict(vocab_size=100, d_model=32, max_position_embeddings=16, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64),
                (IDS, ONES, DEC, ONES, POS, POS), {"input_ids": IDS, "decoder_input_ids": DEC},
                _qv("q_proj", "v_proj")),
    "llama": Row("FlaxLlamaForCausalLM", dict(TEXT, num_key_value_heads=2), (IDS, ONES, POS),  # GQA + RoPE
                 qv=_qv("q_proj", "v_proj"), act="silu"),
    "resnet": Row("FlaxResNetForImageClassification",  # BatchNorm: the variables hold `batch_stats` too
                  dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=10),
                  (NHWC,), {"pixel_values": PIXELS}, '//module_call[@type="Conv"]', "relu", "silu",
                  lora='//module_call[@type="Dense"]', init={"input_shape": (1, 16, 16, 3)}),
    "albert": Row("FlaxAlbertForMaskedLM",  # one layer's weights shared by both layers
                  dict(TEXT, embedding_size=16, num_hidden_groups=1, inner_group_num=1), (IDS, ONES, 0 * IDS, POS),
                  act="gelu_new"),
    "vit": Row("FlaxViTForImageClassification",
               dict(LAYERS, image_size=16, patch_size=4, num_channels=3, num_labels=10), (NHWC,),
               {"pixel_values": PIXELS}),
    "scanned": Row("", {}, (IDS,), qv=_qv("query", "value", "DenseGeneral")),
}
STYLES = ("wrapper", "module")
CASES = [f"{family}-{style}" for family in ZOO for style in STYLES]


def row(name: str) -> Row:
    return ZOO[name.rsplit("-", 1)[0]]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable  # the original: ``fn(*args, **kwargs)``
    args: tuple  # the parameters (wrapper) or variables (module) first, then the inputs
    kwargs: dict
    swapped: Callable  # ``fn`` with ``row.act`` patched to ``jax.nn.<row.swap>`` by hand
    row: Row


@functools.cache
def _hf(family: str) -> Any:
    r = ZOO[family]
    cls = getattr(transformers, r.model)
    return cls(cls.config_class(**r.config), seed=0, dtype=jnp.float32, _do_init=True, **r.init)


@contextlib.contextmanager
def _act2fn(family: str):
    """The model's ``ACT2FN`` table, which its modules read in ``setup``, with
    ``row.act`` pointing at ``jax.nn.<row.swap>``."""
    r = ZOO[family]
    home = sys.modules[getattr(transformers, r.model).__module__]
    table = home.ACT2FN
    home.ACT2FN = {**table, r.act: getattr(jax.nn, r.swap)}
    try:
        yield
    finally:
        home.ACT2FN = table


def _call(family: str, style: str, act: Callable | None = None) -> tuple[Callable, dict]:
    """The call of one style and its keyword arguments (`ScannedTransformer`'s with activation ``act``)."""
    if family == "scanned":
        model = ScannedTransformer(act=act) if act else ScannedTransformer()
        if style == "module":
            return model.apply, {}
        return lambda params, ids: model.apply({"params": params}, ids), {}
    model = _hf(family)
    if style == "module":
        return model.module.apply, {"deterministic": True}
    names = list(ZOO[family].wrapper_inputs)

    def forward(params, *inputs):
        return model(**dict(zip(names, inputs)), params=params).logits

    return forward, {}


def _swapped(family: str, style: str) -> Callable:
    if family == "scanned":
        return _call(family, style, getattr(jax.nn, ZOO[family].swap))[0]
    fn = _call(family, style)[0]

    def swapped(*args, **kwargs):
        with _act2fn(family):
            return fn(*args, **kwargs)

    return swapped


@functools.cache
def case(name: str) -> Case:
    family, style = name.rsplit("-", 1)
    r = ZOO[family]
    params = ScannedTransformer().init(KEY, IDS)["params"] if family == "scanned" else _hf(family).params
    fn, kwargs = _call(family, style)
    if style == "module":
        variables = params if "batch_stats" in params else {"params": params}  # ResNet's hold both already
        args = (variables, *r.module_inputs)
    else:
        args = (params, *r.wrapper_inputs.values())
    return Case(name, fn, args, kwargs, _swapped(family, style), r)
