"""The compiled cost of every module (`yax.cost`, issue 39).

Run: ``.venv/bin/python bench/bench_cost.py [--layers 80] [--sharded-only]``. Prints the tables and
writes ``bench/results/cost.json``.

1. A Transformer (tests/models.py's, 4 layers, width 256) on 8 host devices: a 2 × 4 mesh
   (``data`` × ``model``), its attention and MLP split Megatron-style along ``model``, the batch
   along ``data``, and one layer left out of the sharding rule (``Block_2``'s MLP), which yax
   must name. Per top-level module: FLOPs, bytes accessed and collectives beside XLA's totals.
2. Llama-2-70B's configuration (Hugging Face ``FlaxLlamaForCausalLM``, bfloat16, 80 layers)
   abstractly: ``jax.ShapeDtypeStruct`` parameters, nothing allocated. ``yax.cost`` against the
   baseline ``jax.jit(apply).lower(...).compile()`` on the same abstract arguments (target: within
   2x), and the per-layer table. ``--layers`` compiles fewer layers where 80 take too long on
   the machine (the JSON says how many were compiled).

Timings are of one run (a compile is not repeated: XLA caches nothing across processes here).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from bench._report import peak_mb, report, timed  # noqa: E402


def _abstract(tree, shardings=None):
    if shardings is None:
        return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _top(cost, depth):
    return [c for k, c in cost.calls.items() if k and c.path.count("/") < depth]


def _rows_of(cost, depth, what):
    out = []
    for c in _top(cost, depth):
        coll = sum(x.runs or 0 for x in c.collectives)
        out.append({"part": what, "module": c.path, "flops": c.total["flops"], "bytes": c.total["bytes_accessed"],
                    "collective bytes": c.total["collective_bytes"], "own collectives": coll})
    return out


def sharded() -> list[dict]:
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from models import Transformer

    import yax

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    m = Transformer(vocab=512, d_model=256, num_heads=8, d_mlp=1024, num_layers=4)
    ids = jnp.zeros((8, 64), jnp.int32)
    v = jax.eval_shape(m.init, jax.random.key(0), ids)

    def rule(path, a):
        names = [str(getattr(k, "key", "")) for k in path]
        if "Block_2" in names and ("Dense_0" in names or "Dense_1" in names):
            return P()  # the layer left out of the rule
        if a.ndim == 2 and any(n in ("query", "key", "value", "Dense_0") for n in names):
            return P(None, "model")  # column-parallel
        if a.ndim == 2 and any(n in ("out", "Dense_1") for n in names):
            return P("model", None)  # row-parallel
        return P()

    specs = jax.tree_util.tree_map_with_path(rule, v)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs)
    vs = _abstract(v, shardings)
    xs = jax.ShapeDtypeStruct(ids.shape, ids.dtype, sharding=NamedSharding(mesh, P("data")))
    t_trace, mox = timed(lambda: yax.make_mox(m.apply)(v, ids))
    t_base, compiled = timed(lambda: jax.jit(m.apply).lower(vs, xs).compile())
    t_cost, cost = timed(lambda: yax.cost(mox, vs, xs))
    print(cost.table(depth=2))
    print()
    xla = compiled.cost_analysis()
    rows = _rows_of(cost, 2, "8 devices")
    rows.append({"part": "8 devices", "module": "XLA's cost_analysis() (loop bodies once)", "flops": xla["flops"],
                 "bytes": xla["bytes accessed"], "collective bytes": None, "own collectives": None})
    replicated = [str(r) for r in cost.replicated]
    timing = {"trace (make_mox)": t_trace, "yax.cost": t_cost,
              "baseline: jax.jit(apply).lower().compile()": t_base, "ratio": t_cost / t_base,
              "cost's own parts": cost.seconds}
    return rows, {"timing": timing, "replicated": replicated, "recount equals XLA's": cost.agrees,
                  "XLA's flops, yax's program vs jax.jit(apply)'s": [cost.xla["flops"], xla["flops"]]}


def llama(layers: int) -> list[dict]:
    import transformers

    import yax

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                                   num_hidden_layers=layers, num_attention_heads=64, num_key_value_heads=8,
                                   max_position_embeddings=4096)
    model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=jnp.bfloat16)
    ids = jnp.zeros((1, 128), jnp.int32)
    mask, pos = jnp.ones_like(ids), jnp.arange(128)[None]
    abstract = jax.eval_shape(lambda: model.module.init(jax.random.key(0), ids, mask, pos))
    args = (abstract, jax.ShapeDtypeStruct(ids.shape, ids.dtype), jax.ShapeDtypeStruct(mask.shape, mask.dtype),
            jax.ShapeDtypeStruct(pos.shape, pos.dtype))
    t_trace, mox = timed(lambda: yax.make_mox(model.module.apply)(*args))
    t_base, compiled = timed(lambda: jax.jit(model.module.apply).lower(*args).compile())
    xla = compiled.cost_analysis()
    del compiled
    t_cost, cost = timed(lambda: yax.cost(mox, *args))
    t_base2, _ = timed(lambda: jax.jit(lambda *a: model.module.apply(*a)).lower(*args).compile())  # after, too
    print(cost.table(depth=3))
    print()
    rows = _rows_of(cost, 3, f"Llama-70B config, {layers} layers")[:8]
    rows.append({"part": "70B", "module": "XLA's cost_analysis()", "flops": xla["flops"],
                 "bytes": xla["bytes accessed"], "collective bytes": None, "own collectives": None})
    timing = {"trace (make_mox)": t_trace, "yax.cost": t_cost,
              "baseline: jax.jit(apply).lower().compile()": t_base, "baseline again, after yax.cost": t_base2,
              "ratio (to the slower baseline)": t_cost / max(t_base, t_base2),
              "ratio (to the faster baseline)": t_cost / min(t_base, t_base2),
              "cost's own parts": cost.seconds, "layers compiled": layers,
              "unattributed flops": cost.unattributed.own["flops"] if cost.unattributed else 0.0,
              "peak host memory (MB)": peak_mb()}
    return rows, {"timing": timing, "recount equals XLA's": cost.agrees,
                  "XLA's flops, yax's program vs jax.jit(apply)'s": [cost.xla["flops"], xla["flops"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--sharded-only", action="store_true")
    a = ap.parse_args()
    rows, meta = sharded()
    print("8 devices:", meta)
    if not a.sharded_only:
        more, meta70 = llama(a.layers)
        rows += more
        print("70B:", meta70)
        meta = {"sharded": meta, "llama70b": meta70}
    else:
        meta = {"sharded": meta}
    report(rows, ["part", "module", "flops", "bytes", "collective bytes", "own collectives"],
           "bench/results/cost.json", runs=1, **meta)


if __name__ == "__main__":
    main()
