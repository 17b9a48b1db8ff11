"""The oracle for `yax.LoRA`: generated models in every module system, adapted
by `yax.sub` and checked against LoRA computed by hand in plain JAX and NumPy
from the weights found in the returned parameters, never against yax itself.

A model is 1-3 dense layers (linen ``nn.Dense`` or ``nn.DenseGeneral``,
``nnx.Linear``, ``eqx.nn.Linear``, the last called inside ``jax.vmap`` or on one
example), with and without bias, ``tanh`` between them, sizes 1-6, a batch of
1-4. ``yax.sub(<its layers>, yax.LoRA(rank=r, alpha=a), mox, params=…, key=k)``
must give, layer by layer, ``y = x W + b + (x A B) * alpha / rank``:

(i)   at init (``B = 0``) exactly the original model;
(ii)  with random ``A`` and ``B`` put in the returned parameters, ``eval_mox``
      equal to the reference (float64 NumPy, within float32's rounding of the
      terms it sums);
(iii) ``jax.grad`` through ``eval_mox`` w.r.t. every ``A`` and ``B`` equal to
      ``jax.grad`` of the reference;
(iv)  ``lora_a`` follows ``key``: other keys give other adapters, other layers
      other ``lora_a``, the same key the same ones, bit for bit;
(v)   `yax.merge_lora` gives each layer ``W + (A @ B) * alpha / rank`` bit for bit,
      in the original layout, and the merged model computes the reference.

Budget: ``YAX_ORACLE_EXAMPLES`` examples (25 by default); a failure prints the
``@reproduce_failure`` blob to replay it. Counterexamples it found are named
regression tests in tests/test_lora.py.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yax

from .gen import EXAMPLES

#: what the oracle builds: linen's two dense layers, nnx's, Equinox's called on a batch inside
#: `jax.vmap` (a mapped call) and on one example
KINDS = ("linen.Dense", "linen.DenseGeneral", "nnx.Linear", "equinox.vmap", "equinox.one")
ALPHAS = (0.5, 1.0, 4.0, 100.0)


@dataclasses.dataclass(frozen=True)
class Model:
    kind: str
    widths: tuple[int, ...]  # in, then each layer's out
    bias: tuple[bool, ...]   # per layer
    batch: int

    @property
    def n(self) -> int:
        return len(self.bias)

    @property
    def frontend(self) -> str:
        return self.kind.split(".")[0]


@dataclasses.dataclass(frozen=True)
class Case:
    model: Model
    rank: int
    alpha: float
    key: int
    other_key: int  # != key
    seed: int       # the random adapters of (ii)


@st.composite
def cases(draw: Any) -> Case:
    n = draw(st.integers(1, 3))
    model = Model(draw(st.sampled_from(KINDS)), tuple(draw(st.lists(st.integers(1, 6), min_size=n + 1,
                                                                     max_size=n + 1))),
                  tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n))), draw(st.integers(1, 4)))
    key = draw(st.integers(0, 2**31 - 1))
    other_key = (key + draw(st.integers(1, 2**31 - 1))) % 2**31
    return Case(model, draw(st.integers(1, 4)), draw(st.sampled_from(ALPHAS)), key, other_key,
                draw(st.integers(0, 2**16)))


# -- the models, in each module system ----------------------------------------------------------

class LinenNet(nn.Module):
    widths: tuple[int, ...]
    bias: tuple[bool, ...]
    general: bool

    @nn.compact
    def __call__(self, x: Any) -> Any:
        for i, (w, b) in enumerate(zip(self.widths[1:], self.bias)):
            layer = (nn.DenseGeneral(w, axis=-1, use_bias=b, name=f"l{i}") if self.general
                     else nn.Dense(w, use_bias=b, name=f"l{i}"))
            x = layer(x)
            x = jnp.tanh(x) if i < len(self.bias) - 1 else x
        return x


class NnxNet(nnx.Module):
    def __init__(self, widths: tuple[int, ...], bias: tuple[bool, ...]):
        self.n = len(bias)
        for i, b in enumerate(bias):
            setattr(self, f"l{i}", nnx.Linear(widths[i], widths[i + 1], use_bias=b, rngs=nnx.Rngs(i)))

    def __call__(self, x: Any) -> Any:
        for i in range(self.n):
            x = getattr(self, f"l{i}")(x)
            x = jnp.tanh(x) if i < self.n - 1 else x
        return x


class EqxNet(eqx.Module):
    layers: tuple[Any, ...]
    mapped: bool = eqx.field(static=True)

    def __call__(self, x: Any) -> Any:
        for i, layer in enumerate(self.layers):
            x = jax.vmap(layer)(x) if self.mapped else layer(x)
            x = jnp.tanh(x) if i < len(self.layers) - 1 else x
        return x


@dataclasses.dataclass(frozen=True)
class Built:
    """A model, its parameters (as `sub` takes them), its MoX, how to run the model itself, and where
    each layer keeps its weights in the parameters `sub` returns (and in those `merge_lora` returns)."""

    run: Any           # (params, x) -> the model's own output
    params: Any
    mox: Any
    pattern: str
    x: np.ndarray
    out: Any = None    # `eval_mox` of the MoX on ``x``
    own: Any = None    # the model itself on ``x``


def _paths(m: Model, i: int) -> dict[str, tuple[Any, ...]]:
    """Where layer ``i``'s leaves are, by name, in the parameters of each module system."""
    if m.frontend == "linen":
        return {k: ("params", f"l{i}", k) for k in ("kernel", "bias", "lora_a", "lora_b")} | {
            "merged": ("params", f"l{i}", "kernel"), "merged_bias": ("params", f"l{i}", "bias")}
    if m.frontend == "nnx":
        return {"kernel": (f"l{i}", "kernel"), "bias": (f"l{i}", "bias"), "lora_a": (f"l{i}", "lora", "lora_a"),
                "lora_b": (f"l{i}", "lora", "lora_b"), "merged": (f"l{i}", "kernel"), "merged_bias": (f"l{i}", "bias")}
    return {"kernel": ("layers", i, "base", "weight"), "bias": ("layers", i, "base", "bias"),
            "lora_a": ("layers", i, "lora_a"), "lora_b": ("layers", i, "lora_b"),
            "merged": ("layers", i, "weight"), "merged_bias": ("layers", i, "bias")}


def _name(k: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    raise AssertionError(k)


def _flat(params: Any) -> dict[tuple[Any, ...], Any]:
    """Every array leaf by its path of names (an nnx variable's trailing `.value` left out)."""
    out = {}
    for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = tuple(_name(k) for k in kp)
        out[names[:-1] if names[-1] == "value" else names] = v
    return out


def _with(params: Any, values: dict[tuple[Any, ...], Any]) -> Any:
    """``params`` with the leaves at ``values``' paths replaced (traced values too)."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    new = []
    for kp, v in leaves:
        names = tuple(_name(k) for k in kp)
        new.append(values.get(names[:-1] if names[-1] == "value" else names, v))
    assert len(set(values) - set(_flat(params))) == 0, set(values) - set(_flat(params))
    return tree.unflatten(new)


def _kernel(m: Model, w: Any) -> Any:
    """A weight as ``x @ kernel`` takes it (Equinox holds ``W.T``)."""
    return w.T if m.frontend == "equinox" else w


@functools.lru_cache(maxsize=64)
def built(m: Model) -> Built:
    """The model of ``m`` traced once (examples of the same shapes share it)."""
    b = _built(m)
    own = jax.jit(lambda p, x: run_model(m, b, p, x))(b.params, b.x)
    return dataclasses.replace(b, out=evaluate(m, b.mox, b.params, b.x), own=own)


def _built(m: Model) -> Built:
    """The model built without running its initialisers (each compiles anew for new shapes, the most
    of what this oracle would cost): its shapes, then values from NumPy, biases far from zero."""
    rng = np.random.default_rng(zlib.crc32(repr(m).encode()))  # the same model in every run
    x = rng.normal(size=(m.batch, m.widths[0])).astype(np.float32)

    def fill(a: Any, fan_in: int = 0) -> Any:
        if len(a.shape) != 2:  # a bias
            return jnp.asarray(rng.normal(size=a.shape).astype(np.float32))
        return jnp.asarray((rng.normal(size=a.shape) / np.sqrt(a.shape[fan_in])).astype(np.float32))

    if m.frontend == "linen":
        net = LinenNet(m.widths, m.bias, m.kind == "linen.DenseGeneral")
        params = jax.tree_util.tree_map(fill, jax.eval_shape(net.init, jax.random.key(0), x))
        return Built(net.apply, params, yax.make_mox(net.apply)(params, x),
                     f'//module_call[@type="{m.kind.split(".")[1]}"]', x)
    if m.frontend == "nnx":
        graphdef, shapes = nnx.split(nnx.eval_shape(lambda: NnxNet(m.widths, m.bias)))
        state = jax.tree_util.tree_map(fill, shapes)
        return Built(lambda s, x: nnx.merge(graphdef, s)(x), state, yax.make_mox(nnx.merge(graphdef, state))(x),
                     '//module_call[@type="Linear"]', x)
    shapes = eqx.filter_eval_shape(lambda: EqxNet(tuple(
        eqx.nn.Linear(m.widths[i], m.widths[i + 1], use_bias=m.bias[i], key=jax.random.key(i))
        for i in range(m.n)), m.kind == "equinox.vmap"))
    model = jax.tree_util.tree_map(lambda a: fill(a, 1), shapes)  # a weight is [out, in]
    return Built(lambda mod, x: mod(x), model, yax.make_mox(model)(x if model.mapped else x[0]),
                 '//module_call[@type="Linear"]', x)


def evaluate(m: Model, mox: Any, params: Any, x: Any) -> Any:
    """``eval_mox`` of the model's MoX on the batch ``x``."""
    if m.frontend == "nnx":
        return yax.eval_mox(mox, params, x)[0]
    if m.kind == "equinox.one":
        return jax.vmap(lambda xi: yax.eval_mox(mox, params, xi))(x)
    return yax.eval_mox(mox, params, x)


def run_model(m: Model, b: Built, params: Any, x: Any) -> Any:
    """The model itself (not yax) on the batch ``x``."""
    if m.kind == "equinox.one":
        return jax.vmap(lambda xi: b.run(params, xi))(x)
    return b.run(params, x)


# -- the reference: LoRA by hand ----------------------------------------------------------------

@dataclasses.dataclass
class Layer:
    kernel: Any  # [in, out], as x @ kernel takes it
    bias: Any    # [out] or None
    a: Any       # [in, rank]
    b: Any       # [rank, out]


def layers(m: Model, params: Any) -> list[Layer]:
    """Each layer's weights as the adapted model holds them in ``params`` (as `sub` returned them)."""
    f = _flat(params)
    out = []
    for i in range(m.n):
        p = _paths(m, i)
        out.append(Layer(_kernel(m, f[p["kernel"]]), f.get(p["bias"]), f[p["lora_a"]], f[p["lora_b"]]))
    return out


def reference(x: Any, ls: list[Layer], scale: float, xp: Any = jnp) -> Any:
    """``y = x W + b + (x A B) * scale`` per layer, ``tanh`` between: in ``xp`` (jnp or NumPy)."""
    for i, layer in enumerate(ls):
        y = x @ layer.kernel + (x @ layer.a @ layer.b) * scale
        y = y + layer.bias if layer.bias is not None else y
        x = xp.tanh(y) if i < len(ls) - 1 else y
    return x


def reference64(x: Any, ls: list[Layer], scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The reference in float64 NumPy, and per output how large the terms float32 rounds are
    (|x| |W| + |b| + |x| |A| |B| scale, carried through the layers): the room float32 has."""
    f64 = [Layer(*(None if v is None else np.asarray(v, np.float64) for v in dataclasses.astuple(layer)))
           for layer in ls]
    y = reference(np.asarray(x, np.float64), f64, scale, np)
    room = np.zeros_like(np.asarray(x, np.float64))
    h = np.abs(np.asarray(x, np.float64))
    for i, layer in enumerate(f64):
        mag = np.abs(layer.kernel) + np.abs(layer.a) @ np.abs(layer.b) * scale
        terms = h @ mag + (np.abs(layer.bias) if layer.bias is not None else 0)
        room = room @ mag + terms  # an error in the input is carried like the input
        h = np.minimum(terms, 1.0) if i < len(f64) - 1 else terms  # |tanh| <= 1, and is 1-Lipschitz
    return y, room


def close(got: Any, want: np.ndarray, room: np.ndarray, what: str) -> None:
    """``got`` (float32) within float32's rounding of ``want`` (float64), given the ``room``."""
    err = np.abs(np.asarray(got, np.float64) - want)
    bound = 8 * np.finfo(np.float32).eps * (room + np.abs(want)) + 1e-30
    assert (err <= bound).all(), f"{what}: off by {err.max():.3g} where float32 allows {bound.min():.3g}"


# -- the property ---------------------------------------------------------------------------------

def adapt(c: Case, key: int | None = None) -> tuple[Any, Any]:
    b = built(c.model)
    return yax.sub(b.pattern, yax.LoRA(rank=c.rank, alpha=c.alpha), b.mox, params=b.params,
                   key=jax.random.key(c.key if key is None else key))


def check(c: Case) -> None:
    m, b = c.model, built(c.model)
    x, scale = b.x, c.alpha / c.rank
    new, lp = adapt(c)
    ls = layers(m, lp)
    assert len(ls) == m.n
    for i, layer in enumerate(ls):
        n_in, n_out = m.widths[i], m.widths[i + 1]
        assert layer.a.shape == (n_in, c.rank) and layer.b.shape == (c.rank, n_out), (i, layer.a.shape)
        assert (layer.bias is not None) == m.bias[i]
        assert not np.asarray(layer.b).any()
        orig = _flat(b.params)[_paths(m, i)["merged"]]  # the layer's own weights, where the model holds them
        np.testing.assert_array_equal(layer.kernel, _kernel(m, orig))

    # (i) B = 0: exactly the original model (evaluated as the MoX it came from is), and the model itself
    out0 = evaluate(m, new, lp, x)
    np.testing.assert_array_equal(out0, b.out)
    np.testing.assert_allclose(out0, b.own, rtol=1e-6, atol=1e-6)

    # (ii) random adapters put in the returned parameters: the reference. (iii) the gradients w.r.t.
    # every A and B through eval_mox: the reference's. One program each (compiling each operation of
    # new shapes on its own costs the most here).
    rng = np.random.default_rng(c.seed)
    ab = {}
    for i, layer in enumerate(ls):
        p = _paths(m, i)
        ab[p["lora_a"]] = jnp.asarray(rng.normal(size=layer.a.shape).astype(np.float32))
        # the update `(x A B) * alpha / rank` of the order of the layer's own: `tanh` far from flat (its
        # gradient's rounding blows up where it is), and every `alpha` shows in the output
        ab[p["lora_b"]] = jnp.asarray((rng.normal(size=layer.b.shape) / (2 * scale * c.rank)).astype(np.float32))
    names = sorted(ab, key=str)
    vals = [ab[k] for k in names]
    trained = _with(lp, ab)
    tl = layers(m, trained)

    @jax.jit
    def numbers(lp: Any, vals: list[Any]) -> Any:
        def loss_yax(vals: list[Any]) -> Any:
            return jnp.sum(jnp.sin(evaluate(m, new, _with(lp, dict(zip(names, vals))), x)))

        def loss_ref(vals: list[Any]) -> Any:
            return jnp.sum(jnp.sin(reference(jnp.asarray(x), layers(m, _with(lp, dict(zip(names, vals)))), scale)))

        trained = _with(lp, dict(zip(names, vals)))
        itself = (nnx.merge(new.graphdef, trained)(x) if m.frontend == "nnx" else
                  run_model(m, b, trained, x) if m.frontend == "equinox" else None)
        return evaluate(m, new, trained, x), itself, jax.grad(loss_yax)(vals), jax.grad(loss_ref)(vals)

    out, itself, g, gw = numbers(lp, vals)
    want, room = reference64(x, tl, scale)
    close(out, want, room, "eval_mox with trained adapters")
    if itself is not None:  # the adapted model itself (linen's adapters live in the MoX's module tree)
        close(itself, want, room, f"the adapted {m.frontend} model itself")
    for k, got, w in zip(names, g, gw):
        tol = 1e-4 * (1 + float(np.abs(w).max()))
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=tol, err_msg=f"gradient of {k}")

    # (iv) lora_a follows the key: per key, per layer; the same key gives the same adapters, bit for bit
    again = layers(m, adapt(c)[1])
    other = layers(m, adapt(c, c.other_key)[1])
    for i in range(m.n):
        np.testing.assert_array_equal(again[i].a, ls[i].a, err_msg=f"layer {i}: the same key")
        assert not np.array_equal(other[i].a, ls[i].a), f"layer {i}: key {c.other_key} gives key {c.key}'s lora_a"
        for j in range(i):
            a, bb = np.ravel(ls[i].a), np.ravel(ls[j].a)
            k = min(a.size, bb.size)
            assert not np.array_equal(a[:k], bb[:k]), f"layers {j} and {i} have the same lora_a"

    # (v) merge: W + (A @ B) * alpha / rank, bit for bit, laid out as the model's; the merged model computes it
    merged, mp = yax.merge_lora(new, trained)
    assert jax.tree_util.tree_structure(mp) == jax.tree_util.tree_structure(b.params)
    f = _flat(mp)
    for i, layer in enumerate(tl):
        p = _paths(m, i)
        np.testing.assert_array_equal(_kernel(m, f[p["merged"]]), layer.kernel + (layer.a @ layer.b) * scale,
                                      err_msg=f"merged kernel of layer {i}")
        if layer.bias is not None:
            np.testing.assert_array_equal(f[p["merged_bias"]], layer.bias)
    out_m, run_m = jax.jit(lambda mp: (evaluate(m, merged, mp, x), run_model(m, b, mp, x)))(mp)
    close(out_m, want, room, "eval_mox of the merged model")
    close(run_m, want, room, "the original model with the merged parameters")


@settings(max_examples=EXAMPLES, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_lora_is_lora_by_hand(c: Case) -> None:
    check(c)
