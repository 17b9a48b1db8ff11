"""Test models that do what real Flax code does. Random weights, no downloads.

Each entry of `CASES` builds ``(fn, args, kwargs)``: calling ``fn(*args,
**kwargs)`` is the real thing that ``eval_mox(make_mox(fn)(*args, **kwargs),
*args, **kwargs)`` must reproduce.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

KEY = jax.random.key(0)


# -- building blocks --------------------------------------------------------------

class MLP(nn.Module):
    features: tuple[int, ...] = (16, 8)

    @nn.compact
    def __call__(self, x):
        for f in self.features[:-1]:
            x = nn.relu(nn.Dense(f)(x))
        return nn.Dense(self.features[-1])(x)


class SetupMLP(nn.Module):
    def setup(self):
        self.dense1 = nn.Dense(12)
        self.dense2 = nn.Dense(3)

    def __call__(self, x):
        return self.dense2(nn.silu(self.dense1(x)))

    def encode(self, x):
        return self.dense1(x)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(8, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(x)


class SelfAttention(nn.Module):
    num_heads: int
    d_model: int

    def setup(self):
        self.query = nn.Dense(self.d_model)
        self.key = nn.Dense(self.d_model)
        self.value = nn.Dense(self.d_model)
        self.out = nn.Dense(self.d_model)

    def _split_heads(self, x):
        b, s, _ = x.shape
        return x.reshape(b, s, self.num_heads, self.d_model // self.num_heads)

    def __call__(self, x, mask=None):
        q, k, v = (self._split_heads(f(x)) for f in (self.query, self.key, self.value))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(x.dtype)
        if mask is not None:
            logits = jnp.where(mask, logits, -1e9)
        w = nn.softmax(logits, axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        return self.out(y.reshape(x.shape))


class Block(nn.Module):
    d_model: int
    num_heads: int
    d_mlp: int
    dropout: float = 0.0
    act: Callable = nn.gelu

    @nn.compact
    def __call__(self, x, mask=None, deterministic: bool = True):
        h = nn.LayerNorm()(x)
        h = SelfAttention(self.num_heads, self.d_model)(h, mask)
        x = x + nn.Dropout(self.dropout)(h, deterministic=deterministic)
        h = nn.LayerNorm()(x)
        h = nn.Dense(self.d_mlp)(h)
        h = self.act(h)
        h = nn.Dense(self.d_model)(h)
        return x + nn.Dropout(self.dropout)(h, deterministic=deterministic)


class ScanBlock(nn.Module):
    """`nn.scan` carry signature around a Block."""

    d_model: int
    num_heads: int
    d_mlp: int
    act: Callable = nn.gelu

    @nn.compact
    def __call__(self, x, _):
        return Block(self.d_model, self.num_heads, self.d_mlp, act=self.act)(x), None


class Transformer(nn.Module):
    """Embedding, N blocks (optionally remat'ed or scanned), tied output
    embedding through ``self.embed.attend``."""

    vocab: int = 64
    d_model: int = 32
    num_heads: int = 4
    d_mlp: int = 64
    num_layers: int = 2
    scan: bool = False
    remat: bool = False
    dropout: float = 0.0
    act: Callable = nn.gelu

    @nn.compact
    def __call__(self, ids, deterministic: bool = True):
        embed = nn.Embed(self.vocab, self.d_model, name="embed")
        b, s = ids.shape
        x = embed(ids) + self.param("pos", nn.initializers.normal(0.02), (s, self.d_model))[None]
        positions = jnp.arange(ids.shape[1])  # a shape-derived Python int stays static
        x = x + 0.0 * positions[None, :, None]
        mask = nn.make_causal_mask(ids)
        if self.scan:
            Stack = nn.scan(
                ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True},
                length=self.num_layers,
            )
            x, _ = Stack(self.d_model, self.num_heads, self.d_mlp, self.act, name="layers")(x, None)
        else:
            B = nn.remat(Block, static_argnums=(3,)) if self.remat else Block
            for _ in range(self.num_layers):
                x = B(self.d_model, self.num_heads, self.d_mlp, self.dropout, self.act)(x, mask, deterministic)
        x = nn.LayerNorm()(x)
        return embed.attend(x)


class Shared(nn.Module):
    """One layer applied N times: parameters shared across depth."""

    @nn.compact
    def __call__(self, x):
        layer = nn.Dense(x.shape[-1], name="shared")
        for _ in range(3):
            x = nn.tanh(layer(x))
        return x


class Intermediates(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(6)(x)
        self.sow("intermediates", "h", h)
        return nn.Dense(2)(h)


class Stochastic(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Dense(8)(x)
        x = nn.Dropout(0.5, deterministic=not train)(x)
        noise = jax.random.normal(self.make_rng("noise"), x.shape)
        return x + 0.1 * noise


@jax.custom_vjp
def clip_grad_identity(x):
    return x


def _cgi_fwd(x):
    return x, None


def _cgi_bwd(_, g):
    return (jnp.clip(g, -0.1, 0.1),)


clip_grad_identity.defvjp(_cgi_fwd, _cgi_bwd)


@jax.custom_jvp
def softclip(x):
    return jnp.tanh(x) * 3.0


@softclip.defjvp
def _softclip_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softclip(x), t * (1 - jnp.tanh(x) ** 2) * 3.0


class ControlFlow(nn.Module):
    @nn.compact
    def __call__(self, x, n):
        x = nn.Dense(4)(x)
        x = jax.lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: -y, x)
        x = jax.lax.fori_loop(0, 3, lambda i, y: y + i, x)
        x = jax.lax.while_loop(lambda y: y.sum() < 100.0, lambda y: y + 1.0, x)

        def step(c, xs):
            return c + xs, c * 2

        c, ys = jax.lax.scan(step, x[0], x)
        x = softclip(x + ys + c)
        eos = (n == 3).argmax(-1)  # comparisons of int inputs with constants
        return x + eos[:, None].astype(x.dtype), {"eos": eos}


class CustomGrads(nn.Module):
    """User-defined custom_vjp / custom_jvp next to nn.relu (custom_jvp) and nn.gelu."""

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(4)(x)
        return clip_grad_identity(softclip(nn.relu(x) + nn.gelu(x)))


class Lifted(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.jit(nn.Dense)(4)(x)
        x = nn.vmap(
            nn.Dense, in_axes=0, out_axes=0, variable_axes={"params": None}, split_rngs={"params": False}
        )(4)(x)
        return nn.checkpoint(nn.Dense)(3)(x)


@dataclasses.dataclass
class Pair:
    a: Any
    b: Any


jax.tree_util.register_dataclass(Pair, data_fields=["a", "b"], meta_fields=[])


class PyTreeIO(nn.Module):
    @nn.compact
    def __call__(self, inputs: dict):
        y = nn.Dense(3)(inputs["x"]) * inputs["scale"]
        return Pair(a=y, b=(y.sum(), inputs["x"]))


class TwoMethods(nn.Module):
    def setup(self):
        self.enc = nn.Dense(5)
        self.dec = nn.Dense(3)

    def encode(self, x):
        return self.enc(x)

    def decode(self, z):
        return self.dec(z)

    def __call__(self, x):
        return self.decode(self.encode(x))


class TiedNested(nn.Module):
    """A module applied inside another through a nested ``.apply``."""

    @nn.compact
    def __call__(self, ids):
        table = self.param("table", nn.initializers.normal(1.0), (16, 6))
        x = jnp.take(table, ids, axis=0)
        head = nn.Dense(6, use_bias=False)
        x = head.apply({"params": {"kernel": table.T[:6, :6]}}, x)
        return x @ table.T


class ProjectedAttention(nn.Module):
    """Attention whose q/k/v/o are `nn.DenseGeneral` over ``(heads, head_dim)``,
    the way large JAX codebases (t5x, MaxText) write it."""

    num_heads: int
    head_dim: int

    @nn.compact
    def __call__(self, x, mask):
        q, k, v = (nn.DenseGeneral((self.num_heads, self.head_dim), name=n)(x) for n in ("query", "key", "value"))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim).astype(x.dtype)
        w = nn.softmax(jnp.where(mask, logits, jnp.finfo(x.dtype).min), axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), name="out")(y)


class DecoderLayer(nn.Module):
    """One pre-norm layer in `nn.scan`'s signature: ``(carry, broadcast mask) -> (carry, None)``."""

    num_heads: int
    head_dim: int
    d_mlp: int
    act: Callable = nn.gelu

    @nn.compact
    def __call__(self, x, mask):
        x = x + ProjectedAttention(self.num_heads, self.head_dim, name="attn")(nn.LayerNorm(name="pre_attn_norm")(x), mask)
        h = nn.Dense(self.d_mlp, name="wi")(nn.LayerNorm(name="pre_mlp_norm")(x))
        return x + nn.Dense(x.shape[-1], name="wo")(self.act(h)), None


class ScannedTransformer(nn.Module):
    """Layers stacked as ``nn.scan(nn.remat(layer))`` with their variables
    stacked on a leading layer axis, tied output embedding."""

    vocab: int = 100
    d_model: int = 32
    num_heads: int = 4
    d_mlp: int = 64
    num_layers: int = 2
    act: Callable = nn.gelu

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(self.vocab, self.d_model, name="embed")
        Stack = nn.scan(
            nn.remat(DecoderLayer, prevent_cse=False), variable_axes={"params": 0}, split_rngs={"params": True},
            in_axes=nn.broadcast, length=self.num_layers,
        )
        layers = Stack(self.num_heads, self.d_model // self.num_heads, self.d_mlp, self.act, name="layers")
        x, _ = layers(embed(ids), nn.make_causal_mask(ids))
        return embed.attend(nn.LayerNorm(name="final_norm")(x))


# -- the cases --------------------------------------------------------------------

def _init(model, *args, **kwargs):
    return model.init({"params": KEY, "dropout": KEY, "noise": KEY}, *args, **kwargs)


def case_mlp():
    m, x = MLP(), jnp.ones((2, 4))
    return m.apply, (_init(m, x), x), {}


def case_setup():
    m, x = SetupMLP(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    return m.apply, (_init(m, x), x), {}


def case_method():
    m, x = SetupMLP(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    return m.apply, (_init(m, x), x), {"method": SetupMLP.encode}


def case_two_methods():
    m, x = TwoMethods(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    return m.apply, (_init(m, x), x), {}


def case_sequential():
    m, x = nn.Sequential([nn.Dense(6), nn.relu, nn.Dense(2)]), jnp.ones((3, 4))
    return m.apply, (_init(m, x), x), {}


def case_cnn_train():
    m, x = CNN(), jax.random.normal(KEY, (2, 8, 8, 3))
    v = _init(m, x)
    return m.apply, (v, x), {"train": True, "mutable": ["batch_stats"]}


def case_cnn_eval():
    m, x = CNN(), jax.random.normal(KEY, (2, 8, 8, 3))
    return m.apply, (_init(m, x), x), {"train": False}


def case_transformer():
    m, ids = Transformer(), jnp.arange(16).reshape(2, 8) % 64
    return m.apply, (_init(m, ids), ids), {"deterministic": True}


def case_transformer_remat():
    m, ids = Transformer(remat=True), jnp.arange(16).reshape(2, 8) % 64
    return m.apply, (_init(m, ids), ids), {}


def case_transformer_scan():
    m, ids = Transformer(scan=True, num_layers=3), jnp.arange(16).reshape(2, 8) % 64
    return m.apply, (_init(m, ids), ids), {}


def case_transformer_dropout():
    m, ids = Transformer(dropout=0.3), jnp.arange(16).reshape(2, 8) % 64
    v = _init(m, ids)
    return m.apply, (v, ids), {"deterministic": False, "rngs": {"dropout": jax.random.key(1)}}


def case_shared():
    m, x = Shared(), jnp.ones((2, 5))
    return m.apply, (_init(m, x), x), {}


def case_sow():
    m, x = Intermediates(), jnp.ones((2, 3))
    return m.apply, (_init(m, x), x), {"mutable": ["intermediates"]}


def case_rngs():
    m, x = Stochastic(), jnp.ones((2, 3))
    v = _init(m, x)
    return m.apply, (v, x), {"rngs": {"dropout": jax.random.key(1), "noise": jax.random.key(2)}}


def case_control_flow():
    m, x, n = ControlFlow(), jnp.linspace(-1, 1, 12).reshape(3, 4), jnp.array([[1, 3, 3], [3, 0, 0], [0, 0, 3]])
    return m.apply, (_init(m, x, n), x, n), {}


def case_custom_grads():
    m, x = CustomGrads(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    return m.apply, (_init(m, x), x), {}


def case_lifted():
    m, x = Lifted(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    return m.apply, (_init(m, x), x), {}


def case_pytree_io():
    m = PyTreeIO()
    inputs = {"x": jnp.ones((2, 4)), "scale": jnp.float32(2.0)}
    return m.apply, (_init(m, inputs), inputs), {}


def case_tied_nested():
    m, ids = TiedNested(), jnp.array([[1, 2, 3]])
    return m.apply, (_init(m, ids), ids), {}


def case_bound():
    m, x = MLP(), jnp.ones((2, 4))
    return m.bind(_init(m, x)), (x,), {}


def case_wrapper():
    """jnp code before and after the top module, booleans as keywords."""
    m, ids = Transformer(), jnp.arange(16).reshape(2, 8) % 64
    v = _init(m, ids)

    def forward(params, ids, deterministic=True):
        ids = jnp.where(ids < 0, 0, ids)
        logits = m.apply(params, ids, deterministic=deterministic)
        return jax.nn.log_softmax(logits.transpose(0, 2, 1), axis=1)

    return forward, (v, ids), {"deterministic": True}


def case_plain_fn():
    def f(x, y, *, scale):
        c = jnp.arange(3.0)  # a constant created inside
        return {"out": (jnp.sin(x) * scale + c, jnp.maximum(y, 0))}

    return f, (jnp.ones(3), jnp.array([-1, 2])), {"scale": 2.0}


CASES: dict[str, Callable[[], tuple]] = {
    k[len("case_"):]: v for k, v in sorted(globals().items()) if k.startswith("case_")
}
