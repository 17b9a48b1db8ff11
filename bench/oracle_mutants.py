"""Does the oracle catch a wrong answer? Plant one by hand in each public result, run the oracle
property that covers it at its fast budget, and time how long it takes to fail (issue 37).

Each mutant is applied to a fresh copy of the committed tree (`git worktree`), never to this one,
and the copy is removed afterwards. A mutant that the oracle does not catch within its budget is
reported as such. Prints a table and writes bench/results/oracle_mutants.json.

    .venv/bin/python bench/oracle_mutants.py [--examples 25] [--only capture,patch]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: name -> (file, the committed text, the planted text, the oracle property that should catch it)
MUTANTS = {
    "capture": (
        "yax/_capture/programs.py",
        'value = t.results(g["out"])',
        'value = jax.tree_util.tree_map(lambda a: a * 1.001, t.results(g["out"]))',
        "tests/oracle/test_core_oracle.py::test_core_results_match_the_hand_written_model",
    ),
    "patch": (  # a patch by function skipped inside scan bodies
        "yax/_capture/hooks.py",
        "        return _replaced(t, self.repl, values, self.arg, self.step)",
        "        return values if self.step else _replaced(t, self.repl, values, self.arg, self.step)",
        "tests/oracle/test_core_oracle.py::test_core_results_match_the_hand_written_model",
    ),
    "compare statistics": (  # the running maximum of |Δ| kept in float32
        "yax/_compare.py",
        "        max_abs = max(max_abs, top)\n",
        "        max_abs = max(max_abs, float(np.float32(top)))\n",
        "tests/oracle/test_stats_weights_oracle.py",
    ),
    "LoRA scale": (  # nnx's adapter scaled by alpha, not alpha / rank
        "yax/frontends/nnx/_lora.py",
        "self.alpha / self.rank",
        "self.alpha",
        "tests/oracle/test_lora_oracle.py",
    ),
    "load_weights": (  # 64-bit leaves narrowed again
        "yax/_weights.py",
        "        elif not _held(a.dtype):",
        "        elif False:",
        "tests/oracle/test_stats_weights_oracle.py",
    ),
    "Session batch cache": (  # every batch measured under one key: a new batch served an old one's numbers
        "yax_widget/_batches.py",
        "default_factory=lambda: next(_serials))",
        "default_factory=lambda: 0)",
        "tests/oracle/test_session_walks.py",
    ),
}


def run(name: str, examples: int, python: str) -> dict:
    path, old, new, target = MUTANTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(tree), "HEAD"],
                       check=True, capture_output=True)
        try:
            src = (tree / path).read_text()
            if src.count(old) < 1:
                return {"mutant": name, "caught": None, "seconds": None, "note": f"text not found in {path}"}
            (tree / path).write_text(src.replace(old, new))
            env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu",
                   "YAX_ORACLE_EXAMPLES": str(examples)}
            t = time.perf_counter()
            p = subprocess.run([python, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", target],
                               cwd=tree, env=env, capture_output=True, text=True)
            secs = time.perf_counter() - t
            tail = [ln for ln in p.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))][:1]
            return {"mutant": name, "caught": p.returncode == 1 and bool(tail), "seconds": secs,
                    "note": (tail[0] if tail else p.stdout.strip().splitlines()[-1])[:120]}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=25)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=str(ROOT / "bench/results/oracle_mutants.json"))
    a = ap.parse_args()
    names = [n for n in MUTANTS if not a.only or n in a.only.split(",")]
    rows = [run(n, a.examples, sys.executable) for n in names]
    report(rows, ["mutant", "caught", "seconds", "note"], a.out, runs=1, examples=a.examples)


if __name__ == "__main__":
    main()
