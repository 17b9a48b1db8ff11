"""flax.nnx test models that do what real nnx code does. Random weights, no downloads.

Each entry of `NNX_CASES` builds ``(model, args, kwargs)``. The real thing is
calling a clone of the model, ``m(*args, **kwargs)``, then ``nnx.state(m)``:
``yax.eval_mox(yax.make_mox(model)(*args, **kwargs), state, *args, **kwargs)``
must return the same ``(out, new_state)``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, din: int = 4, hidden: int = 16, dout: int = 8, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(din, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.relu(self.fc1(x)))


class CNN(nnx.Module):
    """Conv, BatchNorm (batch statistics updated in train mode), Dropout with Rngs."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.dropout = nnx.Dropout(0.3, rngs=rngs)
        self.head = nnx.Linear(8 * 4 * 4, 10, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.bn(self.conv(x)))
        x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
        x = self.dropout(x.reshape((x.shape[0], -1)))
        return self.head(x)


class SelfAttention(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, *, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.query = nnx.Linear(d_model, d_model, rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)

    def _split_heads(self, x):
        b, s, d = x.shape
        return x.reshape(b, s, self.num_heads, d // self.num_heads)

    def __call__(self, x, mask=None):
        q, k, v = (self._split_heads(f(x)) for f in (self.query, self.key, self.value))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(x.dtype)
        if mask is not None:
            logits = jnp.where(mask, logits, -1e9)
        w = nnx.softmax(logits, axis=-1)
        return self.out(jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(x.shape))


class Block(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, d_mlp: int, dropout: float = 0.0, *,
                 mha: bool = False, rms: bool = False, act: Callable = nnx.gelu, rngs: nnx.Rngs):
        Norm = nnx.RMSNorm if rms else nnx.LayerNorm
        self.norm1 = Norm(d_model, rngs=rngs)
        if mha:
            self.attn = nnx.MultiHeadAttention(num_heads, d_model, decode=False, rngs=rngs)
        else:
            self.attn = SelfAttention(d_model, num_heads, rngs=rngs)
        self.mha = mha
        self.drop1 = nnx.Dropout(dropout, rngs=rngs)
        self.norm2 = Norm(d_model, rngs=rngs)
        self.fc1 = nnx.Linear(d_model, d_mlp, rngs=rngs)
        self.act = act
        self.fc2 = nnx.Linear(d_mlp, d_model, rngs=rngs)
        self.drop2 = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x, mask=None):
        h = self.norm1(x)
        h = self.attn(h, mask=mask) if self.mha else self.attn(h, mask)
        x = x + self.drop1(h)
        h = self.fc2(self.act(self.fc1(self.norm2(x))))
        return x + self.drop2(h)


class Transformer(nnx.Module):
    """Embedding, N blocks in an ``nnx.List`` (optionally remat'ed), tied
    output embedding through ``self.embed.attend``."""

    def __init__(self, vocab: int = 64, d_model: int = 32, num_heads: int = 4, d_mlp: int = 64,
                 num_layers: int = 2, dropout: float = 0.0, *, mha: bool = False, rms: bool = False,
                 remat: bool = False, act: Callable = nnx.gelu, max_len: int = 128, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, d_model, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (max_len, d_model)))
        self.blocks = nnx.List([Block(d_model, num_heads, d_mlp, dropout, mha=mha, rms=rms, act=act, rngs=rngs)
                                for _ in range(num_layers)])
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.remat = remat

    def __call__(self, ids):
        s = ids.shape[1]
        x = self.embed(ids) + self.pos[:s][None]
        mask = nnx.make_causal_mask(ids)
        for block in self.blocks:
            if self.remat:
                x = nnx.remat(lambda b, x, m: b(x, m))(block, x, mask)
            else:
                x = block(x, mask)
        return self.embed.attend(self.norm(x))


class ScanTransformer(nnx.Module):
    """Layers created with ``nnx.vmap`` and run with ``nnx.scan`` (each step
    rematerialised with ``nnx.remat`` if asked): one stacked Block."""

    def __init__(self, vocab: int = 64, d_model: int = 32, num_heads: int = 4, d_mlp: int = 64,
                 num_layers: int = 3, *, remat: bool = False, rngs: nnx.Rngs):
        self.remat = remat
        self.embed = nnx.Embed(vocab, d_model, rngs=rngs)

        @nnx.split_rngs(splits=num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(d_model, num_heads, d_mlp, rngs=rngs)

        self.blocks = make(rngs)
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)

    def __call__(self, ids):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x, block):
            return nnx.remat(lambda b, x: b(x))(block, x) if self.remat else block(x)

        x = body(self.embed(ids), self.blocks)
        return self.embed.attend(self.norm(x))


class Lifted(nnx.Module):
    """``nnx.jit``, ``nnx.vmap`` and ``nnx.remat`` used inside a model."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.a = nnx.Linear(4, 4, rngs=rngs)
        self.b = nnx.Linear(4, 4, rngs=rngs)
        self.c = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.jit(lambda m, x: m(x))(self.a, x)
        x = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(self.b, x)
        return nnx.remat(lambda m, x: m(x))(self.c, x)


class Shared(nnx.Module):
    """One layer applied three times (and reached from two attributes)."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.layer = nnx.Linear(5, 5, rngs=rngs)
        self.alias = self.layer

    def __call__(self, x):
        x = jnp.tanh(self.layer(x))
        x = jnp.tanh(self.alias(x))
        return jnp.tanh(self.layer(x))


class Classifier(nnx.Module):
    """``nnx.Sequential`` with activations in it, and a second public method."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.body = nnx.Sequential(nnx.Linear(4, 6, rngs=rngs), nnx.relu, nnx.Linear(6, 2, rngs=rngs))
        self.norm = nnx.RMSNorm(2, rngs=rngs)

    def encode(self, x):
        return self.body(x)

    def __call__(self, x):
        return self.norm(self.encode(x))


# -- the cases --------------------------------------------------------------------

def rngs(seed: int = 0) -> nnx.Rngs:
    return nnx.Rngs(params=seed, dropout=seed + 1)


IDS = jnp.arange(16).reshape(2, 8) % 64


def case_mlp():
    return MLP(rngs=rngs()), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


def case_cnn_eval():
    m = CNN(rngs=rngs())
    m.eval()
    return m, (jax.random.normal(jax.random.key(1), (2, 8, 8, 3)),), {}


def case_cnn_train():
    m = CNN(rngs=rngs())
    m.train()
    return m, (jax.random.normal(jax.random.key(1), (2, 8, 8, 3)),), {}


def case_transformer():
    return Transformer(rngs=rngs()), (IDS,), {}


def case_transformer_mha_rms():
    return Transformer(mha=True, rms=True, rngs=rngs()), (IDS,), {}


def case_transformer_dropout():
    return Transformer(dropout=0.3, rngs=rngs()), (IDS,), {}


def case_transformer_remat():
    return Transformer(remat=True, rngs=rngs()), (IDS,), {}


def case_transformer_scan():
    return ScanTransformer(rngs=rngs()), (IDS,), {}


def case_transformer_scan_remat():
    return ScanTransformer(remat=True, rngs=rngs()), (IDS,), {}


def case_lifted():
    return Lifted(rngs=rngs()), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


def case_shared():
    return Shared(rngs=rngs()), (jnp.ones((2, 5)),), {}


def case_sequential():
    return Classifier(rngs=rngs()), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


NNX_CASES: dict[str, Callable[[], tuple]] = {
    k[len("case_"):]: v for k, v in sorted(globals().items()) if k.startswith("case_")
}
