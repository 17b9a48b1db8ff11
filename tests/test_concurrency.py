"""make_mox in several threads at once: the explorer's
worker thread traces while the user traces in a cell. Each trace must give
the tree the same trace gives alone, and when the last one ends nothing
yax patched for them is left behind: public activation names, Hugging Face's
``ACT2FN``, nnx classes' methods, fields of module objects two threads share.
"""

import functools
import gc
import sys
import threading
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import models
import nnx_models
import pytest
import transformers
from flax import nnx
from transformers import modeling_flax_utils

import yax
from yax import _activations
from yax._ir import Mox

pytestmark = [pytest.mark.core, pytest.mark.slow]

THREADS, ROUNDS = 4, 3


@pytest.fixture(autouse=True)
def _switch_often():
    """Threads hand over the interpreter every 0.1 ms (not 5 ms), so their traces interleave finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(old)


def _shape(mox: Mox) -> list[tuple]:
    """The tree as (kind, path, type) of its call nodes and the primitive of its equations, in order."""
    return [(n.kind, n.path, n.info.type.__name__ if n.info.type else n.name) if isinstance(n, Mox)
            else str(n.primitive) for n in mox.walk()]


def _cases() -> tuple[dict[str, Callable[[], Mox]], nnx.Module]:
    """Traces of linen, nnx and Hugging Face models with activations in
    fields, lists, ``setup`` and tables (on abstract variables: nothing is
    initialised), and an nnx model every thread calls in place from a plain
    function. (A bound linen module is not shared: Flax's own naming of
    submodules in a compact method is not safe in two threads at once.)"""
    key, ids, x = jax.random.key(0), nnx_models.IDS, jnp.linspace(-1, 1, 8).reshape(2, 4)
    out = {}
    linen = {"transformer": (models.Transformer(), ids), "scanned": (models.Transformer(scan=True, num_layers=3), ids),
             "sequential": (nn.Sequential([nn.Dense(6), nn.relu, nn.Dense(2)]), x), "setup": (models.SetupMLP(), x)}
    for name, (m, a) in linen.items():
        v = jax.eval_shape(m.init, key, a)
        out[f"linen-{name}"] = lambda m=m, v=v, a=a: yax.make_mox(m.apply)(v, a)
    m, v = linen["transformer"][0], jax.eval_shape(linen["transformer"][0].init, key, ids)
    out["linen-function"] = lambda: yax.make_mox(lambda v, ids: jax.nn.log_softmax(m.apply(v, ids)))(v, ids)
    nnx_cases = {"transformer": nnx_models.Transformer, "scanned": nnx_models.ScanTransformer}
    for name, cls in nnx_cases.items():
        model = nnx.eval_shape(lambda cls=cls: cls(rngs=nnx_models.rngs()))
        out[f"nnx-{name}"] = lambda model=model: yax.make_mox(model)(ids)
    shared = nnx_models.Classifier(rngs=nnx_models.rngs())  # nnx.Sequential holding nnx.relu
    out["nnx-shared"] = lambda: yax.make_mox(lambda x: shared(x))(x)
    # ACT2FN's partials: gelu_new in GPT-2's module, gelu in BERT's wrapper
    gpt2 = transformers.FlaxGPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=16), _do_init=False)
    bert = transformers.FlaxBertForMaskedLM(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, hidden_act="gelu"), _do_init=False)
    p_gpt2, p_bert = (jax.eval_shape(functools.partial(m.init_weights, input_shape=(2, 8)), key) for m in (gpt2, bert))
    pos = jnp.broadcast_to(jnp.arange(8), (2, 8))
    out["hf-gpt2-module"] = lambda: yax.make_mox(gpt2.module.apply)(
        {"params": p_gpt2}, ids, jnp.ones_like(ids), pos, deterministic=True)
    out["hf-bert-wrapper"] = lambda: yax.make_mox(lambda p, ids: bert(ids, params=p).logits)(p_bert, ids)
    return out, shared


def _together(fns: list[Callable[[], None]], barrier: threading.Barrier) -> None:
    """Run each of ``fns`` in its own thread; the first exception is raised here."""
    errors: list[BaseException] = []

    def run(f: Callable[[], None]) -> None:
        try:
            f()
        except BaseException as e:  # re-raised below, where pytest sees it
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(f,)) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _originals() -> dict[tuple[int, str], object]:
    """What yax patches while tracing: the public activation names, ACT2FN's entries, nnx classes' methods."""
    holders = [jax.nn, nn, sys.modules["flax.linen.activation"], nnx, modeling_flax_utils.ACT2FN]
    out = {}
    for h in holders:
        items = h.items() if isinstance(h, dict) else vars(h).items()
        out.update({(id(h), k): v for k, v in items if callable(v)})
    todo = [nnx.Module]
    while todo:
        for c in todo.pop().__subclasses__():
            todo.append(c)
            out.update({(id(c), k): v for k, v in vars(c).items() if callable(v)})
    return out


def test_concurrent_traces_give_the_tree_traced_alone():
    """4 threads, 3 rounds each starting together, each thread tracing all
    10 models from a different one on: 120 traces, each the same tree as alone."""
    cases, shared = _cases()
    before, limit = _originals(), sys.getrecursionlimit()
    alone = {name: _shape(f()) for name, f in cases.items()}
    assert sum(n[0] == "activation" for s in alone.values() for n in s if isinstance(n, tuple)) > 10
    barrier = threading.Barrier(THREADS)
    results: list[tuple[str, list]] = []
    names = list(cases)

    def work(i: int) -> None:
        for r in range(ROUNDS):
            barrier.wait()  # every round starts together, each thread at another model
            k = (i * len(names)) // THREADS + r
            for name in names[k:] + names[:k]:
                results.append((name, _shape(cases[name]())))

    _together([lambda i=i: work(i) for i in range(THREADS)], barrier)
    assert len(results) == THREADS * ROUNDS * len(names)
    differ = [name for name, got in results if got != alone[name]]
    assert not differ, (f"{len(differ)} of {len(results)} concurrent traces differ from the same trace run alone: "
                        f"{sorted(set(differ))}")
    # everything patched for the traces is back, on shared objects as well
    after = _originals()
    changed = [k for k, v in before.items() if after.get(k) is not v]
    assert not changed, f"{len(changed)} patched names or methods were not restored"
    assert not any(hasattr(v, "__yax_activation__") or hasattr(v, "__yax_method__") for v in after.values())
    assert jax.nn.gelu is before[(id(jax.nn), "gelu")] and not hasattr(jax.nn.gelu, "__yax_activation__")
    assert vars(shared.body.layers)["1"] is nnx.relu
    assert not any("_pytree__yax_call" in vars(m) for _, m in nnx.iter_graph(shared) if isinstance(m, nnx.Module))
    assert _activations._during is None and not _activations._swaps
    assert sys.getrecursionlimit() == limit and gc.isenabled()  # raised and paused for the traces only


def test_a_failing_trace_does_not_disturb_another():
    """One thread's trace fails half-way while another runs: the other's tree is whole, and all is undone."""
    model, args, kwargs = nnx_models.NNX_CASES["transformer"]()
    alone = _shape(yax.make_mox(model)(*args, **kwargs))
    before = _originals()
    barrier = threading.Barrier(2)
    got = []

    def broken(x):
        jax.nn.gelu(x)
        raise RuntimeError("half-way")

    done = threading.Event()

    def fail() -> None:
        barrier.wait()
        while not done.is_set():
            with pytest.raises(yax.errors.CouldNotTrace) as e:
                yax.make_mox(broken)(jnp.ones(3))
            assert type(e.value.error) is RuntimeError and e.value.error.args == ("half-way",)

    def trace() -> None:
        barrier.wait()
        try:
            for _ in range(3):
                got.append(_shape(yax.make_mox(model)(*args, **kwargs)))
        finally:
            done.set()

    _together([fail, trace], barrier)
    differ = sum(g != alone for g in got)
    assert len(got) == 3 and not differ, f"{differ} of 3 traces beside a failing one differ from the trace alone"
    after = _originals()
    assert all(after.get(k) is v for k, v in before.items())
