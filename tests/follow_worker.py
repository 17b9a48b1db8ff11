"""One process of a 2-process job in which process 0's explorer leads and process 1 follows
(yax_widget/_follow.py; tests/test_multiprocess.py): ``python follow_worker.py <process> <port>
<out>``. Process 0 answers `script`'s requests through its `Leader` and writes the replies."""

from __future__ import annotations

import json
import os
import sys


def opened(mesh):
    """The model the explorer shows, its variables and batch laid out over ``mesh``."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(2):
                h = nn.gelu(nn.Dense(32, name=f"up_{i}")(x))
                x = x + nn.Dense(16, name=f"down_{i}")(h)
            return nn.Dense(4, name="head")(x)

    m = Net()
    x_host = np.linspace(-1.0, 1.0, 8 * 16, dtype=np.float32).reshape(8, 16)
    v_host = jax.tree_util.tree_map(np.asarray, m.init(jax.random.key(0), jnp.asarray(x_host)))

    def spec(path, a):
        names = [str(getattr(k, "key", "")) for k in path]
        if a.ndim == 2 and any(n.startswith("up") for n in names):
            return P(None, "model")
        if a.ndim == 2 and any(n.startswith("down") for n in names):
            return P("model", None)
        return P()

    def put(a, s):
        return jax.make_array_from_callback(a.shape, NamedSharding(mesh, s), lambda idx: a[idx])

    v = jax.tree_util.tree_map(put, v_host, jax.tree_util.tree_map_with_path(spec, v_host))
    return m, v, put(x_host, P("data"))


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
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)
    import numpy as np
    from jax.sharding import Mesh

    from yax_widget import Session, follow
    from yax_widget._follow import Leader

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
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
