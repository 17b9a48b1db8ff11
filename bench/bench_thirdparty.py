"""make_mox against jax.make_jaxpr on third-party models at real sizes (issue 16).

Hugging Face ``transformers<5`` Flax classes from their real-size configs with
abstract parameters (``jax.eval_shape`` of the init: nothing allocated, nothing
downloaded), the own zoo's Transformers (unrolled and scanned), and a
7B-parameter Llama. Each model is traced side by side in one process, each
tracer after ``jax.clear_caches()``, the two alternating, median of ``--runs``
(``best_ratio``: fastest against fastest, what is left when a shared machine's
noise is not); also the bytes of
the MoX beyond what the jaxpr holds, per equation (``--memory``; always for
the 7B model). Prints a table
and writes bench/results/thirdparty.json. Targets: ratio <= 1.15x median and
<= 1.3x worst; the 7B MoX <= 50 MB.

    .venv/bin/python bench/bench_thirdparty.py [--runs 3] [--only bert-base,gpt2-small] [--memory] [--depth 30]
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import statistics
import sys
import time
import tracemalloc
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _report import report  # noqa: E402

import yax  # noqa: E402

SEQ = 128


def _hf(cls_name: str, cfg_name: str, **cfg):
    import transformers

    return getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**cfg), _do_init=False)


def _abstract(m, shape):
    return jax.eval_shape(lambda: m.init_weights(jax.random.key(0), shape))


def hf_text(cls, cfg, **kw):
    def build():
        m = _hf(cls, cfg, **kw)
        ids = jax.ShapeDtypeStruct((1, SEQ), jnp.int32)
        return (lambda p, i: m(i, params=p)[0]), (_abstract(m, (1, SEQ)), ids)
    return build


def vit():
    m = _hf("FlaxViTModel", "ViTConfig")
    px = jax.ShapeDtypeStruct((1, 3, 224, 224), jnp.float32)
    return (lambda p, x: m(x, params=p)[0]), (_abstract(m, (1, 224, 224, 3)), px)


def resnet():
    m = _hf("FlaxResNetForImageClassification", "ResNetConfig")
    px = jax.ShapeDtypeStruct((1, 3, 224, 224), jnp.float32)
    return (lambda v, x: m(x, params=v)[0]), (_abstract(m, (1, 224, 224, 3)), px)


def whisper():
    m = _hf("FlaxWhisperForConditionalGeneration", "WhisperConfig", d_model=384, encoder_layers=4,
            decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
            encoder_ffn_dim=1536, decoder_ffn_dim=1536)
    feats = jax.ShapeDtypeStruct((1, 80, 3000), jnp.float32)
    dec = jax.ShapeDtypeStruct((1, 16), jnp.int32)
    return (lambda p, f, d: m(f, decoder_input_ids=d, params=p)[0]), (_abstract(m, (1, 80, 3000)), feats, dec)


def clip():
    import transformers

    m = transformers.FlaxCLIPModel(transformers.CLIPConfig(), _do_init=False)
    params = jax.eval_shape(lambda: m.init_weights(jax.random.key(0), ((1, 77), (1, 224, 224, 3))))
    ids = jax.ShapeDtypeStruct((1, 77), jnp.int32)
    px = jax.ShapeDtypeStruct((1, 3, 224, 224), jnp.float32)
    return (lambda p, i, x: m(i, x, params=p)[0]), (params, ids, px)


def llama(layers, hidden=4096, inter=11008, heads=32, vocab=32000):
    def build():
        m = _hf("FlaxLlamaForCausalLM", "LlamaConfig", hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                vocab_size=vocab, max_position_embeddings=4096)
        ids = jax.ShapeDtypeStruct((1, SEQ), jnp.int32)
        return (lambda p, i: m(i, params=p).logits), (_abstract(m, (1, SEQ)), ids)
    return build


def own(layers, scan=False):
    def build():
        from models import Transformer

        m = Transformer(num_layers=layers, scan=scan, vocab=1024, d_model=768, num_heads=12, d_mlp=3072)
        ids = jnp.arange(SEQ, dtype=jnp.int32).reshape(1, SEQ) % 1024
        return m.apply, (jax.eval_shape(lambda: m.init(jax.random.key(0), ids)), ids)
    return build


MODELS = {
    "bert-base": hf_text("FlaxBertModel", "BertConfig"),
    "gpt2-small": hf_text("FlaxGPT2LMHeadModel", "GPT2Config"),
    "albert-base": hf_text("FlaxAlbertModel", "AlbertConfig", hidden_size=768, num_attention_heads=12,
                           intermediate_size=3072),
    "vit-b16": vit,
    "resnet-50": resnet,
    "whisper-tiny": whisper,
    "clip": clip,
    "llama-12l": llama(12, hidden=768, inter=2048, heads=12),
    "own-transformer-12": own(12),
    "own-transformer-48": own(48),
    "own-transformer-12-scan": own(12, scan=True),
    "llama-7b": llama(32),
}


class _GcClock:
    """Seconds the cyclic garbage collector ran, by generation (``gc.callbacks``)."""

    def __init__(self):
        self.spent = [0.0, 0.0, 0.0]
        self._t = 0.0

    def __call__(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.spent[info["generation"]] += time.perf_counter() - self._t


def medians(fs, runs):
    """Median seconds of each of ``fs``, run in turn ``runs`` times (alternating,
    so a machine getting busier or quieter weighs on every side alike), each
    after ``jax.clear_caches()`` and a full collection, and ending with a
    collection of the young generations (make_mox pauses the collector while
    it traces: what it leaves young is collected there and counted); and,
    for each, the median seconds spent in the collector's full (generation 2)
    collections during a run. Those scan the whole process heap, so they
    cost what the process holds, not what the tracer does; a tracer pays
    one when it allocates enough to set one off."""
    ts = [[] for _ in fs]
    full = [[] for _ in fs]
    clock = _GcClock()
    gc.callbacks.append(clock)
    try:
        for _ in range(runs):
            for f, t_f, g_f in zip(fs, ts, full):
                jax.clear_caches()
                gc.collect()
                clock.spent = [0.0, 0.0, 0.0]
                t = time.perf_counter()
                f()
                gc.collect(1)  # what a tracer leaves the collector is counted on its side
                t_f.append(time.perf_counter() - t)
                g_f.append(clock.spent[2])
    finally:
        gc.callbacks.remove(clock)
    return [statistics.median(t_f) for t_f in ts], [statistics.median(g_f) for g_f in full], [min(t_f) for t_f in ts]


def down(depth, f, *args):
    """``f(*args)`` called ``depth`` frames further down the Python stack."""
    return f(*args) if depth <= 0 else down(depth - 1, f, *args)


def held_bytes(trace):
    """Bytes still allocated after ``trace()`` while its result lives (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    result = trace()
    gc.collect()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--memory", action="store_true", help="also the MoX's bytes (tracemalloc, slow)")
    ap.add_argument("--depth", type=int, default=0,
                    help="run both tracers this many Python frames down (a notebook cell runs ~30 down)")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for name, build in MODELS.items():
        if a.only and name not in a.only.split(","):
            continue
        f, args = build()
        jax.make_jaxpr(f)(*args), yax.make_mox(f)(*args)  # imports and first-use costs out of the way
        (t_jaxpr, t_mox), (g_jaxpr, g_mox), (best_jaxpr, best_mox) = medians(
            [lambda: down(a.depth, jax.make_jaxpr(f), *args), lambda: down(a.depth, yax.make_mox(f), *args)],
            a.runs)
        row = {"model": name, "make_jaxpr_s": t_jaxpr, "make_mox_s": t_mox, "ratio": t_mox / t_jaxpr,
               "best_ratio": best_mox / best_jaxpr,
               "full_gc_jaxpr_s": g_jaxpr, "full_gc_mox_s": g_mox}
        if a.memory or name == "llama-7b":
            # the jaxpr holds the model's constants as the model made them (Llama's rotary tables:
            # one 4 MB copy per layer, 128 MB at 7B); the MoX holds equal constants once.
            # bytes per equation: what the MoX holds besides its constants
            jaxpr_size, _ = held_bytes(lambda: jax.make_jaxpr(f)(*args))
            size, mox = held_bytes(lambda: yax.make_mox(f)(*args))
            nodes = [mox, *mox.walk()]
            n = sum(1 for n in nodes if isinstance(n, yax.Equation))
            held = {id(c): c for m in nodes if isinstance(m, yax.Mox) for c in m.consts}
            consts = sum(getattr(c, "nbytes", 0) for c in held.values())
            row.update(jaxpr_mb=jaxpr_size / 2**20, mox_mb=size / 2**20, consts_mb=consts / 2**20,
                       equations=n, bytes_per_eqn=(size - consts) / max(n, 1))
        rows.append(row)
        print(name, f"{t_jaxpr:.3f} {t_mox:.3f} {t_mox / t_jaxpr:.2f}x (full collections {g_jaxpr:.3f} {g_mox:.3f})",
              flush=True)
    ratios = sorted(r["ratio"] for r in rows)
    best = sorted(r["best_ratio"] for r in rows)
    if ratios:
        rows.append({"model": "median", "ratio": statistics.median(ratios), "best_ratio": statistics.median(best)})
        rows.append({"model": "worst", "ratio": ratios[-1], "best_ratio": best[-1]})
    out = pathlib.Path(__file__).parent / "results" / "thirdparty.json"
    report(rows, ["model", "make_jaxpr_s", "make_mox_s", "ratio", "best_ratio", "full_gc_jaxpr_s", "full_gc_mox_s",
                  "jaxpr_mb", "mox_mb", "consts_mb", "bytes_per_eqn"],
           str(out),
           runs=a.runs, depth=a.depth)


if __name__ == "__main__":
    main()
