"""Generated models and their hand-written references: the oracle's inputs.

A `Spec` describes a small model as a sequence of blocks over an input of
shape ``(B, S, d)``: dense layers with and without bias, activations in the
model's own code, a layer mapped by a vectorising transform over a chosen axis
with ``in_axes``/``out_axes`` other than 0, a scanned stack of layers, a
rematerialised layer, a layer called twice, and an activation applied in a
plain function around the whole model. `build` realises it in one module
system (linen, nnx, Equinox, plain JAX) and returns the traced entry point, the
variables and a `weights` function reading the plain weights out of them.

`reference` computes the same model in plain JAX, without yax and without any
module system, from those plain weights. Every place where yax has a call node
(a dense layer, an activation) is a *site*: the reference calls ``tap(site,
inputs, output)`` there and continues with what it returns, so one function
gives the forward values, the values at every site (capture), patched values
(patch, a replacement by `sub`) and, differentiated with respect to an added
zero, the gradients at every site. A site's value is in the stacked layout:
under a vectorising transform, the instances along a leading axis (as
``jax.vmap(layer)(x)`` returns them), inside a scan the steps along a leading
axis.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: examples per property in the test command's run; more with `--oracle-examples N` (or the variable)
EXAMPLES = int(os.environ.get("YAX_ORACLE_EXAMPLES", "12"))
#: every oracle's Hypothesis settings: no deadline (each example compiles), the blob to reproduce printed
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, print_blob=True, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reporting(counts: collections.Counter[str]) -> Any:
    """An autouse fixture adding ``counts`` (what a test module's examples exercised) to the JSON
    file ``$YAX_ORACLE_COUNTS`` names, for the report after a run: ``_report = reporting(COUNTS)``."""

    @pytest.fixture(scope="module", autouse=True)
    def _report() -> Any:
        yield
        path = os.environ.get("YAX_ORACLE_COUNTS")
        if path:
            old = json.load(open(path)) if os.path.exists(path) else {}
            for k, v in counts.items():
                old[k] = old.get(k, 0) + v
            json.dump(old, open(path, "w"), indent=1)

    return _report

ACTS: dict[str, Callable[..., Any]] = {
    "relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu, "tanh": jax.nn.tanh,
    "sigmoid": jax.nn.sigmoid, "softplus": jax.nn.softplus,
}
FRONTENDS = ("linen", "nnx", "equinox", "jax")
#: the type of the dense layers' call nodes, per module system (plain JAX has none)
DENSE_TYPE = {"linen": "Dense", "nnx": "Linear", "equinox": "Linear"}


@dataclasses.dataclass(frozen=True)
class Block:
    kind: str  # dense | act | vmap | scan | remat | twice
    width: int = 0
    bias: bool = True
    act: str = "relu"
    axes: tuple[int, int] = (0, 0)  # vmap: in_axes, out_axes over the two leading axes
    length: int = 1  # scan: layers in the stack


@dataclasses.dataclass(frozen=True)
class Spec:
    frontend: str
    blocks: tuple[Block, ...]
    shape: tuple[int, int, int]  # B, S, d
    outer: str | None = None  # an activation in a plain function around the model
    dtype: str = "float32"
    scale: float = 1.0  # the input's magnitude
    #: the model calls a method of its own that raises, in a ``try`` it catches (gemma's ``hasattr``)
    caught: bool = False
    #: what is traced is the forward already wrapped in ``jax.jit`` and run once (not nnx: the model is)
    jitted: bool = False
    #: nnx only: what is traced is functional code, ``f(state, x)`` merging the model and calling it
    #: (its layers are siblings of one class, each to be named by its attribute path)
    functional: bool = False

    def widths(self) -> list[int]:
        """The feature size after each block."""
        d, out = self.shape[2], []
        for b in self.blocks:
            d = b.width if b.kind in ("dense", "vmap", "remat") else d
            out.append(d)
        return out


def _block(frontend: str, d: int) -> st.SearchStrategy[Block]:
    width = st.integers(1, 4)
    kinds = ["dense", "act", "vmap", "remat", "twice"] + (["scan"] if frontend != "nnx" else [])
    return st.sampled_from(kinds).flatmap(lambda k: {
        "dense": st.builds(Block, st.just(k), width, st.booleans()),
        "remat": st.builds(Block, st.just(k), width, st.booleans()),
        "act": st.builds(Block, st.just(k), act=st.sampled_from(sorted(ACTS))),
        "vmap": st.builds(Block, st.just(k), width, st.booleans(),
                          axes=st.tuples(st.integers(0, 1), st.integers(0, 1))),
        "scan": st.builds(Block, st.just(k), st.just(d), st.booleans(), length=st.integers(1, 3)),
        "twice": st.builds(Block, st.just(k), st.just(d), st.booleans()),
    }[k])


@st.composite
def specs(draw: Any, frontends: tuple[str, ...] = FRONTENDS, dtypes: tuple[str, ...] = ("float32",),
          scales: bool = False) -> Spec:
    """A small model: 1-4 blocks, sizes 1-4."""
    frontend = draw(st.sampled_from(frontends))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    blocks, d = [], shape[2]
    for _ in range(draw(st.integers(1, 4))):
        b = draw(_block(frontend, d))
        if b.kind in ("scan", "twice"):
            b = dataclasses.replace(b, width=d)
        blocks.append(b)
        d = b.width if b.kind in ("dense", "vmap", "remat") else d
    if not any(b.kind != "act" for b in blocks):
        blocks.append(Block("dense", draw(st.integers(1, 4)), draw(st.booleans())))
    outer = draw(st.none() | st.sampled_from(sorted(ACTS))) if frontend != "nnx" else None
    if frontend == "jax" and outer is None and not any(b.kind == "act" for b in blocks):
        outer = draw(st.sampled_from(sorted(ACTS)))  # plain JAX has call nodes only for activations
    scale = 10.0 ** draw(st.integers(-30, 30)) if scales else 1.0
    dtype = draw(st.sampled_from(dtypes))
    caught, jitted = draw(st.booleans()), frontend != "nnx" and draw(st.booleans())
    functional = frontend == "nnx" and draw(st.booleans())
    return Spec(frontend, tuple(blocks), shape, outer, dtype, scale, caught, jitted, functional)


class Probed(ValueError):
    """What a model's own probe raises and catches: no call node, no value changed."""


def probe(h: Any) -> None:
    jnp.sin(h)  # bound before raising: dead code in the caller
    raise Probed("not this one")


# ----------------------------------------------------------------------------------------------
# The reference: plain JAX, no module system, no yax.


@dataclasses.dataclass(frozen=True)
class Site:
    """A place where the model has a call node, in call order."""

    kind: str  # dense | act
    block: int
    steps: int = 0  # inside a scan of this many steps (0: not in a scan)


def sites(spec: Spec) -> list[Site]:
    out = []
    for i, b in enumerate(spec.blocks):
        if b.kind == "act":
            out.append(Site("act", i))
        elif b.kind == "scan":
            out.append(Site("dense", i, b.length))
        elif b.kind == "twice":
            out += [Site("dense", i), Site("dense", i)]
        else:
            out.append(Site("dense", i))
    if spec.outer:
        out.append(Site("act", len(spec.blocks)))
    return out


Tap = Callable[[int, Any, Any], Any]  # (site index, inputs, output) -> output; a scan's step: see `reference`


def _dense(w: dict[str, Any], h: Any) -> Any:
    y = jnp.matmul(h, w["kernel"])
    return y + w["bias"] if "bias" in w else y


def reference(spec: Spec, weights: list[Any], x: Any, tap: Tap | None = None) -> Any:
    """The model computed by hand. ``weights[i]`` holds block ``i``'s plain
    weights (``{"kernel": (in, out), "bias": (out,)}``; a scan's stacked along
    a leading axis). ``tap(k, inputs, output)`` is called at site ``k`` and its
    result continues the computation; inside a scan ``inputs`` and ``output``
    are one step's and ``tap`` gets ``(k, step)`` as its first argument."""
    def at(k: Any, i: Any, o: Any) -> Any:
        return o if tap is None else tap(k, i, o)

    h, k = x, 0
    for b, w in zip(spec.blocks, weights):
        if b.kind in ("dense", "remat"):
            h = at(k, h, _dense(w, h))
            k += 1
        elif b.kind == "act":
            h = at(k, h, ACTS[b.act](h))
            k += 1
        elif b.kind == "twice":
            h = at(k, h, _dense(w, h))
            h = at(k + 1, h, _dense(w, h))
            k += 2
        elif b.kind == "vmap":
            a, o = b.axes
            hm = jnp.moveaxis(h, a, 0)  # the instances first: the stacked layout
            h = jnp.moveaxis(at(k, hm, _dense(w, hm)), 0, o)
            k += 1
        elif b.kind == "scan":
            for step in range(b.length):
                ws = jax.tree_util.tree_map(lambda v, s=step: v[s], w)
                h = at((k, step), h, _dense(ws, h))
            k += 1
    if spec.outer:
        h = at(k, h, ACTS[spec.outer](h))
    return h


def site_values(spec: Spec, weights: list[Any], x: Any) -> list[Any]:
    """Each site's output, steps of a scan stacked along a leading axis."""
    got: dict[Any, Any] = {}

    def tap(k: Any, i: Any, o: Any) -> Any:
        got[k] = o
        return o

    reference(spec, weights, x, tap)
    return [jnp.stack([got[(k, s)] for s in range(site.steps)]) if site.steps else got[k]
            for k, site in enumerate(sites(spec))]


# ----------------------------------------------------------------------------------------------
# The same model in each module system.


@dataclasses.dataclass
class Built:
    spec: Spec
    fn: Callable[..., Any]  # what make_mox traces, called as fn(params, x) (nnx: the model, called as fn(x))
    params: Any  # the first argument of eval_mox
    weights: Callable[[Any], list[Any]]  # params (or gradients shaped like them) -> plain weights per block
    x: Any

    def args(self) -> tuple[Any, ...]:
        return (self.params, self.x)

    def out(self, result: Any) -> Any:
        """The model's output from what eval_mox returns (nnx: ``(out, new_state)``)."""
        return result[0] if self.spec.frontend == "nnx" and not self.spec.functional else result

    def own(self) -> Any:
        """What the model itself gives."""
        return self.fn(self.x) if self.spec.frontend == "nnx" and not self.spec.functional else self.fn(*self.args())


def _cast(tree: Any, dtype: str) -> Any:
    return jax.tree_util.tree_map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def build(spec: Spec, seed: int = 0) -> Built:
    key = jax.random.PRNGKey(seed)
    B, S, d = spec.shape
    x = (jax.random.normal(jax.random.fold_in(key, 99), (B, S, d), "float32") * spec.scale).astype(spec.dtype)
    built = {"linen": _linen, "nnx": _nnx, "equinox": _equinox, "jax": _plain}[spec.frontend](spec, key, x)
    if spec.jitted:  # the user's own jitted forward, run before yax traces it
        jitted = jax.jit(built.fn)
        jitted(*built.args())
        built.fn = jitted
    return built
    return built


def _outer(spec: Spec, fn: Callable[..., Any]) -> Callable[..., Any]:
    if spec.outer is None:
        return fn
    name = spec.outer
    return lambda p, x: getattr(jax.nn, name)(fn(p, x))


def _linen(spec: Spec, key: Any, x: Any) -> Built:
    import flax.linen as nn

    class Step(nn.Module):
        width: int
        bias: bool

        @nn.compact
        def __call__(self, h: Any, _: Any) -> Any:
            return nn.Dense(self.width, use_bias=self.bias)(h), None

    class Net(nn.Module):
        def probe(self, h: Any) -> None:
            probe(h)

        @nn.compact
        def __call__(self, h: Any) -> Any:
            if spec.caught:
                try:
                    self.probe(h)
                except Probed:
                    pass
            for i, b in enumerate(spec.blocks):
                name = f"b{i}"
                if b.kind == "dense":
                    h = nn.Dense(b.width, use_bias=b.bias, name=name)(h)
                elif b.kind == "remat":
                    h = nn.remat(nn.Dense)(b.width, use_bias=b.bias, name=name)(h)
                elif b.kind == "act":
                    h = getattr(nn, b.act)(h)  # looked up when called, as model code does
                elif b.kind == "twice":
                    layer = nn.Dense(b.width, use_bias=b.bias, name=name)
                    h = layer(layer(h))
                elif b.kind == "vmap":
                    mapped = nn.vmap(nn.Dense, in_axes=b.axes[0], out_axes=b.axes[1],
                                     variable_axes={"params": None}, split_rngs={"params": False})
                    h = mapped(b.width, use_bias=b.bias, name=name)(h)
                elif b.kind == "scan":
                    stack = nn.scan(Step, variable_axes={"params": 0}, split_rngs={"params": True}, length=b.length)
                    h, _ = stack(b.width, b.bias, name=name)(h, None)
            return h

    net = Net()
    # initialised at float32 or wider, as the parameters are: a bfloat16 input into float32
    # parameters comes out float32, which a scan's carry refuses (the cast puts them at spec.dtype)
    params = _cast(net.init(key, x.astype(jnp.promote_types(x.dtype, jnp.float32))), spec.dtype)

    def weights(p: Any) -> list[Any]:
        out = []
        for i, b in enumerate(spec.blocks):
            w = p["params"].get(f"b{i}", {})
            out.append(w["Dense_0"] if b.kind == "scan" else dict(w))
        return out

    return Built(spec, _outer(spec, net.apply), params, weights, x)


def _equinox(spec: Spec, key: Any, x: Any) -> Built:
    import equinox as eqx

    d_in = spec.shape[2]
    layers: list[Any] = []
    for i, (b, d) in enumerate(zip(spec.blocks, [d_in, *spec.widths()])):
        k = jax.random.fold_in(key, i)
        if b.kind == "scan":
            layers.append(eqx.filter_vmap(lambda kk, b=b, d=d: eqx.nn.Linear(d, b.width, use_bias=b.bias, key=kk))(
                jax.random.split(k, b.length)))
        elif b.kind == "act":
            layers.append(None)
        else:
            layers.append(eqx.nn.Linear(d, b.width, use_bias=b.bias, key=k))

    def each(layer: Any, h: Any, in_axes: int = 0, out_axes: int = 0) -> Any:
        return jax.vmap(jax.vmap(layer), in_axes=in_axes, out_axes=out_axes)(h)

    class Net(eqx.Module):
        layers: tuple[Any, ...]

        def probe(self, h: Any) -> None:
            probe(h)

        def __call__(self, h: Any) -> Any:
            if spec.caught:
                try:
                    self.probe(h)
                except Probed:
                    pass
            for b, layer in zip(spec.blocks, self.layers):
                if b.kind == "dense":
                    h = each(layer, h)
                elif b.kind == "remat":
                    h = jax.checkpoint(each)(layer, h)
                elif b.kind == "act":
                    h = getattr(jax.nn, b.act)(h)
                elif b.kind == "twice":
                    h = each(layer, each(layer, h))
                elif b.kind == "vmap":
                    h = each(layer, h, *b.axes)
                elif b.kind == "scan":
                    arrays, static = eqx.partition(layer, eqx.is_array)

                    def body(h: Any, a: Any, static: Any = static) -> Any:
                        return each(eqx.combine(a, static), h), None

                    h, _ = jax.lax.scan(body, h, arrays)
            return h

    net = _cast(Net(tuple(layers)), spec.dtype)

    def weights(m: Any) -> list[Any]:
        out = []
        for layer in m.layers:
            if layer is None:
                out.append({})
                continue
            w = {"kernel": jnp.swapaxes(layer.weight, -1, -2)}
            if layer.bias is not None:
                w["bias"] = layer.bias
            out.append(w)
        return out

    return Built(spec, _outer(spec, lambda m, h: m(h)), net, weights, x)


def _nnx(spec: Spec, key: Any, x: Any) -> Built:
    from flax import nnx

    d_in = spec.shape[2]
    class Net(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            for i, (b, d) in enumerate(zip(spec.blocks, [d_in, *spec.widths()])):
                if b.kind != "act":
                    setattr(self, f"b{i}", nnx.Linear(d, b.width, use_bias=b.bias, rngs=rngs))

        def probe(self, h: Any) -> None:
            probe(h)

        def __call__(self, h: Any) -> Any:
            if spec.caught:
                try:
                    self.probe(h)
                except Probed:
                    pass
            for i, b in enumerate(spec.blocks):
                layer = getattr(self, f"b{i}", None)
                if b.kind == "dense":
                    h = layer(h)
                elif b.kind == "remat":
                    h = nnx.remat(lambda m, h: m(h))(layer, h)
                elif b.kind == "act":
                    h = getattr(nnx, b.act)(h)
                elif b.kind == "twice":
                    h = layer(layer(h))
                elif b.kind == "vmap":
                    h = nnx.vmap(lambda m, h: m(h), in_axes=(None, b.axes[0]), out_axes=b.axes[1])(layer, h)
            return h

    net = Net(nnx.Rngs(key))
    if spec.dtype != "float32":
        graphdef, state = nnx.split(net)
        net = nnx.merge(graphdef, _cast(state, spec.dtype))
    graphdef, state = nnx.split(net)

    def weights(s: Any) -> list[Any]:
        pure = nnx.to_pure_dict(s)
        return [dict(pure.get(f"b{i}", {})) for i in range(len(spec.blocks))]

    if spec.functional:
        def forward(s: Any, h: Any) -> Any:
            return nnx.merge(graphdef, s)(h)

        return Built(spec, forward, state, weights, x)
    return Built(spec, net, state, weights, x)


def _plain(spec: Spec, key: Any, x: Any) -> Built:
    d_in = spec.shape[2]
    params: list[Any] = []
    for i, (b, d) in enumerate(zip(spec.blocks, [d_in, *spec.widths()])):
        k1, k2 = jax.random.split(jax.random.fold_in(key, i))
        lead = (b.length,) if b.kind == "scan" else ()
        w = {} if b.kind == "act" else {"kernel": jax.random.normal(k1, (*lead, d, b.width)) / np.sqrt(d)}
        if b.kind != "act" and b.bias:
            w["bias"] = jax.random.normal(k2, (*lead, b.width))
        params.append(w)

    def dense(w: Any, h: Any) -> Any:
        return _dense(w, h)

    def model(p: Any, h: Any) -> Any:
        for b, w in zip(spec.blocks, p):
            if b.kind == "dense":
                h = dense(w, h)
            elif b.kind == "remat":
                h = jax.checkpoint(dense)(w, h)
            elif b.kind == "act":
                h = getattr(jax.nn, b.act)(h)
            elif b.kind == "twice":
                h = dense(w, dense(w, h))
            elif b.kind == "vmap":
                h = jax.vmap(lambda hi, w=w: dense(w, hi), in_axes=b.axes[0], out_axes=b.axes[1])(h)
            elif b.kind == "scan":
                h, _ = jax.lax.scan(lambda h, w: (dense(w, h), None), h, w)
        return h

    return Built(spec, _outer(spec, model), _cast(params, spec.dtype), lambda p: list(p), x)
