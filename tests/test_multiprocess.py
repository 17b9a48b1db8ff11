"""yax in a multi-process JAX job: two processes on localhost (`jax.distributed`, CPU collectives
over gloo, 4 host devices each), one model sharded over all 8 devices, every process running the
same calls (tests/multiprocess_worker.py). Each process's `eval_mox` (eager and jitted), `capture`,
`compare`, `first_nonfinite` and `cost` must give what one process with 8 devices gives here."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

pytestmark = [pytest.mark.slow, pytest.mark.core,
              pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")]

HERE = pathlib.Path(__file__).parent
WORKER = HERE / "multiprocess_worker.py"
FOLLOW = HERE / "follow_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _job(worker: pathlib.Path, out: pathlib.Path) -> None:
    """Run ``worker`` as the 2 processes of a job; fail with their output if one fails."""
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the worker asks for 4 devices
    procs = [subprocess.Popen([sys.executable, str(worker), str(i), port, str(out)], cwd=HERE, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=600)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a process of the 2-process job did not finish in 10 minutes")
    for i, (p, log) in enumerate(zip(procs, logs)):
        tail = "\n".join(line for line in log.splitlines() if "[Gloo]" not in line)[-6000:]
        assert p.returncode == 0, f"process {i} failed (exit {p.returncode}):\n{tail}"


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("multiprocess")
    _job(WORKER, out)
    return [(dict(np.load(out / f"{i}.npz")), json.loads((out / f"{i}.json").read_text())) for i in range(2)]


@pytest.fixture(scope="module")
def one_process():
    sys.path.insert(0, str(HERE))
    from multiprocess_worker import case

    got, facts = case(Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model")))
    return got, json.loads(json.dumps(facts))  # tuples as lists, as the processes wrote them


def test_every_process_gets_the_single_process_values(processes, one_process):
    want, _ = one_process
    for i, (got, _) in enumerate(processes):
        assert got.keys() == want.keys(), i
        for k in want:  # the all-reduce runs over gloo there, in XLA here: the sums may round apart
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=f"process {i}: {k}")


def test_every_process_finds_the_same_nan_compares_and_costs_alike(processes, one_process):
    _, want = one_process
    assert want["nonfinite"] is not None and want["nonfinite"][0] == "Net"  # the log of the head's output
    assert want["devices"] == 8 and any(kind.startswith("all-reduce") for _, kind, _ in want["collectives"])
    for i, (_, got) in enumerate(processes):
        assert got["nonfinite"] == want["nonfinite"], i
        assert got["cost"] == want["cost"] and got["collectives"] == want["collectives"], i
        assert got["replicated"] == want["replicated"] and got["devices"] == 8, i
        assert got["compare"].keys() == want["compare"].keys(), i
        for k, stats in want["compare"].items():
            np.testing.assert_allclose(got["compare"][k], stats, rtol=1e-5, atol=1e-6, err_msg=f"process {i}: {k}")


def test_the_explorer_in_process_0_leads_and_shows_the_single_process_numbers(tmp_path):
    """yax_widget.follow: process 0's explorer substitutes, compares, shows a row's values and
    colours the rows (by the values' norm, by compiled FLOPs), process 1 follows every request;
    what process 0 shows equals what one process with 8 devices shows."""
    from follow_worker import run
    from multiprocess_worker import opened

    from yax_widget import Session

    _job(FOLLOW, tmp_path)
    led = json.loads((tmp_path / "leader.json").read_text())
    m, v, x = opened(Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model")))
    s = Session(m, v, x, warm=False)
    try:
        from yax_widget._protocol import answer

        alone = json.loads(json.dumps(run(s, lambda r: answer(s, r)), default=lambda o: None))
    finally:
        s.close()
    assert [step["reply"] for step in led] == [["ok", ""]] * len(alone)
    assert led[0]["comparison"][2] and led[1]["values"] and led[2]["overlay"] and led[3]["overlay"]
    assert led[0]["comparison"][0] is False  # GELU -> ReLU changes the output
    for i, (a, b) in enumerate(zip(led, alone)):
        _close(a, b, f"step {i}")


def _close(a, b, where):
    """``a`` equals ``b``, floats to 1e-5 (gloo's sums and XLA's may round apart)."""
    if isinstance(b, float) and isinstance(a, (int, float)):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), where
    elif isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), where
        for k in b:
            _close(a[k], b[k], f"{where}/{k}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{k}]")
    else:
        assert a == b, where
