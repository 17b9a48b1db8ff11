"""One process of a 2-process job in which process 0's explorer leads and process 1 follows
(yax_widget/_follow.py; tests/test_multiprocess.py): ``python follow_worker.py <process> <port>
<out>``. Process 0 answers `script`'s requests through its `Leader` and writes the replies."""

from __future__ import annotations

import json
import os
import sys

from multiprocess_worker import join, opened


def script(session):
    """The requests the test sends, built from the session's rows: substitute a GELU by ReLU,
    show a row's values, colour by the norm and by compiled FLOPs, undo."""
    import yax
    from yax.internal import node_ids

    ids = node_ids(session.mox)
    gelu = yax.query('//activation[@name="gelu"]', session.mox)[0]
    return [
        {"type": "substitute", "rid": 1, "target": ids[id(gelu)], "name": "ReLU"},
        {"type": "values", "rid": 2, "id": node_ids(session.mox)[id(session.mox.calls[0])]},
        {"type": "overlay", "rid": 3, "stat": "norm"},
        {"type": "overlay", "rid": 4, "stat": "flops"},
        {"type": "undo", "rid": 5},
    ]


def seen(session, reply):
    """What the explorer shows after a request: its reply, and the numbers the test compares."""
    c = session.state["comparison"]
    return {"reply": [reply["type"], reply.get("message", "")], "index": session.index,
            "comparison": [c.get("allclose"), c.get("first_divergence"), c.get("outputs"), c.get("boundaries")],
            "values": session.state["values"].get("outputs"), "overlay": session.state["overlay"].get("values")}


def run(session, answer):
    """``script``'s requests answered by ``answer``, and what the explorer shows after each."""
    return [seen(session, answer(r)) for r in script(session)]


def main() -> None:
    process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    mesh = join(process, port)
    import jax

    from yax_widget import Session, follow
    from yax_widget._follow import Leader

    m, v, x = opened(mesh)
    if process == 0:
        session = Session(m, v, x, warm=False)
        leader = Leader(session)
        shown = run(session, leader.answer)
        leader.close()
        session.close()
        with open(os.path.join(out, "leader.json"), "w") as f:
            json.dump(shown, f, default=lambda o: None)  # the heatmaps' bytes aside: the numbers
    else:
        follow(m, v, x)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
