"""A sharded model (issue 26, item 5): yax on parameters laid out over a mesh, against plain JAX.

Run: ``.venv/bin/python bench/bench_sharded.py [--layers 4] [--width 512] [--runs 5]``.
Prints a table and writes ``bench/results/sharded.json``.

A Hugging Face ``FlaxLlamaForCausalLM`` from a config (``--layers`` layers, width
``--width``, MLP 2.75 × width, 8 heads with 4 key/value heads, vocabulary 8192;
random weights), sharded over a 2 × 4 mesh (``data`` × ``model``) of 8 devices
(``--xla_force_host_platform_device_count=8`` on a CPU): the projections into the
heads and the MLP split over ``model`` by their output axis, those out of them by
their input axis (Megatron's layout), the embedding and the head by the model
width; the batch (4 × 128 tokens) over ``data``. Measured (median of ``--runs``
runs after the first, which compiles; the first given apart), on the mesh and, for
comparison, for the same model on one device:

* ``jax.jit(model.module.apply)``: the plain-JAX baseline;
* ``jax.jit(yax.to_function(mox))`` (`yax.eval_mox`): the same program, so the
  same time and the same output sharding (checked);
* `yax.capture` of every decoder layer's output with their statistics reduced on
  the devices (`ValueStats`: nine numbers per layer cross to the host);
* the explorer: opening it, the original measured in the background, LoRA
  (rank 8) on the q/v projections to the comparison (against the plain-JAX
  compile and run of the modified model), the values of a row, the NaN search.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import transformers  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yax  # noqa: E402
from bench._report import report  # noqa: E402
from yax.internal import ValueStats  # noqa: E402
from yax_widget import Explorer  # noqa: E402

#: Megatron's layout: into the heads and the MLP split by outputs, out of them by inputs.
COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")
ROWS = ("o_proj", "down_proj")


def layout(kp, x, mesh: Mesh):
    names = [str(getattr(k, "key", k)) for k in kp]
    owner = names[-2] if len(names) > 1 else ""
    if names[-1] == "kernel" and owner in COLUMNS:
        spec = P(None, "model")
    elif names[-1] == "kernel" and owner in ROWS:
        spec = P("model", None)
    elif names[-1] == "embedding":
        spec = P(None, "model")
    else:
        spec = P()
    return jax.device_put(x, NamedSharding(mesh, spec))


def runs_of(f, runs: int) -> tuple[float, float]:
    """Seconds of the first call of ``f`` (compiles) and the median of ``runs`` more."""
    t = time.perf_counter()
    jax.block_until_ready(f())
    first = time.perf_counter() - t
    more = []
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(f())
        more.append(time.perf_counter() - t)
    return first, statistics.median(more)


def seconds(f) -> tuple[float, object]:
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def measured(model, inputs: tuple, layers: int, runs: int) -> dict:
    """Every timing of the table for one placement of ``inputs`` (parameters first)."""
    params, ids, mask, pos = inputs
    out: dict = {}
    plain = jax.jit(model.module.apply)
    out["base"] = runs_of(lambda: plain(*inputs), runs)
    t, mox = seconds(lambda: yax.make_mox(model.module.apply)(*inputs))
    out["trace"] = (t, None)
    ours = jax.jit(yax.to_function(mox))
    out["eval"] = runs_of(lambda: ours(*inputs), runs)
    y0, y1 = plain(*inputs).logits, ours(*inputs).logits
    assert y1.sharding == y0.sharding and bool(jnp.allclose(y0, y1, atol=1e-5)), (y0.sharding, y1.sharding)
    out["spec"] = str(getattr(y1.sharding, "spec", "one device"))
    out["sharded_calls"] = int(yax.query('count(//*[contains(@sharding, "model")])', mox))

    def summaries():
        _, values = yax.capture('//module_call[@type="FlaxLlamaDecoderLayer"]', mox, *inputs)
        return [ValueStats.of(v[0] if isinstance(v, tuple) else v) for v in values.values()]

    out["capture"] = runs_of(summaries, runs)
    t, ex = seconds(lambda: Explorer(mox, *inputs, warm=True))  # warm, as in a notebook
    out["open"] = (t, None)
    out["warm"] = (seconds(lambda: ex.session.worker.warmer.result())[0], None)
    ex.add_replacement("LoRA r=8", yax.LoRA(rank=8))
    out["drop"] = (seconds(lambda: ex.substitute('//module_call[@name="q_proj" or @name="v_proj"]', "LoRA r=8"))[0],
                   None)
    assert "message" not in ex._comparison, ex._comparison
    modified = jax.jit(yax.to_function(ex.mox))
    out["modified"] = runs_of(lambda: modified(ex.params, ids, mask, pos), runs)
    row = ex.query('//module_call[@name="q_proj"]')[-1]
    out["values"] = (seconds(lambda: ex.session.inspector.show(row))[0], None)
    t, found = seconds(lambda: ex.session.inspector.nonfinite())
    assert not found["found"]
    out["nan"] = (t, None)
    ex.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=a.width, intermediate_size=a.width * 11 // 4,
                                   num_hidden_layers=a.layers, num_attention_heads=8, num_key_value_heads=4,
                                   max_position_embeddings=256)
    model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False)
    ids = jnp.arange(4 * 128, dtype=jnp.int32).reshape(4, 128) * 7 % 8192
    mask, pos = jnp.ones_like(ids), jnp.broadcast_to(jnp.arange(128), (4, 128))
    host = jax.jit(model.module.init)(jax.random.key(0), ids, mask, pos)
    params = jax.tree_util.tree_map_with_path(lambda kp, x: layout(kp, x, mesh), host)
    batch = tuple(jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (ids, mask, pos))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    mesh_t = measured(model, (params, *batch), a.layers, a.runs)
    one_t = measured(model, (host, ids, mask, pos), a.layers, a.runs)

    def row(what: str, key: str) -> dict:
        (mf, ms), (of, os_) = mesh_t[key], one_t[key]
        return {"what": what, "mesh first": mf, "mesh": ms, "1 device first": of, "1 device": os_}

    rows = [
        {"what": f"Llama: {a.layers} layers, width {a.width}, {n_params / 1e6:.1f} M parameters; "
                 f"calls showing @sharding split over 'model': {mesh_t['sharded_calls']}"},
        row("baseline: jax.jit(model.module.apply)", "base"),
        row("yax.make_mox (trace)", "trace"),
        row("jax.jit(yax.to_function(mox)): eval_mox", "eval"),
        row(f"capture {a.layers} layer outputs + statistics (on the devices)", "capture"),
        row("Explorer(mox, params, ...)", "open"),
        row("  original compiled + measured in the background", "warm"),
        row(f"LoRA on {2 * a.layers} q/v projections -> comparison", "drop"),
        row("  baseline: the modified model, jitted", "modified"),
        row("values of one row (first: compiles)", "values"),
        row("NaN search", "nan"),
    ]
    report(rows, ["what", "mesh first", "mesh", "1 device first", "1 device"], "bench/results/sharded.json",
           runs=a.runs, layers=a.layers, width=a.width, mesh="2x4 (data, model)", output_sharding=mesh_t["spec"])


if __name__ == "__main__":
    main()
