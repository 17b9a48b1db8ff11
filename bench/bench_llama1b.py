"""The explorer on a ~1B-parameter model with real values (issue 26, item 1).

Run: ``.venv/bin/python bench/bench_llama1b.py [--dtype float32|bfloat16] [--layers 16]``.
Prints a table and writes ``bench/results/llama1b_<dtype>.json``.

A Hugging Face ``FlaxLlamaForCausalLM`` from a config (16 layers, width 2048,
MLP 8192, 32 heads with 4 key/value heads, vocabulary 32k: 1.03 B parameters),
random weights in ``--dtype``, a batch of 1 × 128 tokens, in a real JupyterLab
and Debian's chromium. Measured:

* first paint: from the kernel having built the explorer to the tree's first
  render in the page; target <= 2 s;
* a query keystroke: ``input`` event to highlight, median; target <= 150 ms;
* LoRA (rank 8) on every q and v projection, from the kernel's request to the
  comparison's state (the original was compiled and measured in the background
  when the explorer opened); target <= compile + first run of the modified
  model (measured afresh afterwards, the plain-JAX baseline) + 0.5 s. The issue
  words it as compiling and running *both* models + 0.5 s; that looser bound is
  printed beside it, the table's target is the stricter one;
* colouring by norm: the original model's tree (before the LoRA drop) and the
  LoRA'd model's (after it), both read off what the explorer measured of them (when
  it opened; for the comparison): nothing runs again. And, after the peak is read,
  the program that colours a model measured by nothing yet (rows float32 would not
  hold exactly, a sharded model), timed on the LoRA'd model: it compiles and runs
  the model. Target <= the first compile + 1 s, against the plain-JAX compile +
  first run of the same model (a colouring of a model not measured yet runs it: no
  less is possible);
* the values of one row of it, then, on the LoRA'd model, the NaN search and undo;
* peak host memory of the kernel from opening the explorer to the undo (Linux's
  ``VmHWM``, reset after the set-up; the weights count); target <= 2.5 × the
  parameter bytes. The set-up's own peak is reported beside it; the baseline
  of the modified model is compiled and run after the peak is read (a plain
  ``jax.jit`` of a bfloat16 model holds a float32 copy of every weight on
  XLA:CPU: it would count as the explorer's).

Baselines (same kernel, same run): ``jax.jit(model.module.apply)``'s compile
and one run.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import report  # noqa: E402
from tests.e2e.lab import Notebook, browser, jupyterlab, write_notebook  # noqa: E402
from tests.e2e.scale import HIGHLIGHT  # noqa: E402

SETUP = """import time, jax, jax.numpy as jnp, transformers, yax
from yax_widget import Explorer
DT = jnp.{dtype}
cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers={layers},
                               num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=DT)
ids = (jnp.arange(128, dtype=jnp.int32) * 7 % 32000)[None]
mask, pos = jnp.ones_like(ids), jnp.arange(128)[None]
# random weights leaf by leaf (N(0, 0.02)): the set-up holds the parameters once, not init's temporaries too
shapes = jax.eval_shape(lambda k: model.module.init(k, ids, mask, pos), jax.random.key(0))
flat, tree = jax.tree_util.tree_flatten(shapes)
params = jax.tree_util.tree_unflatten(tree, [jax.block_until_ready(
    (0.02 * jax.random.normal(jax.random.key(i), s.shape, jnp.float32)).astype(DT)) for i, s in enumerate(flat)])
NBYTES = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
NPARAMS = sum(x.size for x in jax.tree_util.tree_leaves(params))
f = jax.jit(model.module.apply)
t0 = time.time(); c = f.lower(params, ids, mask, pos).compile(); t1 = time.time()
jax.block_until_ready(c(params, ids, mask, pos)); t2 = time.time()
def hwm():  # the kernel's peak resident memory (MiB) since the last reset
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
print("NPARAMS", NPARAMS, "NBYTES", NBYTES, "BASECOMPILE", t1 - t0, "BASERUN", t2 - t1, "SETUPPEAK", hwm())
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on is the explorer's (parameters included)"""

OPEN = """mox = yax.make_mox(model.module.apply)(params, ids, mask, pos)
t0 = time.time(); ex = Explorer(mox, params, ids, mask, pos); print("BUILT", time.time() - t0, "AT", time.time())
ex"""

WARM = 'ex.session.worker.warmer.result(); print("WARM", time.time() - t0)'

CHANGE = """ex.add_replacement("LoRA r=8", yax.LoRA(rank=8))
QV = '//module_call[@name="q_proj" or @name="v_proj"]'
t0 = time.time(); said = ex.substitute(QV, "LoRA r=8"); t1 = time.time()
assert "message" not in ex._comparison, ex._comparison
lora = ex.mox, ex.params  # the baseline compiles and runs it after the explorer's peak is read
print("DROP", t1 - t0)"""

PAINT = """s = ex.session
t0 = time.time(); s.inspector.paint("norm"); t1 = time.time()
row = ex.query('//module_call[@name="q_proj"]')[-1]
t2 = time.time(); s.inspector.show(row); t3 = time.time()
print("PAINT", t1 - t0, "VALUES", t3 - t2)"""

REPAINT = """t0 = time.time(); s.inspector.paint("norm"); print("PAINTMOD", time.time() - t0)"""

INSPECT = """t4 = time.time(); found = s.inspector.nonfinite(); t5 = time.time()
t6 = time.time(); ex.undo(); t7 = time.time()
print("NAN", t5 - t4, "UNDO", t7 - t6, "FOUND", int(found["found"]),
      "PEAKMB", hwm())"""

BASELINE = """g = jax.jit(yax.to_function(lora[0]))  # the modified model compiled afresh, as a user would (the baseline)
t2 = time.time(); cm = g.lower(lora[1], ids, mask, pos).compile(); t3 = time.time()
jax.block_until_ready(cm(lora[1], ids, mask, pos)); t4 = time.time()
print("MODCOMPILE", t3 - t2, "MODRUN", t4 - t3)
from yax_widget.internal import Boundaries
t5 = time.time(); b = Boundaries.run(lora[0], (lora[1], ids, mask, pos), {}); b.stats("norm")
print("PROGPAINT", time.time() - t5)"""


def numbers(text: str) -> dict[str, float]:
    """``NAME value`` pairs a cell printed (other words, such as warnings, left out)."""
    words, out = text.split(), {}
    for w, v in zip(words, words[1:]):
        if w.isupper() and w.isalpha():
            try:
                out[w] = float(v)
            except ValueError:
                pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write_notebook(root / "bench.ipynb", [SETUP.format(dtype=a.dtype, layers=a.layers), OPEN, WARM, PAINT,
                                              CHANGE, REPAINT, INSPECT, BASELINE])
        with jupyterlab(root) as url, browser() as b:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            nb = Notebook(page, url, "bench.ipynb")
            base = numbers(nb.run(0, timeout=1800))
            print("set up:", base, flush=True)
            cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=1_800_000)
            painted = time.time()
            out = cell.locator(".jp-OutputArea").inner_text()
            built = float(out.split("AT")[1].split()[0])
            warm = numbers(nb.run(2, timeout=1800))["WARM"]
            keys = []
            for i in range(a.rounds):
                keys += page.evaluate(HIGHLIGHT, ['//module_call[@name="q_proj"]',
                                                  f'//module_call[@name="{i % a.layers}"]//module_call'])
            texts = [nb.run(i, timeout=1800) for i in (3, 4, 5, 6, 7)]
            paint, change, repaint, inspect, after = map(numbers, texts)
            change.update(after)
            change.update(repaint)
            if "PEAKMB" not in inspect or "DROP" not in change or "MODRUN" not in change or "PROGPAINT" not in change:
                raise SystemExit("a cell failed:\n" + "\n".join(texts))
            errors = nb.errors
    gib = base["NBYTES"] / 2**30
    rows = [
        {"what": f"parameters: {base['NPARAMS'] / 1e9:.2f} B, {gib:.2f} GiB ({a.dtype})", "seconds": None, "target": None},
        {"what": "baseline: jit compile of the model", "seconds": base["BASECOMPILE"], "target": None},
        {"what": "baseline: one run", "seconds": base["BASERUN"], "target": None},
        {"what": "Explorer(mox, params, ...) in the kernel", "seconds": float(out.split("BUILT")[1].split()[0]),
         "target": None},
        {"what": "first paint after the kernel built it", "seconds": painted - built, "target": 2.0},
        {"what": "original compiled + measured in the background", "seconds": warm, "target": None},
        {"what": "query keystroke -> highlight, median", "seconds": statistics.median(keys) / 1000, "target": 0.15},
        {"what": f"LoRA on {2 * a.layers} q/v projections -> comparison", "seconds": change["DROP"],
         "target": round(change["MODCOMPILE"] + change["MODRUN"] + 0.5, 3)},
        {"what": "  baseline: compile + run of the modified model", "seconds": change["MODCOMPILE"] + change["MODRUN"],
         "target": None},
        {"what": "  the issue's target: compile + run of both models + 0.5", "seconds": None,
         "target": round(base["BASECOMPILE"] + base["BASERUN"] + change["MODCOMPILE"] + change["MODRUN"] + 0.5, 3)},
        {"what": "colour the original by norm (read off its measurement)", "seconds": paint["PAINT"],
         "target": round(base["BASECOMPILE"] + base["BASERUN"] + 1, 3)},
        {"what": "colour the LoRA'd model by norm (read off its comparison's)", "seconds": change["PAINTMOD"],
         "target": round(change["MODCOMPILE"] + change["MODRUN"] + 1, 3)},
        {"what": "  colour a model measured by nothing yet (program: compiles, runs)", "seconds": change["PROGPAINT"],
         "target": round(change["MODCOMPILE"] + change["MODRUN"] + 1, 3)},
        {"what": "values of one row (histogram, heatmap: compiled for its shape)", "seconds": paint["VALUES"], "target": None},
        {"what": "NaN search (the LoRA'd model)", "seconds": inspect["NAN"], "target": None},
        {"what": "undo (tree, diff, comparison with the original)", "seconds": inspect["UNDO"], "target": None},
        {"what": "peak host memory, set-up (model, weights, baseline) (GiB)",
         "seconds": round(base["SETUPPEAK"] / 1024, 2), "target": None},
        {"what": "peak host memory, explorer open to undo, weights included (GiB)",
         "seconds": round(inspect["PEAKMB"] / 1024, 2), "target": round(2.5 * gib, 2)},
    ]
    report(rows, ["what", "seconds", "target"], f"bench/results/llama1b_{a.dtype}.json", runs=1,
           layers=a.layers, dtype=a.dtype, keystrokes_ms=keys, console_errors=errors)


if __name__ == "__main__":
    main()
