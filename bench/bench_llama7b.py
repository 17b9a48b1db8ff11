"""yax on a 7B-parameter Llama, with abstract parameters (nothing allocated).

Hugging Face's ``FlaxLlamaForCausalLM`` from a Llama-2-7B-shaped config
(``transformers<5``, dev extra; built with ``_do_init=False``, its
parameters ``jax.ShapeDtypeStruct``s from ``jax.eval_shape``), traced through
the wrapper's ``__call__(ids, params=params)``. Times ``make_mox``, LoRA on
every q and v projection (the bare ``params`` layout the wrapper takes; the
adapters come back abstract as well), and
lowering the rewritten function; reports the process's peak memory after
each step. Prints a table and writes bench/results/llama7b.json.

    .venv/bin/python bench/bench_llama7b.py [--layers 32] [--seq 128]
"""

import argparse
import os
import pathlib
import sys
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _report import peak_mb, report, timed  # noqa: E402

import yax  # noqa: E402

QV = '//module_call[@type="Dense"][@name="q_proj" or @name="v_proj"]'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers import FlaxLlamaForCausalLM, LlamaConfig

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=a.layers,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                      max_position_embeddings=4096)
    model = FlaxLlamaForCausalLM(cfg, _do_init=False)
    ids = jax.ShapeDtypeStruct((1, a.seq), jnp.int32)
    params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), (1, a.seq)))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    rows = [{"what": f"Llama config: {n_params / 1e9:.2f} B parameters, abstract", "seconds": 0.0,
             "peak_mb": peak_mb()}]

    t, mox = timed(lambda: yax.make_mox(lambda ids, params: model(ids, params=params).logits)(ids, params))
    rows.append({"what": f"make_mox ({sum(1 for _ in mox.modules())} calls)", "seconds": t, "peak_mb": peak_mb()})
    t, (new, lp) = timed(lambda: yax.sub(QV, yax.LoRA(rank=8), mox, params=params, key=jax.random.key(1)))
    n = len(yax.query('//module_call[@type="LoRA"]', new))
    rows.append({"what": f"sub: LoRA on {n} q/v projections, first (builds the query view; target <= 0.5 s)", "seconds": t,
                 "peak_mb": peak_mb()})
    t, (new, lp) = timed(lambda: yax.sub(QV, yax.LoRA(rank=8), mox, params=params, key=jax.random.key(1)))
    rows.append({"what": f"sub: LoRA on {n} q/v projections, again", "seconds": t,
                 "peak_mb": peak_mb()})
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), lp)
    t, _ = timed(lambda: jax.jit(yax.to_function(new)).lower(ids, abstract))
    rows.append({"what": "lower the rewritten function (jit)", "seconds": t, "peak_mb": peak_mb()})
    out = pathlib.Path(__file__).parent / "results" / "llama7b.json"
    report(rows, ["what", "seconds", "peak_mb"], str(out), runs=1)


if __name__ == "__main__":
    main()
