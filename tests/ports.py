"""Ports nobody here wrote: Hugging Face's PyTorch GPT-2, BERT, Llama and ResNet
and their Flax classes, with the same weights (the PyTorch model's, converted
in memory by `transformers`' own ``convert_pytorch_state_dict_to_flax``), tiny
configs and random weights (nothing downloaded). A planted port bug changes
the Flax copy only: its config (a LayerNorm epsilon, the GELU) or, for RoPE,
the function its attention reads (``rotate_half``, interleaved instead of halves).

``port(family, bug)`` gives the recorded PyTorch run (`yax.Reference`) and the
Flax model traced with its parameters and inputs. Used by tests/test_reference.py
and bench/bench_port.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers as T
from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax

import yax

#: Weights drawn with this standard deviation (Hugging Face's default, 0.02, leaves
#: pre-activations near 0, where GELU's tanh form and erf form agree to float32's last bit).
INIT = 0.5
IDS = (np.arange(16).reshape(2, 8) * 7 + 3) % 100
PIXELS = np.asarray(jax.random.normal(jax.random.key(1), (2, 3, 16, 16)), np.float32)  # NCHW, as both take them


@dataclasses.dataclass(frozen=True)
class Family:
    config: Any  # the transformers config class
    torch_model: str
    flax_model: str
    kwargs: dict  # the config's arguments
    bugs: dict  # planted bug -> the Flax config's arguments that plant it ({} for a patch)
    inputs: str = "ids"

    def flax_call(self, model: Any) -> Any:
        if self.inputs == "pixels":
            return lambda p, x: model(pixel_values=x, params=p).logits
        return lambda p, ids: model(input_ids=ids, params=p).logits


TEXT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=16, initializer_range=INIT)
FAMILIES = {
    "gpt2": Family(T.GPT2Config, "GPT2LMHeadModel", "FlaxGPT2LMHeadModel",
                   dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16, initializer_range=INIT),
                   {"layernorm_eps": dict(layer_norm_epsilon=1e-2), "gelu_erf": dict(activation_function="gelu")}),
    "bert": Family(T.BertConfig, "BertForMaskedLM", "FlaxBertForMaskedLM", TEXT,
                   {"layernorm_eps": dict(layer_norm_eps=1e-2), "gelu_tanh": dict(hidden_act="gelu_new")}),
    "llama": Family(T.LlamaConfig, "LlamaForCausalLM", "FlaxLlamaForCausalLM", dict(TEXT, num_key_value_heads=2),
                    {"rope_interleaved": {}}),
    "resnet": Family(T.ResNetConfig, "ResNetForImageClassification", "FlaxResNetForImageClassification",
                     dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=10),
                     {}, inputs="pixels"),
}


def _interleaved(x: jax.Array) -> jax.Array:
    """RoPE's rotation of interleaved pairs (GPT-J, Meta's original Llama): (x0, x1) -> (-x1, x0)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


@contextlib.contextmanager
def _planted(family: str, bug: str | None):
    if bug != "rope_interleaved":
        yield
        return
    from transformers.models.llama import modeling_flax_llama as home

    saved = home.rotate_half
    home.rotate_half = _interleaved
    try:
        yield
    finally:
        home.rotate_half = saved


def _converted(family: str, pt: Any, fx: Any) -> Any:
    """The PyTorch model's weights as the Flax model's parameters. Flax's ResNet names its sequential
    layers ``layer/layer_0`` where PyTorch has ``layer.0``: the state dict is renamed first (as
    ``from_pretrained(from_pt=True)`` does), so the conversion finds each tensor's Flax name."""
    state = pt.state_dict()
    if family == "resnet":
        state = {re.sub(r"\.layer\.(\d+)\.", r".layer.layer_\1.", k): v for k, v in state.items()}
    return convert_pytorch_state_dict_to_flax(state, fx)


#: How the ResNet's PyTorch names read in the Flax model's layout (see `_as_flax_names`).
RESNET_NAMES = [(r"\.layer\.(\d+)", r".layer.layer_\1")]


@dataclasses.dataclass(frozen=True)
class Port:
    reference: yax.Reference
    mox: yax.Mox
    params: Any
    inputs: tuple
    torch_model: Any


@functools.cache
def _torch(family: str) -> Any:
    f = FAMILIES[family]
    torch.manual_seed(0)
    return getattr(T, f.torch_model)(f.config(**f.kwargs)).eval()


def port(family: str, bug: str | None = None) -> Port:
    """The PyTorch original recorded, and its Flax port (with ``bug`` planted) traced."""
    f = FAMILIES[family]
    pt = _torch(family)
    fx = getattr(T, f.flax_model)(f.config(**{**f.kwargs, **(f.bugs.get(bug) or {})}), seed=0)
    params = _converted(family, pt, fx)
    if f.inputs == "pixels":
        ref = yax.Reference.from_torch(pt, torch.tensor(PIXELS))
        inputs: tuple = (jnp.asarray(PIXELS),)
    else:
        extra = {} if family == "bert" else {"use_cache": False}
        ref = yax.Reference.from_torch(pt, torch.tensor(IDS), **extra)
        inputs = (jnp.asarray(IDS, jnp.int32),)
    with _planted(family, bug):
        mox = yax.make_mox(f.flax_call(fx))(params, *inputs)
    return Port(ref, mox, params, inputs, pt)
