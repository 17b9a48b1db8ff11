"""The explorer on a Llama-70B known by its structure alone (issue 26, item 2).

Run: ``.venv/bin/python bench/bench_structure70b.py [--layers 80]``. Prints a table
and writes ``bench/results/structure70b.json``.

A Hugging Face ``FlaxLlamaForCausalLM`` from Llama-2-70B's config (80 layers,
width 8192, GQA with 8 key/value heads, vocabulary 32k, bfloat16 compute), its
parameters as ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of ``init``: no weight
exists). Timed in the kernel, as the widget's requests run: opening (trace, tree,
palette), a query keystroke, the summary, the graph, the fits menu of one
projection, LoRA on every q/v projection (160 layers; the tree, diff and history
rebuilt), undo, redo, and copy-as-code. Values, colouring and the comparison say
they need concrete parameters (tests/widget/test_abstract.py).

Targets: open <= 3 s; peak host memory <= 1.5 GB (the process's peak resident
set, Python, JAX and transformers included). Baseline: ``jax.eval_shape`` of the
model's ``apply`` (what plain JAX takes to trace the same model abstractly).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench._report import peak_mb, report, timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=80)
    a = ap.parse_args()

    import transformers

    import yax
    from yax.internal import view
    from yax_widget import Explorer

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                                   num_hidden_layers=a.layers, num_attention_heads=64, num_key_value_heads=8,
                                   max_position_embeddings=4096)
    model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=jnp.bfloat16)
    ids = jnp.zeros((1, 128), jnp.int32)
    mask, pos = jnp.ones_like(ids), jnp.arange(128)[None]
    t_shapes, abstract = timed(lambda: jax.eval_shape(lambda: model.module.init(jax.random.key(0), ids, mask, pos)))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(abstract))
    t_base, _ = timed(lambda: jax.eval_shape(model.module.apply, abstract, ids, mask, pos))
    rows = [{"what": "parameter shapes (jax.eval_shape of init)", "seconds": t_shapes, "target": None},
            {"what": "baseline: jax.eval_shape of apply", "seconds": t_base, "target": None}]

    t_open, ex = timed(lambda: Explorer(model.module.apply, abstract, ids, mask, pos, warm=False))
    ex.send = lambda content, buffers=None: None
    ex.add_replacement("LoRA r=8", yax.LoRA(rank=8))
    rows.append({"what": f"open: trace + tree ({len(ex._tree['rows'])} rows)", "seconds": t_open, "target": 3.0})
    rows.append({"what": "peak host memory after open (MB)", "seconds": round(peak_mb(), 1), "target": 1536})

    queries = ['//module_call[@name="q_proj"]', '//module_call[@type="FlaxLlamaDecoderLayer"]',
               '//module_call[@name="v_proj"][@params > 1000000]', '//*[@name="silu"]', "//dot_general"]
    t_first, _ = timed(lambda: ex.query(queries[0]))  # builds the XML document the queries run on
    ts = [timed(lambda q=q: ex.query(q))[0] for q in queries * 3]
    rows.append({"what": "first query (builds the XML document: not part of opening)", "seconds": t_first,
                 "target": None})
    rows.append({"what": "query (XPath + selection, median of 15)", "seconds": statistics.median(ts), "target": 0.15})
    rows.append({"what": "summary()", "seconds": timed(lambda: yax.summary(ex.mox))[0], "target": None})
    rows.append({"what": "graph, depth 1", "seconds": timed(lambda: yax.to_dot(ex.mox, depth=1))[0], "target": None})
    q = ex.query('//module_call[@name="q_proj"]')[0]
    rid = view(ex.mox).ids[id(q)]
    rows.append({"what": "fits menu of one q_proj", "target": None,
                 "seconds": timed(lambda: ex._on_msg(ex, {"rid": 2, "type": "fits", "id": rid}, []))[0]})
    t_drop, said = timed(lambda: ex.substitute('//module_call[@name="q_proj" or @name="v_proj"]', "LoRA r=8"))
    assert said.startswith(f"replaced {2 * a.layers} node(s)"), said
    rows.append({"what": f"LoRA on every q/v ({2 * a.layers} layers): rewrite, tree, diff", "seconds": t_drop,
                 "target": None})
    rows.append({"what": "undo", "seconds": timed(ex.undo)[0], "target": None})
    rows.append({"what": "redo", "seconds": timed(ex.redo)[0], "target": None})
    rows.append({"what": "copy as code", "seconds": timed(ex.code)[0], "target": None})
    rows.append({"what": "peak host memory at the end (MB)", "seconds": round(peak_mb(), 1), "target": 1536})
    report(rows, ["what", "seconds", "target"], "bench/results/structure70b.json", runs=1,
           layers=a.layers, parameters=n_params, comparison=ex._comparison.get("message"))


if __name__ == "__main__":
    main()
