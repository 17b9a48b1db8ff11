"""A zoo of nnx models of current architectures, written here from scratch in the
style the JAX team uses for its reference implementations (bonsai, the Flax
examples): plain ``nnx.Module`` classes, ``nnx.List`` of blocks, caches as nnx
Variables or as a pytree handed to a jitted ``forward``, RoPE and grouped-query
attention by hand, a selective scan with ``jax.lax.scan``, BatchNorm in train and
eval mode, windowed attention. Tiny configurations, random weights.

Every model takes its activation function as an argument (``act``), so the test
can build the same model, the same weights, with another activation: the
hand-modified model an activation swap is checked against.

`CASES` maps a name to `Case`: how to build the model and enter it, and which
queries find its activation and its linear layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Act = Callable[[jax.Array], jax.Array]


# -- shared pieces ---------------------------------------------------------------------------------

class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6, rngs: nnx.Rngs):
        self.scale = nnx.Param(jnp.ones((dim,)))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def rope(x, positions, base: float = 10_000.0):
    """Rotary embeddings, rotate-half layout: ``x`` is [B, T, H, D], ``positions`` [B, T]."""
    half = x.shape[-1] // 2
    freq = 1.0 / base ** (jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions[..., None].astype(jnp.float32) * freq
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attend(q, k, v, mask):
    """Grouped-query attention: q [B, T, H, D], k and v [B, S, K, D] with H a multiple of K."""
    b, t, h, d = q.shape
    groups = h // k.shape[2]
    q = q.reshape(b, t, k.shape[2], groups, d)
    logits = jnp.einsum("btkgd,bskd->bkgts", q, k) / jnp.sqrt(d).astype(q.dtype)
    logits = jnp.where(mask[:, None, None], logits, jnp.finfo(logits.dtype).min)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, h * d)


def causal(t: int, s: int, offset=0):
    return (jnp.arange(t)[:, None] + offset) >= jnp.arange(s)[None, :]


@dataclasses.dataclass(frozen=True)
class LM:
    vocab: int = 64
    dim: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    hidden: int = 48
    max_len: int = 16
    qk_norm: bool = False


class MLP(nnx.Module):
    """The gated MLP of Llama-style decoders (SwiGLU with ``act=silu``)."""

    def __init__(self, dim: int, hidden: int, act: Act, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(hidden, dim, use_bias=False, rngs=rngs)
        self.act = act

    def __call__(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


# -- 1. a Llama-style decoder whose KV cache lives in the model, as nnx Variables -----------------

class KVCache(nnx.Variable):
    pass


class CachedAttention(nnx.Module):
    def __init__(self, c: LM, batch: int, *, rngs: nnx.Rngs):
        self.c = c
        self.q = nnx.Linear(c.dim, c.heads * c.head_dim, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(c.dim, c.kv_heads * c.head_dim, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(c.dim, c.kv_heads * c.head_dim, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(c.heads * c.head_dim, c.dim, use_bias=False, rngs=rngs)
        shape = (batch, c.max_len, c.kv_heads, c.head_dim)
        self.cache_k, self.cache_v = KVCache(jnp.zeros(shape)), KVCache(jnp.zeros(shape))

    def __call__(self, x, positions, start):
        b, t, _ = x.shape
        c = self.c
        q = rope(self.q(x).reshape(b, t, c.heads, c.head_dim), positions)
        k = rope(self.k(x).reshape(b, t, c.kv_heads, c.head_dim), positions)
        v = self.v(x).reshape(b, t, c.kv_heads, c.head_dim)
        self.cache_k[...] = jax.lax.dynamic_update_slice(self.cache_k[...], k, (0, start, 0, 0))
        self.cache_v[...] = jax.lax.dynamic_update_slice(self.cache_v[...], v, (0, start, 0, 0))
        mask = jnp.broadcast_to(causal(t, c.max_len, start), (b, t, c.max_len))
        return self.o(attend(q, self.cache_k[...], self.cache_v[...], mask))


class LlamaBlock(nnx.Module):
    def __init__(self, c: LM, batch: int, act: Act, *, rngs: nnx.Rngs):
        self.attn_norm, self.mlp_norm = RMSNorm(c.dim, rngs=rngs), RMSNorm(c.dim, rngs=rngs)
        self.attn = CachedAttention(c, batch, rngs=rngs)
        self.mlp = MLP(c.dim, c.hidden, act, rngs=rngs)

    def __call__(self, x, positions, start):
        x = x + self.attn(self.attn_norm(x), positions, start)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nnx.Module):
    def __init__(self, c: LM, batch: int, act: Act = jax.nn.silu, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(c.vocab, c.dim, rngs=rngs)
        self.layers = nnx.List([LlamaBlock(c, batch, act, rngs=rngs) for _ in range(c.layers)])
        self.norm = RMSNorm(c.dim, rngs=rngs)
        self.head = nnx.Linear(c.dim, c.vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens, start=0):
        positions = start + jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, positions, start)
        return self.head(self.norm(x))


# -- 2. a Qwen3-style decoder entered through a jitted forward(model, cache, tokens) --------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Cache:
    """A KV cache as reference implementations pass it: a pytree beside the model."""

    k: list
    v: list
    end: jax.Array


class QwenAttention(nnx.Module):
    def __init__(self, c: LM, *, rngs: nnx.Rngs):
        self.c = c
        self.q_proj = nnx.Linear(c.dim, c.heads * c.head_dim, use_bias=False, rngs=rngs)
        self.k_proj = nnx.Linear(c.dim, c.kv_heads * c.head_dim, use_bias=False, rngs=rngs)
        self.v_proj = nnx.Linear(c.dim, c.kv_heads * c.head_dim, use_bias=False, rngs=rngs)
        self.o_proj = nnx.Linear(c.heads * c.head_dim, c.dim, use_bias=False, rngs=rngs)
        self.q_norm, self.k_norm = RMSNorm(c.head_dim, rngs=rngs), RMSNorm(c.head_dim, rngs=rngs)

    def __call__(self, x, positions, k_cache, v_cache, end):
        b, t, _ = x.shape
        c = self.c
        q = rope(self.q_norm(self.q_proj(x).reshape(b, t, c.heads, c.head_dim)), positions, 1e6)
        k = rope(self.k_norm(self.k_proj(x).reshape(b, t, c.kv_heads, c.head_dim)), positions, 1e6)
        v = self.v_proj(x).reshape(b, t, c.kv_heads, c.head_dim)
        k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, end, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, end, 0, 0))
        mask = jnp.broadcast_to(causal(t, c.max_len, end), (b, t, c.max_len))
        return self.o_proj(attend(q, k_cache, v_cache, mask)), k_cache, v_cache


class QwenBlock(nnx.Module):
    def __init__(self, c: LM, act: Act, *, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(c.dim, rngs=rngs)
        self.self_attn = QwenAttention(c, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(c.dim, rngs=rngs)
        self.mlp = MLP(c.dim, c.hidden, act, rngs=rngs)

    def __call__(self, x, positions, k_cache, v_cache, end):
        h, k_cache, v_cache = self.self_attn(self.input_layernorm(x), positions, k_cache, v_cache, end)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), k_cache, v_cache


class Qwen3(nnx.Module):
    def __init__(self, c: LM, act: Act = jax.nn.silu, *, rngs: nnx.Rngs):
        self.embed_tokens = nnx.Embed(c.vocab, c.dim, rngs=rngs)
        self.layers = nnx.List([QwenBlock(c, act, rngs=rngs) for _ in range(c.layers)])
        self.norm = RMSNorm(c.dim, rngs=rngs)

    def __call__(self, tokens, cache: Cache):
        positions = cache.end + jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        x = self.embed_tokens(tokens)
        ks, vs = [], []
        for layer, k, v in zip(self.layers, cache.k, cache.v):
            x, k, v = layer(x, positions, k, v, cache.end)
            ks.append(k)
            vs.append(v)
        logits = self.embed_tokens.attend(self.norm(x))  # tied embeddings
        return logits, Cache(ks, vs, cache.end + tokens.shape[1])


def empty_cache(c: LM, batch: int) -> Cache:
    zeros = [jnp.zeros((batch, c.max_len, c.kv_heads, c.head_dim)) for _ in range(c.layers)]
    return Cache(zeros, list(zeros), jnp.zeros((), jnp.int32))


@jax.jit
def forward(model: Qwen3, cache: Cache, tokens):
    """The entry point reference implementations give: jitted, the model and the cache as pytrees."""
    return model(tokens, cache)


# -- 3. a Mamba-style block: a selective scan over time ---------------------------------------------

class MambaBlock(nnx.Module):
    def __init__(self, dim: int, act: Act, *, state: int = 4, expand: int = 2, conv: int = 3, rngs: nnx.Rngs):
        inner, self.rank = expand * dim, max(1, dim // 8)
        self.in_proj = nnx.Linear(dim, 2 * inner, use_bias=False, rngs=rngs)
        self.conv1d = nnx.Conv(inner, inner, (conv,), feature_group_count=inner, padding=((conv - 1, 0),), rngs=rngs)
        self.x_proj = nnx.Linear(inner, self.rank + 2 * state, use_bias=False, rngs=rngs)
        self.dt_proj = nnx.Linear(self.rank, inner, rngs=rngs)
        self.A_log = nnx.Param(jnp.log(jnp.tile(jnp.arange(1, state + 1, dtype=jnp.float32), (inner, 1))))
        self.D = nnx.Param(jnp.ones((inner,)))
        self.out_proj = nnx.Linear(inner, dim, use_bias=False, rngs=rngs)
        self.norm = RMSNorm(dim, rngs=rngs)
        self.act, self.state = act, state

    def __call__(self, x):
        h = self.norm(x)
        xs, z = jnp.split(self.in_proj(h), 2, axis=-1)
        xs = self.act(self.conv1d(xs))
        dt, b, c = jnp.split(self.x_proj(xs), [self.rank, self.rank + self.state], axis=-1)
        dt = jax.nn.softplus(self.dt_proj(dt))                                   # [B, T, I]
        a = -jnp.exp(self.A_log[...])                                            # [I, N]

        def step(s, inputs):                                                     # s: [B, I, N]
            x_t, dt_t, b_t, c_t = inputs
            s = jnp.exp(dt_t[..., None] * a) * s + (dt_t * x_t)[..., None] * b_t[:, None, :]
            return s, jnp.einsum("bin,bn->bi", s, c_t)

        s0 = jnp.zeros((x.shape[0], xs.shape[-1], self.state))
        _, ys = jax.lax.scan(step, s0, tuple(jnp.swapaxes(v, 0, 1) for v in (xs, dt, b, c)))
        y = jnp.swapaxes(ys, 0, 1) + xs * self.D[...]
        return x + self.out_proj(y * self.act(z))


class Mamba(nnx.Module):
    def __init__(self, vocab: int = 64, dim: int = 16, layers: int = 2, act: Act = jax.nn.silu, *, rngs: nnx.Rngs):
        self.embedding = nnx.Embed(vocab, dim, rngs=rngs)
        self.layers = nnx.List([MambaBlock(dim, act, rngs=rngs) for _ in range(layers)])
        self.norm_f = RMSNorm(dim, rngs=rngs)

    def __call__(self, tokens):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.embedding.attend(self.norm_f(x))


# -- 4. an encoder-decoder with cross-attention (T5/Whisper-style) ----------------------------------

class MHA(nnx.Module):
    def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs):
        self.heads = heads
        self.q, self.k, self.v, self.o = (nnx.Linear(dim, dim, use_bias=False, rngs=rngs) for _ in range(4))

    def __call__(self, x, context, mask):
        b, t, d = x.shape
        split = lambda y: y.reshape(b, y.shape[1], self.heads, d // self.heads)  # noqa: E731
        return self.o(attend(split(self.q(x)), split(self.k(context)), split(self.v(context)), mask))


class EncoderLayer(nnx.Module):
    def __init__(self, dim: int, heads: int, act: Act, *, rngs: nnx.Rngs):
        self.norm1, self.norm2 = RMSNorm(dim, rngs=rngs), RMSNorm(dim, rngs=rngs)
        self.attn = MHA(dim, heads, rngs=rngs)
        self.wi, self.wo = nnx.Linear(dim, 2 * dim, rngs=rngs), nnx.Linear(2 * dim, dim, rngs=rngs)
        self.act = act

    def __call__(self, x, mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, mask)
        return x + self.wo(self.act(self.wi(self.norm2(x))))


class DecoderLayer(nnx.Module):
    def __init__(self, dim: int, heads: int, act: Act, *, rngs: nnx.Rngs):
        self.norm1, self.norm2, self.norm3 = (RMSNorm(dim, rngs=rngs) for _ in range(3))
        self.self_attn, self.cross_attn = MHA(dim, heads, rngs=rngs), MHA(dim, heads, rngs=rngs)
        self.wi, self.wo = nnx.Linear(dim, 2 * dim, rngs=rngs), nnx.Linear(2 * dim, dim, rngs=rngs)
        self.act = act

    def __call__(self, y, memory, self_mask, cross_mask):
        h = self.norm1(y)
        y = y + self.self_attn(h, h, self_mask)
        y = y + self.cross_attn(self.norm2(y), memory, cross_mask)
        return y + self.wo(self.act(self.wi(self.norm3(y))))


class EncoderDecoder(nnx.Module):
    def __init__(self, vocab: int = 64, dim: int = 16, heads: int = 2, layers: int = 2, act: Act = jax.nn.gelu,
                 *, rngs: nnx.Rngs):
        self.shared = nnx.Embed(vocab, dim, rngs=rngs)
        self.encoder = nnx.List([EncoderLayer(dim, heads, act, rngs=rngs) for _ in range(layers)])
        self.decoder = nnx.List([DecoderLayer(dim, heads, act, rngs=rngs) for _ in range(layers)])
        self.final_norm = RMSNorm(dim, rngs=rngs)
        self.lm_head = nnx.Linear(dim, vocab, use_bias=False, rngs=rngs)

    def __call__(self, input_ids, decoder_input_ids, attention_mask=None):
        b, s = input_ids.shape
        t = decoder_input_ids.shape[1]
        keep = jnp.ones((b, s), bool) if attention_mask is None else attention_mask.astype(bool)
        x = self.shared(input_ids)
        for layer in self.encoder:
            x = layer(x, jnp.broadcast_to(keep[:, None, :], (b, s, s)))
        y = self.shared(decoder_input_ids)
        for layer in self.decoder:
            y = layer(y, x, jnp.broadcast_to(causal(t, t), (b, t, t)), jnp.broadcast_to(keep[:, None, :], (b, t, s)))
        return self.lm_head(self.final_norm(y))


# -- 5. a ViT ----------------------------------------------------------------------------------------

class ViTBlock(nnx.Module):
    def __init__(self, dim: int, heads: int, act: Act, *, rngs: nnx.Rngs):
        self.norm1, self.norm2 = nnx.LayerNorm(dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, dim, decode=False, rngs=rngs)
        self.fc1, self.fc2 = nnx.Linear(dim, 2 * dim, rngs=rngs), nnx.Linear(2 * dim, dim, rngs=rngs)
        self.act = act

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class ViT(nnx.Module):
    def __init__(self, classes: int = 5, patch: int = 4, size: int = 16, dim: int = 16, heads: int = 2,
                 layers: int = 2, act: Act = jax.nn.gelu, *, rngs: nnx.Rngs):
        self.patch_embed = nnx.Conv(3, dim, (patch, patch), strides=(patch, patch), padding="VALID", rngs=rngs)
        self.cls_token = nnx.Param(jax.random.normal(rngs.params(), (1, 1, dim)) * 0.02)
        self.pos_embed = nnx.Param(jax.random.normal(rngs.params(), (1, (size // patch) ** 2 + 1, dim)) * 0.02)
        self.blocks = nnx.List([ViTBlock(dim, heads, act, rngs=rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, classes, rngs=rngs)

    def __call__(self, images):
        x = self.patch_embed(images)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = jnp.concatenate([jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[-1])), x], axis=1)
        x = x + self.pos_embed[...]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


# -- 6. a ConvNeXt ------------------------------------------------------------------------------------

class ConvNeXtBlock(nnx.Module):
    def __init__(self, dim: int, act: Act, *, rngs: nnx.Rngs):
        self.dwconv = nnx.Conv(dim, dim, (7, 7), feature_group_count=dim, padding="SAME", rngs=rngs)
        self.norm = nnx.LayerNorm(dim, epsilon=1e-6, rngs=rngs)
        self.pwconv1, self.pwconv2 = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)
        self.gamma = nnx.Param(jnp.full((dim,), 0.5))
        self.act = act

    def __call__(self, x):
        return x + self.gamma[...] * self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x)))))


class ConvNeXt(nnx.Module):
    def __init__(self, classes: int = 5, dims: tuple = (8, 16), act: Act = jax.nn.gelu, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, dims[0], (4, 4), strides=(4, 4), padding="VALID", rngs=rngs)
        self.stem_norm = nnx.LayerNorm(dims[0], epsilon=1e-6, rngs=rngs)
        self.stages = nnx.List([ConvNeXtBlock(d, act, rngs=rngs) for d in dims])
        self.downsample = nnx.Conv(dims[0], dims[1], (2, 2), strides=(2, 2), padding="VALID", rngs=rngs)
        self.head_norm = nnx.LayerNorm(dims[-1], epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(dims[-1], classes, rngs=rngs)

    def __call__(self, images):
        x = self.stages[0](self.stem_norm(self.stem(images)))
        x = self.stages[1](self.downsample(x))
        return self.head(self.head_norm(jnp.mean(x, axis=(1, 2))))


# -- 7. an EfficientNet-style CNN: BatchNorm, depthwise convolutions, squeeze-excite --------------

class MBConv(nnx.Module):
    def __init__(self, dim: int, act: Act, *, expand: int = 2, rngs: nnx.Rngs):
        inner = dim * expand
        self.expand_conv = nnx.Conv(dim, inner, (1, 1), use_bias=False, rngs=rngs)
        self.bn0 = nnx.BatchNorm(inner, momentum=0.9, rngs=rngs)
        self.depthwise_conv = nnx.Conv(inner, inner, (3, 3), feature_group_count=inner, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(inner, momentum=0.9, rngs=rngs)
        self.se_reduce, self.se_expand = nnx.Linear(inner, 4, rngs=rngs), nnx.Linear(4, inner, rngs=rngs)
        self.project_conv = nnx.Conv(inner, dim, (1, 1), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(dim, momentum=0.9, rngs=rngs)
        self.act = act

    def __call__(self, x):
        h = self.act(self.bn0(self.expand_conv(x)))
        h = self.act(self.bn1(self.depthwise_conv(h)))
        s = jax.nn.sigmoid(self.se_expand(self.act(self.se_reduce(jnp.mean(h, axis=(1, 2))))))
        return x + self.bn2(self.project_conv(h * s[:, None, None, :]))


class EfficientNet(nnx.Module):
    def __init__(self, classes: int = 5, dim: int = 8, act: Act = jax.nn.silu, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, dim, (3, 3), strides=(2, 2), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(dim, momentum=0.9, rngs=rngs)
        self.blocks = nnx.List([MBConv(dim, act, rngs=rngs) for _ in range(2)])
        self.head = nnx.Linear(dim, classes, rngs=rngs)
        self.act = act

    def __call__(self, images):
        x = self.act(self.bn(self.stem(images)))
        for block in self.blocks:
            x = block(x)
        return self.head(jnp.mean(x, axis=(1, 2)))


# -- 8. an image encoder with windowed attention (SAM-style) ----------------------------------------

class WindowBlock(nnx.Module):
    def __init__(self, dim: int, heads: int, window: int, act: Act, *, rngs: nnx.Rngs):
        self.norm1, self.norm2 = nnx.LayerNorm(dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
        self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, rngs=rngs)
        self.lin1, self.lin2 = nnx.Linear(dim, 2 * dim, rngs=rngs), nnx.Linear(2 * dim, dim, rngs=rngs)
        self.heads, self.window, self.act = heads, window, act

    def _attention(self, x):  # x: [N, L, C]
        n, length, c = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(n, length, 3, self.heads, c // self.heads), 3, axis=2)
        out = attend(q[:, :, 0], k[:, :, 0], v[:, :, 0], jnp.ones((n, length, length), bool))
        return self.proj(out)

    def __call__(self, x):  # x: [B, H, W, C]
        b, h, w, c = x.shape
        s = self.window if self.window else h
        y = self.norm1(x).reshape(b, h // s, s, w // s, s, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        y = self._attention(y).reshape(b, h // s, w // s, s, s, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        x = x + y
        return x + self.lin2(self.act(self.lin1(self.norm2(x))))


class ImageEncoder(nnx.Module):
    def __init__(self, dim: int = 16, heads: int = 2, act: Act = jax.nn.gelu, *, rngs: nnx.Rngs):
        self.patch_embed = nnx.Conv(3, dim, (4, 4), strides=(4, 4), padding="VALID", rngs=rngs)
        self.pos_embed = nnx.Param(jax.random.normal(rngs.params(), (1, 4, 4, dim)) * 0.02)
        # windowed, windowed, global: as SAM's encoder interleaves them
        self.blocks = nnx.List([WindowBlock(dim, heads, w, act, rngs=rngs) for w in (2, 2, 0)])
        self.neck = nnx.Conv(dim, 8, (1, 1), use_bias=False, rngs=rngs)
        self.neck_norm = nnx.LayerNorm(8, rngs=rngs)

    def __call__(self, images):
        x = self.patch_embed(images) + self.pos_embed[...]
        for block in self.blocks:
            x = block(x)
        return self.neck_norm(self.neck(x))


# -- the cases ------------------------------------------------------------------------------------

IDS = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 7 + 3) % 64
DEC = (IDS[:, ::-1] + 5) % 64
IMAGES = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))


@dataclasses.dataclass(frozen=True)
class Case:
    """How to build a zoo model (with an activation) and how it is entered.

    ``build(act)`` gives ``(target, args)``: ``target`` is the nnx model itself or a
    function taking it first (a jitted ``forward(model, cache, tokens)``), ``args``
    what it is called with; ``make_mox(target)(*args)`` traces it. ``act`` names the activation the swap replaces, ``layers`` the
    query for the linear layers LoRA adapts, ``calls`` the module calls a query
    must count."""

    build: Callable[[Act | None], tuple[Any, tuple]]
    act: str
    layers: str
    calls: tuple[str, int]
    functional: bool = False  #: entered through a function of the model (not the model itself)


def _lm(**kw: Any) -> LM:
    return LM(**kw)


def _llama(act: Act | None = None) -> tuple[Any, tuple]:
    return Llama(_lm(), 2, act or jax.nn.silu, rngs=nnx.Rngs(0)), (IDS,)


def _qwen(act: Act | None = None) -> tuple[Any, tuple]:
    c = _lm(qk_norm=True)
    return forward, (Qwen3(c, act or jax.nn.silu, rngs=nnx.Rngs(0)), empty_cache(c, 2), IDS)


def _train(model: nnx.Module) -> nnx.Module:
    model.train()
    return model


def _eval(model: nnx.Module) -> nnx.Module:
    model.eval()
    return model


CASES: dict[str, Case] = {
    "llama-kv-cache": Case(_llama, "silu", '//module_call[@type="Linear"][@name="q" or @name="v"]',
                           ("CachedAttention", 2)),
    "qwen3-jitted-forward": Case(_qwen, "silu", '//module_call[@type="Linear"][contains(@name, "_proj")]',
                                 ("QwenAttention", 2), functional=True),
    "mamba": Case(lambda act=None: (Mamba(act=act or jax.nn.silu, rngs=nnx.Rngs(0)), (IDS,)), "silu",
                  '//module_call[@type="Linear"][@name="in_proj" or @name="out_proj"]', ("MambaBlock", 2)),
    "encoder-decoder": Case(lambda act=None: (EncoderDecoder(act=act or jax.nn.gelu, rngs=nnx.Rngs(0)),
                                              (IDS, DEC, jnp.ones_like(IDS))), "gelu",
                            '//module_call[@type="MHA"]/module_call[@name="q" or @name="v"]', ("MHA", 6)),
    "vit": Case(lambda act=None: (ViT(act=act or jax.nn.gelu, rngs=nnx.Rngs(0)), (IMAGES,)), "gelu",
                '//module_call[@type="LinearGeneral"]', ("ViTBlock", 2)),
    "convnext": Case(lambda act=None: (ConvNeXt(act=act or jax.nn.gelu, rngs=nnx.Rngs(0)), (IMAGES,)), "gelu",
                     '//module_call[@type="Linear"][starts-with(@name, "pwconv")]', ("ConvNeXtBlock", 2)),
    "efficientnet-train": Case(lambda act=None: (_train(EfficientNet(act=act or jax.nn.silu, rngs=nnx.Rngs(0))),
                                                 (IMAGES,)), "silu",
                               '//module_call[@type="Conv"][@name="project_conv" or @name="expand_conv"]',
                               ("BatchNorm", 7)),
    "efficientnet-eval": Case(lambda act=None: (_eval(EfficientNet(act=act or jax.nn.silu, rngs=nnx.Rngs(0))),
                                                (IMAGES,)), "silu",
                              '//module_call[@type="Conv"][@name="project_conv" or @name="expand_conv"]',
                              ("BatchNorm", 7)),
    "sam-windowed": Case(lambda act=None: (ImageEncoder(act=act or jax.nn.gelu, rngs=nnx.Rngs(0)), (IMAGES,)),
                         "gelu", '//module_call[@type="Linear"][@name="qkv"]', ("WindowBlock", 3)),
}

