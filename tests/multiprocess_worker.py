"""One process of a 2-process JAX job on localhost (tests/test_multiprocess.py): CPU collectives
over gloo, 4 host devices a process, one model sharded over all 8. Every process runs the same yax
calls, as a multi-host job does (docs/api.md, "Several processes"), and writes what it got to
``<out>/<process>.npz``. Run as ``python multiprocess_worker.py <process> <port> <out>``; `case`
is what the single-process test computes on 8 devices too.
"""

from __future__ import annotations

import json
import os
import sys


def opened(mesh, planted_nan=False):
    """The model, its variables laid out over ``mesh`` (Megatron-style: ``up`` by columns, ``down``
    by rows) and its batch split along ``data``; with ``planted_nan``, the log of the head's
    output, NaN where it is negative."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    class Net(nn.Module):
        log: bool

        @nn.compact
        def __call__(self, x):
            for i in range(2):
                h = nn.gelu(nn.Dense(32, name=f"up_{i}")(x))
                x = x + nn.Dense(16, name=f"down_{i}")(h)
            out = nn.Dense(4, name="head")(x)
            return jnp.log(out) if self.log else out

    m = Net(planted_nan)
    x_host = np.linspace(-1.0, 1.0, 8 * 16, dtype=np.float32).reshape(8, 16)
    v_host = jax.tree_util.tree_map(np.asarray, m.init(jax.random.key(0), jnp.asarray(x_host)))

    def spec(path, a):
        names = [str(getattr(k, "key", "")) for k in path]
        if a.ndim == 2 and any(n.startswith("up") for n in names):
            return P(None, "model")
        if a.ndim == 2 and any(n.startswith("down") for n in names):
            return P("model", None)
        return P()

    def put(a, s):  # a global array from the host copy every process holds
        return jax.make_array_from_callback(a.shape, NamedSharding(mesh, s), lambda idx: a[idx])

    v = jax.tree_util.tree_map(put, v_host, jax.tree_util.tree_map_with_path(spec, v_host))
    return m, v, put(x_host, P("data"))


def join(process, port):
    """Join the 2-process job on localhost as ``process`` (CPU collectives over gloo, 4 devices a
    process): the 2 × 4 mesh (``data`` × ``model``) of all 8 devices. Before anything imports jax."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np
    from jax.sharding import Mesh

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)
    assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))


def case(mesh):
    """The model with its planted NaN (`opened`), and what yax gives of it, as host data."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import yax

    m, v, x = opened(mesh, planted_nan=True)
    mox = yax.make_mox(m.apply)(v, x)

    def host(a):
        return np.asarray(multihost_utils.process_allgather(a, tiled=True))

    got: dict[str, np.ndarray] = {}
    got["eval"] = host(yax.eval_mox(mox, v, x))
    got["jit"] = host(jax.jit(lambda p, b: yax.eval_mox(mox, p, b))(v, x))
    out, acts = yax.capture('//module_call[@type="Dense"]', mox, v, x)
    for k, a in acts.items():
        got[f"capture/{k}"] = host(a)
    relu = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox)
    cmp = yax.compare(mox, relu, v, x)
    bad = yax.first_nonfinite(mox, v, x)
    cost = yax.cost(mox, v, x)
    facts = {
        "compare": {k: [st.max_abs, st.rel, st.cosine] for k, st in {**cmp.boundaries, **cmp.outputs}.items()},
        "nonfinite": None if bad is None else [bad.path, bad.equation.name if bad.equation else "", bad.step,
                                               bad.output.nan, bad.output.size],
        "cost": {c.path: [c.total["flops"], c.total["bytes_accessed"], c.total["collective_bytes"]]
                 for k, c in cost.calls.items() if k},
        "collectives": sorted({(c.path, x.kind, x.groups) for c in cost.calls.values() for x in c.collectives}),
        "replicated": [str(r) for r in cost.replicated],
        "devices": cost.devices,
    }
    return got, facts


def main() -> None:
    process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    mesh = join(process, port)
    import jax
    import numpy as np

    got, facts = case(mesh)
    np.savez(os.path.join(out, f"{process}.npz"), **got)
    with open(os.path.join(out, f"{process}.json"), "w") as f:
        json.dump(facts, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
